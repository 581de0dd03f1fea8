//! The outbox relay: publishes what committed transactions wrote to the outbox, through a
//! [`Sink`], at least once and in order per aggregate.
//!
//! A batch claims the due messages that are first of their aggregate (skipping those another
//! relay is claiming) and leases them to itself, in one short transaction; publishes them at
//! once (they are of different aggregates, so their order does not matter) and waits for the
//! broker's confirms, holding no lock; then marks each confirmed one published, in a second short
//! transaction. A relay that dies mid-batch marks nothing: once its lease is over, another relay
//! publishes its messages again, under the same envelope id, and the inbox on the other side
//! reports them as duplicates. Later messages of their aggregates wait meanwhile. A failed publication is tried again after a
//! growing delay; one the broker keeps refusing is given up on after the retry policy's
//! attempts and kept, with its error, for an operator (`inbox outbox list|retry`). Later
//! messages of its aggregate wait behind it, so that its aggregate is never published out of
//! order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::panic::AssertUnwindSafe;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use inbox_core::outbox::{OutboxMessage, now_ms};
use inbox_core::storage::outbox as rows;
use inbox_core::{Backend, Error, RetryPolicy};
use sqlx::Pool;
use tracing::Instrument;

use crate::source::{Sink, SinkError};

/// Where the relay publishes a message: a function of the message.
pub type Route = Arc<dyn Fn(&OutboxMessage) -> String + Send + Sync>;

/// The outbox, as a name to start from: [`Outbox::relay`] is [`Relay::new`].
#[derive(Debug, Clone, Copy)]
pub struct Outbox;

impl Outbox {
    /// A relay of the outbox in `pool` to `sink`: the same as [`Relay::new`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), inbox::Error> {
    /// use inbox::MemoryBroker;
    /// use inbox::outbox::Outbox;
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// inbox::migrate(&pool).await?;
    /// let relay = Outbox::relay(pool, MemoryBroker::new());
    /// assert_eq!(relay.publish_batch().await?.published, 0);
    /// # Ok(()) }
    /// ```
    pub fn relay<DB: Backend, S: Sink>(pool: Pool<DB>, sink: S) -> Relay<DB, S> {
        Relay::new(pool, sink)
    }
}

/// Publishes the outbox through a [`Sink`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), inbox::Error> {
/// use inbox::{MemoryBroker, outbox};
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// inbox::migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// outbox::publish(&mut *tx, outbox::Outgoing::new("order.placed", b"{}".to_vec())).await?;
/// tx.commit().await?;
///
/// let broker = MemoryBroker::new();
/// let relay = outbox::Relay::new(pool, broker.clone());
/// assert_eq!(relay.publish_batch().await?.published, 1);
/// assert_eq!(broker.queued(), 1);
/// # Ok(()) }
/// ```
pub struct Relay<DB: Backend, S: Sink> {
    pool: Pool<DB>,
    sink: Arc<S>,
    route: Route,
    batch_size: u32,
    poll_interval: Duration,
    publish_timeout: Duration,
    lease: Duration,
    retry: RetryPolicy,
    retention: Duration,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayBatch {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages published and marked so.
    pub published: usize,
    /// Messages whose publication failed (tried again later, or given up on).
    pub failed: usize,
}

/// What a run did, once it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Messages published.
    pub published: u64,
    /// Publications that failed.
    pub failed: u64,
}

impl<DB: Backend, S: Sink> Relay<DB, S> {
    /// Messages a batch claims by default.
    pub const DEFAULT_BATCH_SIZE: u32 = 100;

    /// How long published messages are kept by default: a week.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A relay of the outbox in `pool` to `sink`. Each message goes to its own destination if its
    /// writer gave one, else to its type tag (a subject, routing key or stream of that name);
    /// [`Relay::route`] changes that.
    pub fn new(pool: Pool<DB>, sink: S) -> Self {
        Self {
            pool,
            sink: Arc::new(sink),
            route: Arc::new(default_route),
            batch_size: Self::DEFAULT_BATCH_SIZE,
            poll_interval: Duration::from_millis(100),
            publish_timeout: Duration::from_secs(30),
            lease: Duration::from_secs(60),
            retry: RetryPolicy::new(10).backoff(Duration::from_secs(1), Duration::from_secs(300)),
            retention: Self::DEFAULT_RETENTION,
        }
    }

    /// Where messages without a destination of their own go. A route that panics on a message
    /// refuses it (see [`Relay::retry`]); the relay goes on with the others.
    ///
    /// ```
    /// # async fn demo(pool: sqlx::SqlitePool) {
    /// use inbox::{MemoryBroker, outbox::Relay};
    ///
    /// let relay = Relay::new(pool, MemoryBroker::new())
    ///     .route(|message| format!("events.{}", message.message_type));
    /// # }
    /// ```
    pub fn route(
        mut self,
        route: impl Fn(&OutboxMessage) -> String + Send + Sync + 'static,
    ) -> Self {
        let route = Arc::new(route);
        self.route = Arc::new(move |message| match &message.destination {
            Some(destination) => destination.clone(),
            None => route(message),
        });
        self
    }

