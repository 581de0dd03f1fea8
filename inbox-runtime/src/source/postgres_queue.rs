//! The PostgreSQL queue (feature `postgres-queue`): a table of the inbox schema as the transport
//! between services that share a database, with no broker (its statements are in [the core
//! crate's queue module](inbox_core::queue)).
//!
//! - **Publish**: [`enqueue`] in any transaction, next to the application's own writes (or
//!   [`PgQueuePublisher`], the outbox relay's [`Sink`]).
//! - **Ack after commit**: the row is deleted. When the inbox lives in the same database, the
//!   guard deletes it in the transaction that commits the handler's writes, so a message whose
//!   handling committed is never delivered again, even if the consumer dies before it
//!   acknowledges (a message two handlers take is deleted by its acknowledgement, once both
//!   committed).
//! - **Nack with delay**: the row becomes visible again after the delay.
//! - **A crash**: a claimed row that is not settled becomes visible again after the
//!   [visibility timeout](PgQueueSourceBuilder::visibility_timeout) (30 s by default), and any
//!   consumer claims it.
//! - **Long handlers**: the run extends the claim of every row it holds, at a third of the
//!   visibility timeout.
//! - **Shutdown**: what the source claimed and the run did not take is handed back at once,
//!   including what a claim still waiting on the database when the run stopped claims (the run
//!   waits up to 5 s for it).
//! - **Order**: a row is claimed only once no older row of its aggregate (the envelope's
//!   `aggregate-id` header when it was enqueued) is left, so the consumers of a queue, in any
//!   number of processes, take an aggregate's messages one at a time, in the order they were
//!   enqueued (a nacked message holds its successors back until it is settled).
//! - **Dead or rejected**: deleted, since the inbox has kept it.
//! - **Attempt**: how many times the row was claimed.
//! - **Wakeups**: `LISTEN inbox_queue`: a consumer claims as soon as a transaction that enqueued
//!   to its queue commits, and when its own acknowledgement let an aggregate's next row through;
//!   it also polls (every second by default), for delays that ran out, claims that lapsed, and a
//!   listener that lost its connection.
//! - **Backpressure**: each claim takes at most [`PgQueueSourceBuilder::count`] rows.
//! - **Mapping**: the row's type tag, id, payload and headers; `produced_at` is when it was
//!   enqueued; the queue's name is the `destination` header. A row whose headers are not an
//!   object of strings is a delivery the run keeps as rejected, with its bytes.
//!
//! Every consumer of a queue takes from the same rows: a service that wants its own copy of each
//! message reads a queue of its own.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use inbox_core::Envelope;
use inbox_core::queue::{self, Claimed, QueueReceipt};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::in_flight::InFlight;
use super::{Acknowledge, Delivery, Sink, SinkError, Source, SourceError};

pub use inbox_core::queue::enqueue;

/// One consumer of a PostgreSQL queue.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), inbox::SourceError> {
/// use inbox::postgres_queue::PgQueueSource;
///
/// let source = PgQueueSource::builder(&pool, "orders").build().await?;
/// # Ok(()) }
/// ```
pub struct PgQueueSource {
    pool: PgPool,
    claims: Claims,
    listener: Option<PgListener>,
    settled: Arc<Notify>,
    ready: VecDeque<Delivery>,
    /// The claim in flight: one a stopping run left is handed back by [`Source::drain`].
    claiming: InFlight<Vec<Claimed>>,
}

/// What a consumer claims, and for how long.
#[derive(Debug, Clone)]
struct Claims {
    queue: String,
    visibility: Duration,
    count: usize,
    poll_interval: Duration,
}

/// How long a stopping run waits for the claim it left in flight.
const CLAIM_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// Builds a [`PgQueueSource`].
pub struct PgQueueSourceBuilder {
    pool: PgPool,
    claims: Claims,
}

impl PgQueueSource {
    /// A consumer of `queue` in the database behind `pool`, whose schema is the inbox's
    /// (`inbox::migrate`).
    pub fn builder(pool: &PgPool, queue: &str) -> PgQueueSourceBuilder {
        PgQueueSourceBuilder {
            pool: pool.clone(),
            claims: Claims {
                queue: queue.to_owned(),
                visibility: Duration::from_secs(30),
                count: 100,
                poll_interval: Duration::from_secs(1),
            },
        }
    }

    /// Claims what is due into `ready`, or takes what the claim in flight claimed.
    async fn claim(&mut self) -> Result<(), SourceError> {
        let claimed = self.claiming.answer(|| {
            let (pool, claims) = (self.pool.clone(), self.claims.clone());
            async move {
                let claimed = queue::claim(&pool, &claims.queue, claims.count, claims.visibility);
                Ok(claimed.await?)
            }
        });
        let claimed = claimed.await?;
        self.hold(claimed);
        Ok(())
    }

    /// Claimed rows as deliveries, ready to be yielded (or handed back).
    fn hold(&mut self, claimed: impl IntoIterator<Item = Claimed>) {
        for row in claimed {
            let delivery = self.delivery(row);
            self.ready.push_back(delivery);
        }
    }

