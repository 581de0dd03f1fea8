//! Retention: deleting the dedup rows that have outlived their use, without hurting live traffic.
//!
//! A processed (or stale) row only matters while its message can still be redelivered: past the
//! broker's redelivery horizon nothing will ever arrive to collide with it. Purging deletes those
//! rows in small batches, each its own short transaction, through the partial index on
//! `processed_at`, by one instance at a time. Parked and dead messages, and rejected deliveries,
//! are never purged by age: they wait for an operator, and a purge reports how many of them are
//! older than its window. What an operator resolved (a dead letter discarded, a rejected delivery
//! replayed or discarded, a conflict resolved) goes once it was resolved longer ago than the
//! window, and with it the history of operators' actions on rows that are gone.

use std::time::Duration;

use sqlx::Pool;

use crate::error::Error;
use crate::storage::purge::{PurgePreview, Resolved};
use crate::storage::{Backend, purge as statements};

/// How long dedup rows are kept, and how a purge deletes them.
///
/// ```
/// use std::time::Duration;
/// # use inbox_core as inbox;
/// use inbox::Retention;
///
/// let week = Duration::from_secs(7 * 24 * 3600);
/// let retention = Retention::new(week)
///     .redelivery_horizon(Duration::from_secs(3 * 24 * 3600))
///     .batch_size(5_000);
/// assert!(retention.window_covers_redelivery());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    window: Duration,
    redelivery_horizon: Option<Duration>,
    batch_size: u32,
    pause: Duration,
    interval: Duration,
}

impl Retention {
    /// The rows in a batch by default: small enough that a batch holds its locks for milliseconds.
    pub const DEFAULT_BATCH_SIZE: u32 = 5_000;