    /// At most `size` messages a batch (at least 1), all of different aggregates.
    pub fn batch_size(mut self, size: u32) -> Self {
        self.batch_size = size.max(1);
        self
    }

    /// How often to look for new messages when nothing wakes the relay (PostgreSQL wakes it at
    /// each commit that wrote to the outbox; other databases are polled).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a publication may wait for the broker's confirm before it counts as failed (at
    /// most half the lease).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How long a batch's messages are reserved for this relay (60 s by default): if it dies
    /// before it marks them, another relay publishes them once this has passed. A publication
    /// waits at most half of it, so a live relay marks its batch before the lease ends.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// When to try a failed publication again, and after how many refusals the relay gives up on
    /// a message. A broker that cannot be reached never makes the relay give up, and those tries
    /// spend none of the budget: the relay gives up only once the broker has refused the message
    /// as many times as the policy allows attempts.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// How long published messages are kept before the relay deletes them. A running relay
    /// looks for such messages hourly, or once per window when the window is shorter.
    pub fn retention(mut self, window: Duration) -> Self {
        self.retention = window;
        self
    }

    /// Publishes one batch: what was due and first of its aggregate when it began.
    pub async fn publish_batch(&self) -> Result<RelayBatch, Error> {
        let claimed = self.claim().await?;
        if claimed.is_empty() {
            return Ok(RelayBatch::default());
        }
        let span = tracing::info_span!(
            "outbox relay",
            messaging.operation.type = "send",
            messaging.operation.name = "publish",
            messaging.batch.message_count = claimed.len(),
        );
        let sent = futures::future::join_all(claimed.iter().map(|message| self.send(message)))
            .instrument(span)
            .await;
        let mut batch = RelayBatch {
            claimed: claimed.len(),
            ..RelayBatch::default()
        };
        let mut tx = DB::begin(&self.pool).await?;
        for (message, result) in claimed.iter().zip(sent) {
            match result {
                Ok(()) => {
                    let now = now_ms();
                    rows::mark_published::<DB>(&mut tx, message.position, now).await?;
                    let latency = now.saturating_sub(message.created_at_ms).max(0) as f64 / 1000.0;
                    metrics::histogram!("inbox_outbox_publish_latency_seconds").record(latency);
                    batch.published += 1;
                }
                Err(error) => {
                    let due = self.due_after(message, &error);
                    let refused = matches!(error, SinkError::Refused(_));
                    let error = error.to_string();
                    rows::mark_failed::<DB>(&mut tx, message, &error, refused, due).await?;
                    batch.failed += 1;
                }
            }
        }
        tx.commit().await?;
        metrics::counter!("inbox_outbox_published_total").increment(batch.published as u64);
        metrics::counter!("inbox_outbox_failed_total").increment(batch.failed as u64);
        Ok(batch)
    }

    /// Publishes until `shutdown` resolves, finishing the batch in flight. Errors of the database
    /// are logged and retried after a growing delay; they never end the run.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send) -> RelayReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut wakeups = DB::outbox_wakeups(&self.pool).await;
        let mut report = RelayReport::default();
        let mut failures = 0_u32;
        let mut housekeeping = Housekeeping::default();
        loop {
            // What woke the relay before this claim is in it: its rows were committed before
            // their notifications were sent.
            drain(&mut wakeups);
            let wait = match self.publish_batch().await {
                Ok(batch) if batch.published == 0 && batch.failed > 0 => {
                    // The broker took none: asking it again at once, for the next rows due, would
                    // keep hammering it for as long as the backlog lasts.
                    failures = failures.saturating_add(1);
                    report.failed += batch.failed as u64;
                    tracing::warn!(
                        failures,
                        failed = batch.failed,
                        "the broker took none of a batch"
                    );
                    backoff(failures)
                }
                Ok(batch) => {
                    failures = 0;
                    report.published += batch.published as u64;
                    report.failed += batch.failed as u64;
                    // A batch that published may have unblocked its aggregates' next messages.
                    if batch.published > 0 || batch.claimed == self.batch_size as usize {
                        Duration::ZERO
                    } else {
                        self.poll_interval
                    }
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(%error, failures, "the outbox relay could not publish a batch");
                    backoff(failures)
                }
            };
            housekeeping.run(&self).await;
            tokio::select! {
                () = &mut shutdown => return report,
                () = tokio::time::sleep(wait) => {}
                () = wakeup(&mut wakeups), if !wait.is_zero() => {}
            }
        }
    }

    /// Claims a batch and leases it, in a transaction of its own.
    async fn claim(&self) -> Result<Vec<OutboxMessage>, Error> {
        let now = now_ms();
        let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let mut tx = DB::begin(&self.pool).await?;
        let claimed =
            rows::claim::<DB>(&mut tx, now, now.saturating_add(lease), self.batch_size).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// Publishes one message, waiting at most the publish timeout for its confirm.
    fn send<'a>(&'a self, message: &'a OutboxMessage) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            // A route or a sink that panics refuses this message; the relay goes on with the others.
            let publish = AssertUnwindSafe(async {
                if let Some(reason) = &message.unreadable_headers {
                    return Err(SinkError::Refused(reason.clone()));
                }
                let destination = (self.route)(message);
                self.sink.publish(&destination, &message.envelope()).await
            })
            .catch_unwind()
            .map(|result| {
                result.unwrap_or_else(|_| {
                    Err(SinkError::Refused("its route or the sink panicked".into()))
                })
            });
            let timeout = self.publish_timeout.min(self.lease / 2);
            match tokio::time::timeout(timeout, publish).await {
                Ok(result) => result,
                Err(_) => Err(SinkError::unavailable(format!(
                    "no confirm within {timeout:?}"
                ))),
            }
        })
    }

    /// When to try `message` again after `error`: `None` to give up on it, once the broker has
    /// refused it as many times as the retry policy allows attempts. Tries that found the broker
    /// out of reach lengthen the delay but spend none of that budget.
    fn due_after(&self, message: &OutboxMessage, error: &SinkError) -> Option<i64> {
        let count = |tries: i32| u32::try_from(tries).unwrap_or(0).saturating_add(1);
        let delay = match error {
            SinkError::Refused(_) => self.retry.delay_after(count(message.refusals))?,
            SinkError::Unavailable(_) => self.retry.backoff_after(count(message.attempts)),
        };
        let delay = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        Some(now_ms().saturating_add(delay))
    }
}

