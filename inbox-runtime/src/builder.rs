//! Putting an inbox together: pool, consumer group, handlers, workers.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use inbox_core::storage::schema::{self, SchemaError};
use inbox_core::{Backend, DEFAULT_CONSUMER, Handler, IntoHandler, Retention, RetryPolicy};
use sqlx::Pool;

use crate::batch::Batch;
use crate::inbox::{Inbox, Shared, UnknownTypes, guarding_connection};
use crate::registry::{BuildError, Registry};
use crate::route::{HandlerRoute, Route};

/// Builds an [`Inbox`]; start with [`Inbox::builder`]. `S` is the application state handlers
/// may take as `State<T>` (see [`InboxBuilder::state`]).
pub struct InboxBuilder<DB: Backend, S = ()> {
    settings: Settings<DB>,
    state: S,
}

/// Everything a builder collects besides the state.
struct Settings<DB: Backend> {
    pool: Pool<DB>,
    consumer: String,
    workers: usize,
    retry: Retry,
    unknown_types: UnknownTypes,
    max_payload_bytes: usize,
    sweep_interval: Duration,
    retention: Option<Retention>,
    batch: Option<Batch>,
    routes: Vec<Arc<dyn Route<DB>>>,
}

/// How often a running inbox sweeps by default (see [`InboxBuilder::sweep_interval`]).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The largest payload an inbox accepts by default: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

impl<DB: Backend> InboxBuilder<DB> {
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        let settings = Settings {
            pool,
            consumer: DEFAULT_CONSUMER.to_owned(),
            workers: DB::DEFAULT_WORKERS,
            retry: Retry::default(),
            unknown_types: UnknownTypes::default(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            retention: None,
            batch: None,
            routes: Vec::new(),
        };
        Self {
            settings,
            state: (),
        }
    }
}

impl<DB: Backend, S> InboxBuilder<DB, S> {
    /// The consumer group: dedup and ordering are scoped per consumer and handler, so two
    /// services consuming the same stream each handle every message once.
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.settings.consumer = consumer.into();
        self
    }

    /// How many messages are handled concurrently by [`Inbox::run`] (at least 1; default
    /// [`Backend::DEFAULT_WORKERS`]: 4 on PostgreSQL, 1 on SQLite). Messages of one aggregate
    /// are handled one at a time, in delivery order. On SQLite, which has one writer, batches
    /// take turns on one connection; with one message per transaction, each worker begins its
    /// own and waits for the write lock in SQLite's busy handler, so give the pool's connections
    /// a busy timeout (`inbox::sqlite_options` sets 30 seconds).
    pub fn workers(mut self, workers: usize) -> Self {
        self.settings.workers = workers.max(1);
        self
    }

    /// The retry policy of every handler without one of its own (default: [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.settings.retry.default = policy;
        self
    }

    /// The retry policy of `handler`, the handler value itself (`.retry_for(mark_paid, ..)`), which
    /// must also be registered with [`InboxBuilder::handler`]: [`InboxBuilder::build`] refuses a
    /// policy for a handler the inbox does not have.
    pub fn retry_for<H: IntoHandler<DB, S, Kind>, Kind>(
        mut self,
        handler: H,
        policy: RetryPolicy,
    ) -> Self {
        let name = handler.into_handler(&self.state).name();
        self.settings.retry.per_handler.insert(name, policy);
        self
    }

    /// What to do with a delivery whose type has no handler (default: keep it as rejected).
    pub fn unknown_types(mut self, policy: UnknownTypes) -> Self {
        self.settings.unknown_types = policy;
        self
    }

    /// The largest payload accepted (default [`DEFAULT_MAX_PAYLOAD_BYTES`]); a larger one is kept
    /// as rejected without being decoded.
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.settings.max_payload_bytes = limit;
        self
    }

    /// How often [`Inbox::run`] sweeps (default [`DEFAULT_SWEEP_INTERVAL`], more often when a
    /// strict handler's gap timeout needs it): releases parked messages a crash left behind,
    /// expires gaps, handles the replays operators requested (`inbox dead replay`), and updates
    /// the parked and dead-letter gauges.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.settings.sweep_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Purges old dedup rows while running (see [`Retention`]): every [`Retention::interval`],
    /// the one instance that wins the election deletes processed and stale rows older than the
    /// window. [`InboxBuilder::build`] warns when the window is shorter than the configured
    /// redelivery horizon.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.settings.retention = Some(retention);
        self
    }

    /// Runs in batched mode: see [`Batch`] (default: one message per transaction).
    pub fn batch(mut self, batch: Batch) -> Self {
        self.settings.batch = Some(batch);
        self
    }

    /// The application state that handlers taking a `State<T>` parameter receive (a clone of
    /// it, or of the part [`FromRef`](inbox_core::FromRef) takes out of it). Register it before
    /// the handlers that take it: a handler whose state the builder does not have is a compile
    /// error.
    pub fn state<S2>(self, state: S2) -> InboxBuilder<DB, S2> {
        InboxBuilder {
            settings: self.settings,
            state,
        }
    }

    /// Registers a handler for its message type. Several handlers may take one type; each is
    /// called, with its own dedup scope.
    pub fn handler<H: IntoHandler<DB, S, Kind>, Kind>(mut self, handler: H) -> Self {
        let handler = handler.into_handler(&self.state);
        self.settings
            .routes
            .push(Arc::new(HandlerRoute(Arc::new(handler))));
        self
    }

    /// Checks the registrations and that the inbox schema is in place.
    pub async fn build(self) -> Result<Inbox<DB>, BuildError> {
        self.settings.build().await
    }
}

