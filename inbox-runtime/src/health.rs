//! Health and readiness for a probe: [`Inbox::health`] checks the database and its schema, reads
//! the consumer's backlog, and reports what the running source did last.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use inbox_core::Backend;
use inbox_core::storage::health::{self, Backlog};
use inbox_core::storage::schema;
use serde::Serialize;

use crate::inbox::Inbox;

/// How long a source may keep failing before [`Health::ready`] turns false.
pub const SOURCE_FAILING_LIMIT: Duration = Duration::from_secs(30);

/// What [`Inbox::health`] found, serializable as a probe's JSON body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Health {
    /// Whether this instance should receive work: the database answers with the current schema,
    /// and the source (if a run is going on) has not been failing for [`SOURCE_FAILING_LIMIT`].
    /// The backlog does not count: dead or parked messages call for an operator, not a restart.
    pub ready: bool,
    /// The database's error, if it could not be reached or has no inbox tables.
    pub database_error: Option<String>,
    /// The versions of the inbox schema's migrations not applied yet (run `inbox migrate`).
    pub missing_migrations: Vec<i64>,
    /// The consumer's messages that wait: parked, failed (retry pending) and dead.
    pub backlog: Vec<Backlog>,
    /// What the running source did last.
    pub source: SourceHealth,
}

/// What the source of the current (or last) run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SourceHealth {
    /// Whether a run is consuming now.
    pub running: bool,
    /// Seconds since the source last yielded a delivery (`None`: not yet).
    pub last_delivery_secs: Option<f64>,
    /// Seconds the source has been failing, without a delivery in between (`None`: it is not).
    pub failing_secs: Option<f64>,
    /// The source's last error while it fails.
    pub last_error: Option<String>,
}

/// What the run loop tells the probe about its source.
#[derive(Debug, Default)]
pub(crate) struct SourceState(Mutex<Observed>);

#[derive(Debug, Default)]
struct Observed {
    running: bool,
    last_delivery: Option<Instant>,
    failing_since: Option<Instant>,
    last_error: Option<String>,
    /// Since when the source has been asked for deliveries without failing: not while a failed
    /// source waits to be asked again.
    consuming_since: Option<Instant>,
}

impl SourceState {
    pub(crate) fn started(&self) {
        self.update(|observed| {
            *observed = Observed {
                running: true,
                consuming_since: Some(Instant::now()),
                ..Observed::default()
            }
        });
    }

    pub(crate) fn stopped(&self) {
        self.update(|observed| observed.running = false);
    }

    pub(crate) fn delivered(&self) {
        self.update(|observed| {
            observed.last_delivery = Some(Instant::now());
            observed.failing_since = None;
            observed.last_error = None;
        });
    }

    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.update(|observed| {
            observed.failing_since.get_or_insert_with(Instant::now);
            observed.last_error = Some(error.to_string());
            observed.consuming_since = None;
        });
    }

    /// The source is asked again after it failed.
    pub(crate) fn asking_again(&self) {
        self.update(|observed| observed.consuming_since = Some(Instant::now()));
    }

    /// How long the source has been asked for deliveries without failing: a gap's timeout counts
    /// only this, since the missing message may be waiting in the source all along an outage.
    pub(crate) fn consuming_for(&self) -> Duration {
        let observed = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        observed
            .consuming_since
            .map_or(Duration::ZERO, |since| since.elapsed())
    }

    fn update(&self, change: impl FnOnce(&mut Observed)) {
        change(
            &mut self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
    }

    fn health(&self) -> SourceHealth {
        let observed = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let secs = |at: Option<Instant>| at.map(|at| at.elapsed().as_secs_f64());
        SourceHealth {
            running: observed.running,
            last_delivery_secs: secs(observed.last_delivery),
            failing_secs: secs(observed.failing_since),
            last_error: observed.last_error.clone(),
        }
    }
}

impl<DB: Backend> Inbox<DB> {
    /// Checks what a readiness or liveness probe needs, cheaply enough to poll every few
    /// seconds: the database answers and has the inbox tables, every migration is applied, the
    /// consumer's backlog (one indexed count per status), and the source's last delivery or
    /// failure. Never fails: what cannot be checked is reported in the result.
    pub async fn health(&self) -> Health {
        let pool = &self.shared.pool;
        let mut database_error = schema::check(pool).await.err().map(|e| e.to_string());
        let missing_migrations = match health::missing_migrations(pool).await {
            Ok(missing) => missing,
            Err(error) => {
                database_error.get_or_insert(error.to_string());
                Vec::new()
            }
        };
        let backlog = match health::backlog(pool, &self.shared.consumer).await {
            Ok(backlog) => backlog,
            Err(error) => {
                database_error.get_or_insert(error.to_string());
                Vec::new()
            }
        };
        let source = self.shared.source.health();
        let source_failing = source
            .failing_secs
            .is_some_and(|secs| secs >= SOURCE_FAILING_LIMIT.as_secs_f64());
        Health {
            ready: database_error.is_none() && missing_migrations.is_empty() && !source_failing,
            database_error,
            missing_migrations,
            backlog,
            source,
        }
    }
}
