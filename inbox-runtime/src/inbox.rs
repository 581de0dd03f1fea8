//! The runtime: dispatch of one envelope, and the worker loop over a source.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;

use inbox_core::storage::operators;
use inbox_core::{
    Backend, Connect, DeadLetterFilter, Envelope, Error, ExpiredGap, HandlerError, KeptConnection,
    MessageKey, MessageStatus, Outcome, PurgeReport, RejectedDelivery, Resolution, Retention,
    StoredMessage,
};
use sqlx::Pool;

use inbox_core::batch::{Abandoned, InBatch, Staged};

use crate::batch::Batch;
use crate::builder::{InboxBuilder, Retry};
use crate::registry::Registry;
use crate::route::{Dispatched, Handled, Job};
use crate::source::{Source, SourceError};
use crate::worker;

/// A consumer of messages: a pool, a consumer group and its handlers.
///
/// Cheap to clone; clones share everything.
pub struct Inbox<DB: Backend> {
    pub(crate) shared: Arc<Shared<DB>>,
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A job, with the envelope of the delivery it came from.
pub(crate) type JobOf<'e, DB> = (Box<dyn Job<DB>>, &'e Envelope);

/// Each job's result in a batch so far, and the keys (a handler with an aggregate, or with a
/// message id) of the jobs that ended with nothing recorded: the batch's later jobs of those keys
/// do not run (they end [`Error::Behind`]), so none overtakes an earlier message of its aggregate
/// that is to be tried again.
struct Results {
    results: Vec<Option<Result<Handled, Error>>>,
    unrecorded: HashSet<JobKey>,
}