impl<DB: Backend> Settings<DB> {
    async fn build(self) -> Result<Inbox<DB>, BuildError> {
        if self.consumer.trim().is_empty() {
            return Err(BuildError::EmptyConsumer);
        }
        let length = self.consumer.chars().count();
        if length > crate::registry::MAX_CONSUMER_CHARS {
            return Err(BuildError::ConsumerTooLong(length));
        }
        let registry = Registry::new(self.routes)?;
        self.retry.check(&registry)?;
        schema::check(&self.pool)
            .await
            .map_err(|error| match error {
                SchemaError::Database(error) => BuildError::Schema(error),
                incomplete => BuildError::IncompleteSchema(incomplete),
            })?;
        let batch = self.batch.unwrap_or(Batch::new(1));
        Ok(Inbox::new(Shared {
            writer: (DB::ONE_WRITER && batch.size() > 1)
                .then(|| tokio::sync::Mutex::new(guarding_connection(&self.pool, 1))),
            pool: self.pool,
            consumer: self.consumer,
            workers: self.workers,
            retry: self.retry,
            unknown_types: self.unknown_types,
            max_payload_bytes: self.max_payload_bytes,
            sweep_interval: self.sweep_interval,
            retention: self.retention.inspect(Retention::warn_if_unsafe),
            batch,
            registry,
            source: Default::default(),
            hand_backs: Default::default(),
        }))
    }
}

/// The retry policies of an inbox: one for all handlers, and overrides by handler name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Retry {
    default: RetryPolicy,
    per_handler: HashMap<&'static str, RetryPolicy>,
}

impl Retry {
    /// Refuses a per-handler policy for a handler that is not registered.
    fn check<DB: Backend>(&self, registry: &Registry<DB>) -> Result<(), BuildError> {
        match self
            .per_handler
            .keys()
            .find(|name| registry.named(name).is_err())
        {
            Some(name) => Err(BuildError::RetryForUnregistered(name)),
            None => Ok(()),
        }
    }

    pub(crate) fn of(&self, handler: &str) -> &RetryPolicy {
        self.per_handler.get(handler).unwrap_or(&self.default)
    }
}