    /// Keeps processed and stale rows for `window` after they were handled.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            redelivery_horizon: None,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            pause: Duration::from_millis(10),
            interval: Duration::from_secs(3600),
        }
    }

    /// How late the broker may redeliver a message (its retention or redelivery limit). A window
    /// shorter than this lets a late redelivery in after its dedup row is gone, so it would be
    /// handled twice: [`Retention::window_covers_redelivery`] says whether the window is safe, and
    /// a runtime warns at startup when it is not.
    pub fn redelivery_horizon(mut self, horizon: Duration) -> Self {
        self.redelivery_horizon = Some(horizon);
        self
    }

    /// The most rows one batch deletes (at least 1; default [`Retention::DEFAULT_BATCH_SIZE`]).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// The pause between two batches, which leaves the database to live traffic (default 10 ms).
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// How often a runtime purges (default: hourly).
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How long rows are kept.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How often a runtime purges.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether the window is at least the configured redelivery horizon (`true` when none is
    /// configured: nothing to check against).
    pub fn window_covers_redelivery(&self) -> bool {
        self.redelivery_horizon
            .is_none_or(|horizon| self.window >= horizon)
    }

    /// Logs a warning when the window is shorter than the redelivery horizon.
    pub fn warn_if_unsafe(&self) {
        if let Some(horizon) = self
            .redelivery_horizon
            .filter(|_| !self.window_covers_redelivery())
        {
            tracing::warn!(
                window_secs = self.window.as_secs(),
                redelivery_horizon_secs = horizon.as_secs(),
                "the retention window is shorter than the broker's redelivery horizon: a message \
                 redelivered after its dedup row is purged would be handled twice"
            );
        }
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Whether this instance purged; `false` when another one held the right to purge.
    pub led: bool,
    /// Processed and stale rows deleted.
    pub purged: u64,
    /// Batches of processed and stale rows run, each its own transaction.
    pub batches: u64,
    /// Rows of what operators resolved before the window, deleted: discarded dead letters,
    /// rejected deliveries replayed or discarded, and conflicts resolved.
    pub resolved: u64,
    /// Operators' actions deleted: those performed before the window whose message or rejected
    /// delivery is gone, and those on gaps.
    pub actions: u64,
    /// Parked messages older than the window, kept for an operator.
    pub kept_parked: i64,
    /// Dead letters older than the window, kept for an operator.
    pub kept_dead: i64,
    /// Rejected deliveries older than the window and not resolved, kept for an operator.
    pub kept_rejected: i64,
}

/// What [`purge`] would delete with `retention`'s window, and what it would keep.
pub async fn purge_preview<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgePreview, Error> {
    Ok(statements::preview(pool, retention.window.as_secs_f64()).await?)
}

/// Deletes the processed and stale rows older than `retention`'s window, then what operators
/// resolved before it and the history of what is gone, in batches, if no other instance is
/// purging. Counted in `inbox_purged_total` and `inbox_purge_batches_total` (processed and stale
/// rows), and `inbox_purged_resolved_total` (by `kind`: `discarded`, `rejected`, `conflicts`,
/// `actions`).
pub async fn purge<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgeReport, Error> {
    let Some(leader) = statements::lead_purge(pool).await? else {
        tracing::info!("another instance holds the purge lock; this one skips its turn");
        return Ok(PurgeReport::default());
    };
    let purged = purge_batches(pool, retention).await;
    if let Err(error) = leader.step_down().await {
        tracing::warn!(%error, "could not release the purge lock cleanly; it goes with its connection");
    }
    let mut report = purged?;
    let kept = purge_preview(pool, retention).await?;
    (report.kept_parked, report.kept_dead) = (kept.parked, kept.dead);
    report.kept_rejected = kept.rejected;
    if kept.parked + kept.dead + kept.rejected > 0 {
        tracing::warn!(
            parked = kept.parked,
            dead = kept.dead,
            rejected = kept.rejected,
            "parked, dead and rejected messages older than the retention window are kept until \
             an operator resolves them"
        );
    }
    tracing::info!(
        purged = report.purged,
        batches = report.batches,
        resolved = report.resolved,
        actions = report.actions,
        "inbox purged"
    );
    Ok(report)
}

async fn purge_batches<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgeReport, Error> {
    let older_than = retention.window.as_secs_f64();
    let mut report = PurgeReport {
        led: true,
        ..PurgeReport::default()
    };
    let counted = Counted {
        rows: metrics::counter!("inbox_purged_total"),
        batches: Some(metrics::counter!("inbox_purge_batches_total")),
    };
    let dedup_rows = |limit| statements::batch(pool, older_than, limit);
    (report.purged, report.batches) = drain(retention, &counted, dedup_rows).await?;
    for kind in Resolved::ALL {
        let counted = Counted {
            rows: metrics::counter!("inbox_purged_resolved_total", "kind" => kind.as_str()),
            batches: None,
        };
        let resolved_rows = |limit| statements::resolved_batch(pool, kind, older_than, limit);
        let (deleted, _) = drain(retention, &counted, resolved_rows).await?;
        match kind {
            Resolved::Actions => report.actions += deleted,
            _ => report.resolved += deleted,
        }
    }
    Ok(report)
}

/// The counters a purge's batches go to as they run.
struct Counted {
    rows: metrics::Counter,
    batches: Option<metrics::Counter>,
}

/// Runs `batch` (which deletes at most as many rows as it is given) until one deletes fewer,
/// pausing between two and counting each in `counted`; returns the rows deleted and the batches
/// run.
async fn drain<F, Fut>(
    retention: &Retention,
    counted: &Counted,
    batch: F,
) -> Result<(u64, u64), Error>
where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = Result<u64, sqlx::Error>>,
{
    let (mut deleted, mut batches) = (0, 0);
    loop {
        let rows = batch(i64::from(retention.batch_size)).await?;
        (deleted, batches) = (deleted + rows, batches + 1);
        counted.rows.increment(rows);
        if let Some(counter) = &counted.batches {
            counter.increment(1);
        }
        if rows < u64::from(retention.batch_size) {
            return Ok((deleted, batches));
        }
        tokio::time::sleep(retention.pause).await;
    }
}