    /// A claimed row as a delivery.
    fn delivery(&self, claimed: Claimed) -> Delivery {
        let Claimed {
            envelope,
            deliveries,
            unreadable,
        } = claimed;
        let acker = Box::new(QueueAcker {
            pool: self.pool.clone(),
            receipt: envelope.queue_receipt().cloned(),
            visibility: self.claims.visibility,
            settled: Arc::clone(&self.settled),
        });
        match unreadable {
            None => Delivery::new(envelope, deliveries, acker),
            Some(reason) => Delivery::unreadable(envelope, deliveries, acker, reason),
        }
    }

    /// Waits until a transaction enqueued to this queue, an acknowledgement of this consumer
    /// settled a row, or the poll interval passed.
    async fn wait(&mut self) {
        let deadline = Instant::now() + self.claims.poll_interval;
        if self.listener.is_none() {
            self.listener = listen(&self.pool, &self.claims.queue).await;
        }
        loop {
            let notified = async {
                match self.listener.as_mut() {
                    Some(listener) => listener.recv().await.map(Some),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                () = self.settled.notified() => return,
                notification = notified => match notification {
                    Ok(Some(n)) if n.payload() == self.claims.queue => return,
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::debug!(%error, "the queue's listener failed; polling meanwhile");
                        self.listener = None;
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                },
            }
        }
    }
}

/// A listener on the queue's channel, or `None` (the consumer polls) if it cannot listen now.
async fn listen(pool: &PgPool, queue: &str) -> Option<PgListener> {
    let listening = async {
        let mut listener = queue::listener(pool).await?;
        listener.listen(queue::CHANNEL).await?;
        Ok::<_, sqlx::Error>(listener)
    };
    match listening.await {
        Ok(listener) => Some(listener),
        Err(error) => {
            tracing::debug!(%error, queue, "cannot listen for the queue; polling");
            None
        }
    }
}

impl PgQueueSourceBuilder {
    /// How long a claimed row stays with a consumer that neither settles it nor reports it in
    /// progress, before another consumer claims it (30 s by default).
    pub fn visibility_timeout(mut self, visibility: Duration) -> Self {
        self.claims.visibility = visibility.max(Duration::from_millis(100));
        self
    }

    /// How many rows one claim takes at most (100 by default).
    pub fn count(mut self, count: usize) -> Self {
        self.claims.count = count.max(1);
        self
    }

    /// How often a consumer with nothing to do claims again without being woken (1 s by
    /// default).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.claims.poll_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Starts listening for the queue's wakeups.
    pub async fn build(self) -> Result<PgQueueSource, SourceError> {
        let mut listener = queue::listener(&self.pool).await?;
        listener.listen(queue::CHANNEL).await?;
        Ok(PgQueueSource {
            pool: self.pool,
            claims: self.claims,
            listener: Some(listener),
            settled: Arc::new(Notify::new()),
            ready: VecDeque::new(),
            claiming: InFlight::none(),
        })
    }
}

impl Source for PgQueueSource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        loop {
            if let Some(delivery) = self.ready.pop_front() {
                return Ok(Some(delivery));
            }
            self.claim().await?;
            if self.ready.is_empty() {
                self.wait().await;
            }
        }
    }

    fn keep_alive(&self) -> Option<Duration> {
        Some(self.claims.visibility / 3)
    }

    async fn drain(&mut self) {
        let claimed = self.claiming.finish(CLAIM_AT_SHUTDOWN).await;
        self.hold(claimed.into_iter().flatten());
        for delivery in std::mem::take(&mut self.ready) {
            if let Err(error) = delivery.nack(Duration::ZERO).await {
                tracing::warn!(%error, "could not hand a claimed row back");
            }
        }
    }
}

/// Settles one claimed row.
#[derive(Clone)]
struct QueueAcker {
    pool: PgPool,
    receipt: Option<QueueReceipt>,
    visibility: Duration,
    settled: Arc<Notify>,
}

impl QueueAcker {
    /// Makes the row visible again after `delay`.
    async fn show_again(self, delay: Duration) -> Result<(), SourceError> {
        if let Some(receipt) = &self.receipt {
            queue::show_again(&self.pool, receipt, delay).await?;
        }
        Ok(())
    }
}

impl Acknowledge for QueueAcker {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move {
            if let Some(receipt) = &self.receipt {
                queue::ack(&self.pool, receipt).await?;
            }
            // The aggregate's next row may be claimable now.
            self.settled.notify_one();
            Ok(())
        })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(self.show_again(delay))
    }

    fn in_progress(&self) -> BoxFuture<'static, Result<(), SourceError>> {
        let visibility = self.visibility;
        Box::pin(self.clone().show_again(visibility))
    }
}

/// Enqueues envelopes to PostgreSQL queues, each in a transaction of its own: what the outbox
/// relay publishes through when the receiving service reads a queue in the same database.
#[derive(Clone)]
pub struct PgQueuePublisher {
    pool: PgPool,
}

impl PgQueuePublisher {
    /// A publisher to the queues in the database behind `pool`.
    pub fn new(pool: &PgPool) -> Self {
        Self { pool: pool.clone() }
    }
}

impl Sink for PgQueuePublisher {
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            match enqueue(&self.pool, destination, envelope).await {
                Ok(_) => Ok(()),
                Err(error) if error.is_transient() => Err(SinkError::unavailable(error)),
                Err(error) => Err(SinkError::Refused(error.to_string())),
            }
        })
    }
}