/// The most wakeups [`drain`] takes at once.
const DRAINED_AT_MOST: usize = 10_000;

/// Takes the wakeups already received (the relay is about to claim what they announce), so a
/// busy stretch, when the relay does not wait for them, leaves no backlog of them behind to make
/// it claim again and again for nothing.
fn drain(wakeups: &mut Option<BoxStream<'static, ()>>) {
    let Some(stream) = wakeups else {
        return;
    };
    for _ in 0..DRAINED_AT_MOST {
        match stream.next().now_or_never() {
            Some(Some(())) => {}
            Some(None) => {
                *wakeups = None;
                return;
            }
            None => return,
        }
    }
}

/// The next wakeup; never, once the database stopped sending them (the relay polls then).
async fn wakeup(wakeups: &mut Option<BoxStream<'static, ()>>) {
    if let Some(stream) = wakeups {
        if stream.next().await.is_some() {
            return;
        }
        *wakeups = None;
    }
    std::future::pending().await
}

/// A message's own destination, else its type tag.
fn default_route(message: &OutboxMessage) -> String {
    message
        .destination
        .clone()
        .unwrap_or_else(|| message.message_type.clone())
}

/// 100 ms after the first failure, doubling up to 10 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1 << failures.saturating_sub(1).min(7))
        .min(Duration::from_secs(10))
}

/// What a running relay does now and then: the backlog gauge, and the purge of old published
/// messages, one bounded batch between two of its publications, so a purge of many messages
/// (the first after a long stop) does not hold publishing up until it ends.
#[derive(Default)]
struct Housekeeping {
    gauged: Option<Instant>,
    purged: Option<Instant>,
    /// Whether the last purge batch was full: more may be past the retention.
    purging: bool,
}

impl Housekeeping {
    const GAUGE_EVERY: Duration = Duration::from_secs(1);
    const PURGE_EVERY: Duration = Duration::from_secs(3600);
    const PURGE_BATCH: u32 = 5_000;

    async fn run<DB: Backend, S: Sink>(&mut self, relay: &Relay<DB, S>) {
        if due(&mut self.gauged, Self::GAUGE_EVERY) {
            match rows::backlog(&relay.pool).await {
                Ok(backlog) => {
                    metrics::gauge!("inbox_outbox_pending").set(backlog.pending as f64);
                    metrics::gauge!("inbox_outbox_failed").set(backlog.failed as f64);
                }
                Err(error) => tracing::warn!(%error, "could not count the outbox backlog"),
            }
        }
        let every = relay.retention.min(Self::PURGE_EVERY);
        if self.purging || due(&mut self.purged, every) {
            let window = i64::try_from(relay.retention.as_millis()).unwrap_or(i64::MAX);
            let before = now_ms().saturating_sub(window);
            self.purging = match rows::purge(&relay.pool, before, Self::PURGE_BATCH).await {
                Ok(deleted) => deleted == u64::from(Self::PURGE_BATCH),
                Err(error) => {
                    tracing::warn!(%error, "could not purge published outbox messages");
                    false
                }
            };
        }
    }
}

/// Whether `every` has passed since `last` (or it never ran), marking it run now if so.
fn due(last: &mut Option<Instant>, every: Duration) -> bool {
    let due = last.is_none_or(|last| last.elapsed() >= every);
    if due {
        *last = Some(Instant::now());
    }
    due
}