/// What a job is serialized by: its handler, and its aggregate (or message id).
pub(crate) type JobKey = (&'static str, String);

impl Results {
    /// Results of `jobs` jobs, those of keys in `held_back` not to run.
    fn new(jobs: usize, held_back: HashSet<JobKey>) -> Self {
        Self {
            results: (0..jobs).map(|_| None).collect(),
            unrecorded: held_back,
        }
    }

    /// Sets the result of job `index`, of `key`.
    fn set(&mut self, index: usize, key: JobKey, result: Result<Handled, Error>) {
        if matches!(&result, Err(error) if error.is_unrecorded()) {
            self.unrecorded.insert(key);
        }
        self.results[index] = Some(result);
    }

    /// Whether job `index` is behind a job of its key that ended with nothing recorded; if so,
    /// its result says it did not run.
    fn holds_back<DB: Backend>(&mut self, index: usize, (job, _): &JobOf<'_, DB>) -> bool {
        if self.unrecorded.is_empty() {
            return false;
        }
        let key = job_key(&**job);
        if !self.unrecorded.contains(&key) {
            return false;
        }
        let (handler, aggregate) = key;
        self.results[index] = Some(Err(Error::Behind { handler, aggregate }));
        true
    }

    /// `jobs` but those it [holds back](Results::holds_back).
    fn hold_back<'e, DB: Backend>(
        &mut self,
        jobs: Vec<(usize, JobOf<'e, DB>)>,
    ) -> Vec<(usize, JobOf<'e, DB>)> {
        let mut jobs = jobs;
        jobs.retain(|(index, job)| !self.holds_back(*index, job));
        jobs
    }

    fn into_vec(self) -> Vec<Result<Handled, Error>> {
        self.results.into_iter().flatten().collect()
    }
}

fn job_key<DB: Backend>(job: &dyn Job<DB>) -> JobKey {
    let serial = job.aggregate().unwrap_or(job.message_id());
    (job.handler(), serial.to_owned())
}

/// What is left of a batch, in the order it is done: jobs to stage together, or the failure of
/// one whose handler failed in a batch, to record.
enum Step<'e, DB: Backend> {
    Batch(Vec<(usize, JobOf<'e, DB>)>),
    Failed(usize, JobOf<'e, DB>, HandlerError),
}

pub(crate) struct Shared<DB: Backend> {
    pub(crate) pool: Pool<DB>,
    pub(crate) consumer: String,
    pub(crate) workers: usize,
    pub(crate) retry: Retry,
    pub(crate) unknown_types: UnknownTypes,
    pub(crate) max_payload_bytes: usize,
    pub(crate) sweep_interval: std::time::Duration,
    pub(crate) retention: Option<Retention>,
    /// How many jobs a worker guards in one transaction (one: no batching).
    pub(crate) batch: Batch,
    pub(crate) registry: Registry<DB>,
    /// On a database with one writer ([`Backend::ONE_WRITER`]) in batched mode, the one
    /// connection the workers take turns at their batches on (its page cache stays warm from one
    /// to the next).
    pub(crate) writer: Option<tokio::sync::Mutex<Box<dyn Connect<DB>>>>,
    /// What the running source did last, for [`Inbox::health`].
    pub(crate) source: crate::health::SourceState,
    /// The deliveries the runs handed back, counted for the sources that count poorly.
    pub(crate) hand_backs: crate::hand_backs::HandBacks,
}

/// Why [`Inbox::run`] stopped before its source ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The source failed.
    #[error("the source failed: {0}")]
    Source(SourceError),
}

/// What a runtime does with a delivery whose type tag has no handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownTypes {
    /// Keep it as a rejected delivery, with its bytes, for an operator (the default).
    #[default]
    Reject,
    /// Acknowledge it and count it: for consumers that share a stream with types they ignore.
    Acknowledge,
}

/// What a run did. Two tallies of outcomes, which differ when a type has several handlers or a
/// message is delivered more than once: [`RunReport::delivery_outcomes`] counts each delivery
/// once per kind of outcome its handlers had, [`RunReport::handler_outcomes`] counts every
/// handler call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Deliveries the source yielded and the run settled (acknowledged, handed back or kept as
    /// rejected).
    pub deliveries: u64,
    /// Deliveries by the outcomes of their handlers: a delivery whose three handlers all found it
    /// a duplicate counts one `duplicate`; one whose handlers disagree counts once under each
    /// outcome. A message that died and is delivered again counts `dead` again.
    pub delivery_outcomes: BTreeMap<&'static str, u64>,
    /// Handler calls by outcome, over all deliveries: a delivery of a type with three handlers
    /// counts three. `released` also counts what the run's sweeps released, when it started and
    /// periodically (see [`Inbox::resume`]).
    pub handler_outcomes: BTreeMap<&'static str, u64>,
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries handed back for redelivery because a handler or the database failed.
    pub failed: u64,
    /// Parked messages marked dead because their gap outlived the handler's `gap_timeout`.
    pub gap_expired: u64,
    /// Dead messages whose replay an operator requested, processed by the run's sweeps (see
    /// [`Inbox::replay_requested`]).
    pub replayed: u64,
    /// Deliveries that could not be handled at all, kept as rejected (see [`Inbox::rejected`]).
    pub rejected: u64,
    /// Deliveries of a type without a handler, acknowledged under [`UnknownTypes::Acknowledge`].
    pub unknown_acknowledged: u64,
    /// Redeliveries of failed messages that came before their retry was due: nothing ran, no
    /// attempt was counted.
    pub not_due: u64,
    /// Times the source failed to yield a delivery; the run asked it again after a growing delay.
    pub source_errors: u64,
    /// Batches the database refused (a statement, the commit, a handler that left the
    /// transaction aborted, or a deadlock or serialization conflict): their messages went one per
    /// transaction instead, each with its own outcome. Also counted in
    /// `inbox_batches_refused_total`.
    pub batches_refused: u64,
}

impl RunReport {
    /// How many deliveries had a handler end with `outcome` (see
    /// [`RunReport::delivery_outcomes`]).
    pub fn deliveries_with(&self, outcome: Outcome) -> u64 {
        self.delivery_outcomes
            .get(outcome.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// How many handler calls ended with `outcome` (see [`RunReport::handler_outcomes`]).
    pub fn handler_calls_with(&self, outcome: Outcome) -> u64 {
        self.handler_outcomes
            .get(outcome.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// Counts `count` handler calls that ended with `outcome`.
    pub(crate) fn add(&mut self, outcome: Outcome, count: u64) {
        if count > 0 {
            *self.handler_outcomes.entry(outcome.as_str()).or_default() += count;
        }
    }

    /// Counts one settled delivery whose handlers had `outcomes` (each kind once).
    pub(crate) fn delivered(&mut self, outcomes: &mut Vec<Outcome>) {
        self.deliveries += 1;
        outcomes.sort_by_key(|outcome| outcome.as_str());
        outcomes.dedup();
        for outcome in outcomes {
            *self.delivery_outcomes.entry(outcome.as_str()).or_default() += 1;
        }
    }

    pub(crate) fn merge(&mut self, other: RunReport) {
        for (outcome, count) in other.handler_outcomes {
            *self.handler_outcomes.entry(outcome).or_default() += count;
        }
        for (outcome, count) in other.delivery_outcomes {
            *self.delivery_outcomes.entry(outcome).or_default() += count;
        }
        self.deliveries += other.deliveries;
        self.acked += other.acked;
        self.failed += other.failed;
        self.gap_expired += other.gap_expired;
        self.replayed += other.replayed;
        self.rejected += other.rejected;
        self.unknown_acknowledged += other.unknown_acknowledged;
        self.not_due += other.not_due;
        self.source_errors += other.source_errors;
        self.batches_refused += other.batches_refused;
    }
}

impl<DB: Backend> Inbox<DB> {
    /// Starts building an inbox on `pool`.
    pub fn builder(pool: Pool<DB>) -> InboxBuilder<DB> {
        InboxBuilder::new(pool)
    }

    pub(crate) fn new(shared: Shared<DB>) -> Self {
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The consumer group.
    pub fn consumer(&self) -> &str {
        &self.shared.consumer
    }

    /// Decodes `envelope` and runs every handler of its type, each guarded in its own transaction.
    ///
    /// Every handler runs even if another fails; the first failure is returned (a handler failure
    /// is recorded, see [`Error::Handler`]), and redelivering the envelope retries the failed
    /// handlers while the others report [`Outcome::Duplicate`].
    ///
    /// Takes the envelope by value or by reference.
    pub async fn dispatch(
        &self,
        envelope: impl Borrow<Envelope> + Send,
    ) -> Result<Dispatched, Error> {
        let handled = self.shared.dispatch(envelope.borrow()).await?;
        Ok(Dispatched::from(handled))
    }

    /// Releases, for every strict handler, the parked messages whose predecessor has applied: what
    /// a crash in the middle of a release chain left behind. [`Inbox::run`] does this when it
    /// starts. Returns how many were released.
    pub async fn resume(&self) -> Result<u32, Error> {
        self.shared.resume().await
    }

    /// Retries, from the store, the failed messages whose retry is due: the dead messages whose
    /// replay an operator requested from outside this process (`inbox dead replay`,
    /// [`request_replay`](inbox_core::request_replay)), and every failure whose backoff has passed, whether or not
    /// the broker redelivers it; then dispatches the rejected deliveries whose replay an operator
    /// requested (`inbox rejected replay`). [`Inbox::run`] does this on every sweep. Returns how
    /// many were processed.
    pub async fn replay_requested(&self) -> Result<u32, Error> {
        self.shared.retry_due().await
    }

    /// Purges the processed and stale rows older than the configured retention window, unless
    /// another instance is purging (see [`purge`](inbox_core::purge)). [`Inbox::run`] does this every
    /// [`Retention::interval`]. Without a configured retention, purges nothing.
    pub async fn purge(&self) -> Result<PurgeReport, Error> {
        match &self.shared.retention {
            Some(retention) => inbox_core::purge(&self.shared.pool, retention).await,
            None => Ok(PurgeReport::default()),
        }
    }

    /// Marks dead the parked messages whose missing predecessor has not arrived within their
    /// handler's `gap_timeout`, with the reason "gap timeout at sequence n". A predecessor that
    /// failed and waits for its retry is not missing. [`Inbox::run`] does this periodically, once
    /// it has been consuming for the gap timeout.
    pub async fn expire_gaps(&self) -> Result<Vec<(&'static str, ExpiredGap)>, Error> {
        self.shared.expire_gaps(std::time::Duration::MAX).await
    }

    /// Skips the gap in front of `aggregate`'s parked messages for handler `handler`, deliberately:
    /// they are released from the lowest one on. For a predecessor known to be lost. Returns how
    /// many were released.
    pub async fn skip_gap(&self, handler: &str, aggregate: &str) -> Result<u32, Error> {
        let shared = &self.shared;
        let route = shared.registry.named(handler)?;
        let retry = shared.retry.of(route.name());
        route
            .skip_gap(&shared.pool, &shared.consumer, aggregate, retry)
            .await
    }

    /// The messages parked by strict ordering, waiting for a predecessor.
    pub async fn parked(&self) -> Result<Vec<StoredMessage>, Error> {
        Ok(operators::list(
            &self.shared.pool,
            &self.shared.consumer,
            MessageStatus::Parked,
        )
        .await?)
    }

    /// The dead messages: given up on after their last attempt or a permanent error, or parked
    /// behind a gap that timed out; with their attempts and errors.
    pub async fn dead(&self) -> Result<Vec<StoredMessage>, Error> {
        self.dead_letters(&DeadLetterFilter::default()).await
    }

    /// What the inbox holds about message `message_id` of `handler`: status, attempts, errors,
    /// payload, and what an operator did about it.
    pub async fn show(
        &self,
        handler: &str,
        message_id: &str,
    ) -> Result<Option<StoredMessage>, Error> {
        let key = MessageKey {
            consumer: &self.shared.consumer,
            handler,
            message_id,
        };
        Ok(operators::show(&self.shared.pool, &key).await?)
    }

    /// The dead messages that match `filter` (handler, type, how recently they failed).
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<StoredMessage>, Error> {
        Ok(operators::dead_letters(&self.shared.pool, &self.shared.consumer, filter).await?)
    }

    /// Replays the dead message `message_id` of `handler` through the normal guarded path, after
    /// its handler or data was fixed: handled again from a first attempt (`Processed`, or a failure
    /// recorded like any other). `by` and `reason` are kept with the message. Replaying a message
    /// that was handled since is a `Duplicate`.
    pub async fn replay(
        &self,
        handler: &str,
        message_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<Outcome, Error> {
        let shared = &self.shared;
        let route = shared.registry.named(handler)?;
        let retry = shared.retry.of(route.name());
        route
            .replay(
                &shared.pool,
                &shared.consumer,
                message_id,
                (by, reason),
                retry,
            )
            .await
    }

    /// Replays every dead message of this consumer (see [`Inbox::replay`]); returns each one's
    /// handler, id and result.
    pub async fn replay_dead(
        &self,
        by: &str,
        reason: &str,
    ) -> Result<Vec<(String, String, Result<Outcome, Error>)>, Error> {
        let mut replayed = Vec::new();
        for dead in self.dead().await? {
            let result = self
                .replay(&dead.handler, &dead.message_id, by, reason)
                .await;
            replayed.push((dead.handler, dead.message_id, result));
        }
        Ok(replayed)
    }

    /// Discards the dead message `message_id` of `handler`: it is kept, with `by` and `reason`,
    /// but never handled.
    pub async fn discard(
        &self,
        handler: &str,
        message_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<(), Error> {
        let key = MessageKey {
            consumer: &self.shared.consumer,
            handler,
            message_id,
        };
        inbox_core::discard(&self.shared.pool, &key, (by, reason)).await
    }

    /// The deliveries that could not be handled at all and wait for an operator, oldest first.
    pub async fn rejected(&self) -> Result<Vec<RejectedDelivery>, Error> {
        Ok(operators::rejected(&self.shared.pool, &self.shared.consumer).await?)
    }

    /// Dispatches rejected delivery `id` again, exactly as it came (after the missing handler was
    /// registered, say), and records who and why if it now goes through.
    pub async fn replay_rejected(
        &self,
        id: i64,
        by: &str,
        reason: &str,
    ) -> Result<Dispatched, Error> {
        let shared = &self.shared;
        let delivery = operators::rejected_one(&shared.pool, &shared.consumer, id)
            .await?
            .ok_or(Error::UnknownRejected(id))?;
        let envelope = delivery.envelope().map_err(|e| Error::Decode {
            message_type: delivery.message_type.clone(),
            reason: format!("stored headers: {e}"),
        })?;
        let handled = self.dispatch(&envelope).await?;
        self.resolve_rejected(
            id,
            Resolution {
                replay: true,
                by,
                reason,
            },
        )
        .await?;
        Ok(handled)
    }

    /// Discards rejected delivery `id`: kept, with who and why, but no longer listed.
    pub async fn discard_rejected(&self, id: i64, by: &str, reason: &str) -> Result<(), Error> {
        self.resolve_rejected(
            id,
            Resolution {
                replay: false,
                by,
                reason,
            },
        )
        .await
    }

    async fn resolve_rejected(&self, id: i64, resolution: Resolution<'_>) -> Result<(), Error> {
        let shared = &self.shared;
        match operators::resolve_rejected(&shared.pool, &shared.consumer, id, &resolution).await? {
            true => Ok(()),
            false => Err(Error::UnknownRejected(id)),
        }
    }

    /// The messages discarded by an operator, with who and why.
    pub async fn discarded(&self) -> Result<Vec<StoredMessage>, Error> {
        Ok(operators::list(
            &self.shared.pool,
            &self.shared.consumer,
            MessageStatus::Discarded,
        )
        .await?)
    }

    /// Consumes `source` until it ends; see [`Inbox::run_until`].
    pub async fn run<S: Source>(&self, source: S) -> Result<RunReport, RunError> {
        self.run_until(source, std::future::pending()).await
    }

    /// Consumes `source` with the configured number of workers until it ends or `shutdown`
    /// completes. Each delivery is acknowledged after its handlers committed, or handed back for
    /// redelivery if one failed. Messages of one aggregate are handled one at a time, in order,
    /// by whichever worker is free. On shutdown no new delivery is pulled; the ones already
    /// pulled are finished and settled.
    ///
    /// Complete `shutdown` rather than drop this future: a run dropped unfinished lets its
    /// workers finish and settle what they had queued, but a delivery it had pulled and not yet
    /// queued, and what its source had prefetched, are left to the broker to deliver again once
    /// its own timeout passes, as after a crash.
    pub async fn run_until<S: Source>(
        &self,
        source: S,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<RunReport, RunError> {
        worker::run(Arc::clone(&self.shared), source, shutdown).await
    }
}

/// Where one of `kept` takers (a worker, or the workers' one writer) begins its transactions:
/// on a connection it keeps, where the pool has room for one per taker and one more (for the
/// sweeps, the purge and strict releases, which take theirs from the pool); else on a connection
/// from the pool each time.
pub(crate) fn guarding_connection<DB: Backend>(
    pool: &Pool<DB>,
    kept: usize,
) -> Box<dyn Connect<DB>> {
    let connections = pool.options().get_max_connections();
    match usize::try_from(connections).is_ok_and(|n| n > kept) {
        true => Box::new(KeptConnection::new(pool.clone())),
        false => Box::new(pool.clone()),
    }
}

impl<DB: Backend> Shared<DB> {
    pub(crate) async fn resume(&self) -> Result<u32, Error> {
        let mut released = 0;
        for strict in self.registry.strict() {
            let retry = self.retry.of(strict.route.name());
            released += strict
                .route
                .resume(&self.pool, &self.consumer, retry)
                .await?;
        }
        Ok(released)
    }

    pub(crate) async fn retry_due(&self) -> Result<u32, Error> {
        let mut processed = 0;
        for route in self.registry.routes() {
            let retry = self.retry.of(route.name());
            processed += route.retry_due(&self.pool, &self.consumer, retry).await?;
        }
        let dispatch = |envelope: Envelope| async move { self.dispatch(&envelope).await.map(drop) };
        processed +=
            operators::replay_rejected_requests(&self.pool, &self.consumer, dispatch).await?;
        Ok(processed)
    }

    /// Runs every handler of `envelope`'s type (see [`Inbox::dispatch`]).
    pub(crate) async fn dispatch(&self, envelope: &Envelope) -> Result<Vec<Handled>, Error> {
        let mut results = Vec::new();
        let mut connection = self.pool.clone();
        for job in self.prepare(envelope)? {
            results.push(self.execute(&mut connection, job, envelope).await);
        }
        if results
            .iter()
            .any(|r| matches!(r, Ok(h) if h.outcome == Outcome::Processed))
        {
            self.record_lag(envelope);
        }
        results.into_iter().collect()
    }

    /// Sets `inbox_parked_messages` and `inbox_dead_letters` for every handler of this inbox.
    pub(crate) async fn gauge_backlog(&self) -> Result<(), Error> {
        let backlog = operators::backlog(&self.pool, &self.consumer).await?;
        for route in self.registry.routes() {
            let count = |status: &str| {
                backlog
                    .iter()
                    .find(|(handler, of, _)| handler == route.name() && of == status)
                    .map_or(0, |(_, _, count)| *count)
            };
            let labels = [
                ("consumer", self.consumer.clone()),
                ("handler", route.name().to_owned()),
            ];
            metrics::gauge!("inbox_parked_messages", &labels).set(count("parked") as f64);
            metrics::gauge!("inbox_dead_letters", &labels).set(count("dead") as f64);
        }
        Ok(())
    }

    /// Expires the gaps of the strict handlers whose gap timeout is at most `consuming_for`, the
    /// time this inbox has been consuming.
    pub(crate) async fn expire_gaps(
        &self,
        consuming_for: std::time::Duration,
    ) -> Result<Vec<(&'static str, ExpiredGap)>, Error> {
        let mut expired = Vec::new();
        let strict = self.registry.strict();
        for strict in strict.filter(|strict| strict.gap_timeout <= consuming_for) {
            let name = strict.route.name();
            let gaps =
                inbox_core::expire_gaps(&self.pool, &self.consumer, name, strict.gap_timeout)
                    .await?;
            let messages = gaps.iter().map(|gap| gap.messages.unsigned_abs()).sum();
            let labels = [
                ("consumer", self.consumer.clone()),
                ("handler", name.to_owned()),
            ];
            metrics::counter!("inbox_gap_expired_total", &labels).increment(messages);
            expired.extend(gaps.into_iter().map(|gap| (name, gap)));
        }
        Ok(expired)
    }

    /// How often to sweep: the configured interval, or half the shortest gap timeout if that is
    /// sooner (at least 100 ms), so a gap is expired at most half a timeout late.
    pub(crate) fn sweep_period(&self) -> std::time::Duration {
        let gap_sweep = self
            .registry
            .strict()
            .map(|strict| (strict.gap_timeout / 2).max(std::time::Duration::from_millis(100)))
            .min();
        gap_sweep.map_or(self.sweep_interval, |gap| gap.min(self.sweep_interval))
    }

    /// `inbox_lag_seconds{consumer, message_type}`: from publication to processed, for an envelope
    /// that says when it was published (a producer clock ahead of ours counts as no lag).
    pub(crate) fn record_lag(&self, envelope: &Envelope) {
        if let Some(produced_at) = envelope.produced_at() {
            let lag = produced_at.elapsed().unwrap_or_default();
            metrics::histogram!(
                "inbox_lag_seconds",
                "consumer" => self.consumer.clone(),
                "message_type" => envelope.message_type().to_owned()
            )
            .record(lag.as_secs_f64());
        }
    }

    /// Checks the payload's size, then decodes it once for each handler of its type.
    pub(crate) fn prepare(&self, envelope: &Envelope) -> Result<Vec<Box<dyn Job<DB>>>, Error> {
        let size = envelope.payload().len();
        if size > self.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                size,
                limit: self.max_payload_bytes,
            });
        }
        self.registry.prepare(envelope)
    }

    /// Decodes `envelope` again for the handler named `handler`, to try its job again.
    pub(crate) fn prepare_for(
        &self,
        handler: &str,
        envelope: &Envelope,
    ) -> Result<Box<dyn Job<DB>>, Error> {
        self.registry.named(handler)?.prepare(envelope)
    }

    /// Where a worker begins its transactions (see [`guarding_connection`]).
    pub(crate) fn worker_connection(&self) -> Box<dyn Connect<DB>> {
        guarding_connection(&self.pool, self.workers)
    }

    /// Runs `jobs` (each with its delivery's envelope) in one transaction and returns each job's
    /// result. When a handler fails, the jobs before it commit first (in a batch of their own),
    /// then its failure is recorded, then the jobs after it go in a new batch: each step in the
    /// order one transaction per job would take, so a retry of the failed job, which the store
    /// may start as soon as its failure is recorded, never comes before an earlier message of its
    /// aggregate. When the database refuses a batch, each of its jobs goes in a transaction of
    /// its own (counted in `report`). The jobs of the keys `held_back` do not run: they end
    /// [`Error::Behind`].
    pub(crate) async fn execute_batch(
        &self,
        connection: &mut dyn Connect<DB>,
        jobs: Vec<JobOf<'_, DB>>,
        held_back: HashSet<JobKey>,
        report: &mut RunReport,
    ) -> Vec<Result<Handled, Error>> {
        let mut results = Results::new(jobs.len(), held_back);
        let mut steps = VecDeque::from([Step::Batch(jobs.into_iter().enumerate().collect())]);
        while let Some(step) = steps.pop_front() {
            match step {
                Step::Failed(index, job, _) if results.holds_back(index, &job) => {}
                Step::Failed(index, job, error) => {
                    let key = job_key(&*job.0);
                    let concluded = self.conclude(connection, job, InBatch::Failed(error));
                    results.set(index, key, concluded.await);
                }
                Step::Batch(jobs) => {
                    let jobs = results.hold_back(jobs);
                    if jobs.len() > 1 {
                        self.execute_staged(connection, jobs, &mut steps, &mut results, report)
                            .await;
                    } else {
                        self.execute_each(connection, jobs, &mut results).await;
                    }
                }
            }
        }
        results.into_vec()
    }

    /// Stages `jobs` in one batch: concludes them once it committed; when a handler failed,
    /// puts first what is left to do (the jobs before it, its failure, the jobs after it); when
    /// the database refused the batch, runs each job on its own.
    async fn execute_staged<'e>(
        &self,
        connection: &mut dyn Connect<DB>,
        mut jobs: Vec<(usize, JobOf<'e, DB>)>,
        steps: &mut VecDeque<Step<'e, DB>>,
        results: &mut Results,
        report: &mut RunReport,
    ) {
        match self.stage(connection, &mut jobs).await {
            Ok(staged) => {
                for ((index, job), staged) in jobs.into_iter().zip(staged) {
                    let key = job_key(&*job.0);
                    let concluded = self.conclude(connection, job, InBatch::Staged(staged));
                    results.set(index, key, concluded.await);
                }
            }
            Err((at, Abandoned::Failed(error))) => {
                let mut after = jobs.split_off(at);
                let (index, job) = after.remove(0);
                steps.push_front(Step::Batch(after));
                steps.push_front(Step::Failed(index, job, error));
                steps.push_front(Step::Batch(jobs));
            }
            Err((_, Abandoned::Refused)) => {
                report.batches_refused += 1;
                let consumer = self.consumer.clone();
                metrics::counter!("inbox_batches_refused_total", "consumer" => consumer)
                    .increment(1);
                self.execute_each(connection, jobs, results).await;
            }
        }
    }

    /// Runs each of `jobs` in a transaction of its own, but for those behind a job of their key
    /// that ended with nothing recorded.
    async fn execute_each(
        &self,
        connection: &mut dyn Connect<DB>,
        jobs: Vec<(usize, JobOf<'_, DB>)>,
        results: &mut Results,
    ) {
        for (index, job) in jobs {
            if results.holds_back(index, &job) {
                continue;
            }
            let key = job_key(&*job.0);
            let (job, envelope) = job;
            results.set(index, key, self.execute(connection, job, envelope).await);
        }
    }

    /// What a job came to once its batch ended.
    async fn conclude(
        &self,
        connection: &mut dyn Connect<DB>,
        (job, envelope): JobOf<'_, DB>,
        in_batch: InBatch,
    ) -> Result<Handled, Error> {
        let retry = self.retry.of(job.handler());
        job.conclude(connection, &self.consumer, envelope, retry, in_batch)
            .await
    }

    /// Guards every job in one batch and commits it; or says at which job it was abandoned.
    async fn stage(
        &self,
        connection: &mut dyn Connect<DB>,
        jobs: &mut [(usize, JobOf<'_, DB>)],
    ) -> Result<Vec<Staged>, (usize, Abandoned)> {
        let timeout = jobs
            .iter()
            .map(|(_, (job, _))| self.retry.of(job.handler()).timeout());
        let timeout = timeout.max().unwrap_or(inbox_core::DEFAULT_ATTEMPT_TIMEOUT);
        let begun = inbox_core::batch::Batch::begin(connection, timeout).await;
        let mut batch = begun.map_err(|_| (0, Abandoned::Refused))?;
        let entries: Vec<_> = jobs.iter().map(|(_, (job, env))| job.entry(env)).collect();
        let claimed = batch.claim(&self.consumer, &entries).await;
        let tickets = claimed.map_err(|abandoned| (0, abandoned))?;
        let mut staged = Vec::with_capacity(jobs.len());
        for (at, ((_, (job, envelope)), ticket)) in jobs.iter_mut().zip(tickets).enumerate() {
            let retry = self.retry.of(job.handler());
            let guarded = job.stage(batch, &self.consumer, envelope, retry, ticket);
            let guarded = guarded.await;
            let (next, one) = guarded.map_err(|abandoned| (at, abandoned))?;
            batch = next;
            staged.push(one);
        }
        batch
            .commit()
            .await
            .map_err(|abandoned| (jobs.len(), abandoned))?;
        Ok(staged)
    }

    /// Runs one handler's job, guarded, with that handler's retry policy.
    pub(crate) async fn execute(
        &self,
        connection: &mut dyn Connect<DB>,
        job: Box<dyn Job<DB>>,
        envelope: &Envelope,
    ) -> Result<Handled, Error> {
        let retry = self.retry.of(job.handler());
        job.run(connection, &self.consumer, envelope, retry).await
    }
}
