//! The worker loop: one router pulls deliveries and queues each handler's job in the
//! [`Scheduler`], keyed by that handler's aggregate; any free worker takes the oldest job whose
//! aggregate is not being handled, guards and commits it, and the last job of a delivery to
//! finish settles it with the broker.
//!
//! The rule for several handlers of one message type: each handler's messages are serialized by
//! that handler's own aggregate, so every handler sees its aggregates' messages in delivery order,
//! whatever field the others partition by.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use inbox_core::{Backend, Envelope, Error, Outcome};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::task::JoinHandle;

use crate::inbox::{RunError, RunReport, Shared, UnknownTypes};
use crate::keep_alive::{Held, Keeper};
use crate::route::{Handled, Job};
use crate::schedule::{Busy, Scheduler, Serial};
use crate::source::{Acknowledge, Delivery, Source, SourceError};

/// Jobs pulled per worker before the router waits: bounds the work pulled but not settled. In
/// batched mode a worker has room for two batches: the one it runs and the next one, filling.
const QUEUE_PER_WORKER: usize = 16;

/// How many deliveries of a failed message that came before its retry was due are handed back to
/// the broker (with the time left); after that they are acknowledged and the store alone retries
/// the message, so that a broker that redelivers at once cannot loop.
const NOT_DUE_HANDBACKS: u32 = 10;

/// How many times a message that the database refused to take for a transient reason (read-only,
/// a serialization conflict) is tried, in this run or delivered again, before it is kept as
/// rejected, if the database then takes it. A try that could not reach the database
/// ([`Error::is_unreachable`]) does not count: the run keeps trying that one for as long as the
/// outage lasts.
const UNHANDLED_LIMIT: u32 = 10;

/// The delay after the first unhandled try, doubling with each try up to
/// [`MAX_UNHANDLED_DELAY`].
const FIRST_UNHANDLED_DELAY: Duration = Duration::from_millis(100);
const MAX_UNHANDLED_DELAY: Duration = Duration::from_secs(60);

/// What the last job of a delivery hands over to settle it: the results, the means to settle,
/// and the delivery's attempt, counting the tries of this run.
type Finished = (Vec<Result<Handled, Error>>, Box<dyn Acknowledge>, u32);

/// One handler's job for one delivery, at its `attempt`: the delivery's, and one more for each
/// time this run tried it again and the database refused it; `tries` counts every time, for the
/// delay before the next.
struct Work<DB: Backend> {
    job: Box<dyn Job<DB>>,
    pending: Arc<Pending>,
    attempt: u32,
    tries: u32,
}

/// A job handed to a batch: its handler's name, its delivery, its attempt and tries.
struct Tried {
    handler: &'static str,
    pending: Arc<Pending>,
    attempt: u32,
    tries: u32,
}

/// A delivery whose jobs are spread over the workers: the last one to finish settles it.
struct Pending {
    envelope: Envelope,
    attempt: u32,
    settling: Mutex<Settling>,
    /// The delivery's room in the scheduler, given back once it is settled.
    _room: OwnedSemaphorePermit,
}

/// What the jobs of a pending delivery have gathered so far.
struct Settling {
    results: Vec<Result<Handled, Error>>,
    acker: Option<Box<dyn Acknowledge>>,
    remaining: usize,
    /// The highest attempt of its jobs.
    attempt: u32,
}

pub(crate) async fn run<DB: Backend, S: Source>(
    shared: Arc<Shared<DB>>,
    mut source: S,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<RunReport, RunError> {
    let mut report = RunReport::default();
    shared.source.started();
    let (stop_sweeping, sweeper) = spawn_sweeper(Arc::clone(&shared));
    let (stop_purging, purger) = spawn_purger(Arc::clone(&shared));
    let capacity = shared.workers * QUEUE_PER_WORKER.max(2 * shared.batch.size());
    let scheduler = Arc::new(Scheduler::new(shared.workers, capacity));
    let _closing = CloseOnDrop(Arc::clone(&scheduler));
    let workers: Vec<_> = (0..shared.workers)
        .map(|_| tokio::spawn(handle_all(Arc::clone(&shared), Arc::clone(&scheduler))))
        .collect();
    let keeper = source.keep_alive().map(|period| {
        let keeper = Arc::new(Keeper::default());
        (Arc::clone(&keeper), Arc::clone(&keeper).spawn(period))
    });
    let holding = keeper.as_ref().map(|(keeper, _)| &**keeper);
    let routed = route(
        &shared,
        &mut source,
        &scheduler,
        holding,
        shutdown,
        &mut report,
    )
    .await;
    shared.source.stopped();
    source.drain().await;
    scheduler.close();
    for worker in workers {
        match worker.await {
            Ok(done) => report.merge(done),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    if let Some((_, (stop_keeping, keeping))) = keeper {
        drop(stop_keeping);
        let _ = keeping.await;
    }
    drop((stop_sweeping, stop_purging));
    match sweeper.await {
        Ok(swept) => report.merge(swept),
        Err(error) => tracing::error!(%error, "the sweeper failed"),
    }
    gauge_backlog(&shared).await;
    if let Err(error) = purger.await {
        tracing::error!(%error, "the retention purge failed");
    }
    routed.map(|()| report)
}

/// Closes the scheduler when dropped. A run whose future is dropped before its end (cancelled by
/// a `select!` or a timeout) stops its sweeper, purger and keeper with their stop signals; this
/// lets its workers finish what was queued (acknowledging what commits) and end, instead of
/// waiting for work for ever, each holding a connection of the pool.
struct CloseOnDrop<T>(Arc<Scheduler<T>>);

impl<T> Drop for CloseOnDrop<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Sweeps at once (consuming starts meanwhile: a slow first sweep after a restart stalls nothing),
/// then every [`Shared::sweep_period`] until the sender is dropped; returns what the sweeps
/// released and expired.
fn spawn_sweeper<DB: Backend>(
    shared: Arc<Shared<DB>>,
) -> (oneshot::Sender<()>, JoinHandle<RunReport>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let sweeper = tokio::spawn(async move {
        let period = shared.sweep_period();
        let mut report = RunReport::default();
        loop {
            // A sweep runs to its end, so a run ends after its first sweep, however short it is.
            sweep(&shared, &mut report).await;
            tokio::select! {
                _ = &mut stopped => return report,
                () = tokio::time::sleep(period) => {}
            }
        }
    });
    (stop, sweeper)
}

/// Releases parked messages whose predecessor has applied (a release that failed or was bounded
/// earlier), retries the failed messages whose retry is due (requested replays among them), marks
/// dead the parked messages whose gap outlived its timeout, and updates the backlog gauges.
///
/// A gap's age counts only time this run has been consuming since it started or its source last
/// failed: after downtime or an outage of the source every gap looks overdue, though the missing
/// message may be waiting in the source's backlog.
async fn sweep<DB: Backend>(shared: &Shared<DB>, report: &mut RunReport) {
    match shared.resume().await {
        Ok(released) => report.add(Outcome::Released, u64::from(released)),
        Err(error) => tracing::warn!(%error, "could not release parked messages"),
    }
    match shared.retry_due().await {
        Ok(replayed) => report.replayed += u64::from(replayed),
        Err(error) => tracing::warn!(%error, "could not retry the due messages"),
    }
    match shared.expire_gaps(shared.source.consuming_for()).await {
        Ok(gaps) => {
            report.gap_expired += gaps
                .iter()
                .map(|(_, gap)| gap.messages.unsigned_abs())
                .sum::<u64>()
        }
        Err(error) => tracing::warn!(%error, "could not expire gaps"),
    }
    gauge_backlog(shared).await;
}

/// Updates the parked and dead-letter gauges (after each sweep, and when a run ends).
async fn gauge_backlog<DB: Backend>(shared: &Shared<DB>) {
    if let Err(error) = shared.gauge_backlog().await {
        tracing::warn!(%error, "could not count parked and dead messages");
    }
}

/// With a retention configured: purges at once, then every [`inbox_core::Retention::interval`], until the
/// sender is dropped (a purge in progress is then abandoned; the batches it committed stay done).
fn spawn_purger<DB: Backend>(shared: Arc<Shared<DB>>) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let purger = tokio::spawn(async move {
        let Some(retention) = shared.retention.clone() else {
            return;
        };
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                purged = inbox_core::purge(&shared.pool, &retention) => {
                    if let Err(error) = purged {
                        tracing::warn!(%error, "the retention purge failed; it runs again later");
                    }
                }
            }
            tokio::select! {
                _ = &mut stopped => return,
                () = tokio::time::sleep(retention.interval()) => {}
            }
        }
    });
    (stop, purger)
}

/// Pulls deliveries until the source ends or `shutdown` completes, and queues each handler's job
/// under its aggregate; a delivery that cannot be handled at all is rejected here.
async fn route<DB: Backend, S: Source>(
    shared: &Shared<DB>,
    source: &mut S,
    scheduler: &Scheduler<Work<DB>>,
    keeper: Option<&Keeper>,
    shutdown: impl Future<Output = ()>,
    report: &mut RunReport,
) -> Result<(), RunError> {
    tokio::pin!(shutdown);
    while let Some(delivery) = pull(shared, source, shutdown.as_mut(), report).await {
        let Some((delivery, jobs)) = admit(shared, delivery, report).await else {
            continue;
        };
        let room = tokio::select! {
            biased;
            () = &mut shutdown => {
                settle_unhandled(delivery).await;
                return Ok(());
            }
            room = scheduler.room(jobs.len()) => room,
        };
        // No room is ever refused while a worker runs; the last one is gone only if it panicked,
        // and joining it re-raises that panic.
        let Ok(room) = room else { return Ok(()) };
        let pending = Pending::new(delivery, jobs.len(), room);
        queue(shared, scheduler, keeper, pending, jobs);
    }
    Ok(())
}

/// The next delivery, or `None` once the source has ended or `shutdown` has completed. A source
/// error is logged and counted, and the source is asked again after a growing delay.
async fn pull<DB: Backend, S: Source>(
    shared: &Shared<DB>,
    source: &mut S,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    report: &mut RunReport,
) -> Option<Delivery> {
    let mut failures = 0;
    loop {
        let next = tokio::select! {
            biased;
            () = &mut shutdown => return None,
            next = source.next() => next,
        };
        let error = match next {
            Ok(Some(delivery)) => {
                shared.source.delivered();
                return Some(delivery);
            }
            Ok(None) => return None,
            Err(error) => error,
        };
        shared.source.failed(&error);
        failures += 1;
        report.source_errors += 1;
        let delay = growing_delay(failures);
        tracing::warn!(%error, ?delay, "the source failed; asking it again");
        tokio::select! {
            biased;
            () = &mut shutdown => return None,
            () = tokio::time::sleep(delay) => shared.source.asking_again(),
        }
    }
}

/// The delivery, counting the tries this run made of it, with a job for each handler of its
/// type; `None` once a delivery that cannot be handled at all (unreadable, of an unknown type,
/// undecodable) has been rejected.
async fn admit<DB: Backend>(
    shared: &Shared<DB>,
    delivery: Delivery,
    report: &mut RunReport,
) -> Option<(Delivery, Vec<Box<dyn Job<DB>>>)> {
    let counted = shared
        .hand_backs
        .attempt(delivery.envelope().id(), delivery.attempt());
    let delivery = delivery.counted_at_least(counted);
    let jobs = match delivery.unreadable_reason() {
        Some(reason) => Err(Error::Unreadable(reason.to_owned())),
        None => shared.prepare(delivery.envelope()),
    };
    match jobs {
        Ok(jobs) => Some((delivery, jobs)),
        Err(error) => {
            reject(shared, delivery, error, report).await;
            None
        }
    }
}

/// Queues each of `jobs` under its handler and aggregate, sharing `pending`, which `keeper` (if
/// the source needs one) keeps alive with the broker until it is settled.
fn queue<DB: Backend>(
    shared: &Shared<DB>,
    scheduler: &Scheduler<Work<DB>>,
    keeper: Option<&Keeper>,
    pending: Pending,
    jobs: Vec<Box<dyn Job<DB>>>,
) {
    in_flight(&shared.consumer).increment(1.0);
    let pending = Arc::new(pending);
    if let Some(keeper) = keeper {
        let held: Weak<Pending> = Arc::downgrade(&pending);
        keeper.hold(held);
    }
    for job in jobs {
        let key = (job.handler(), serial(&*job));
        let (pending, attempt) = (Arc::clone(&pending), pending.attempt);
        let work = Work {
            job,
            pending,
            attempt,
            tries: attempt,
        };
        scheduler.push(key, work);
    }
}

/// What `job` is serialized by: its handler's aggregate (strictly ordered or not), else its
/// message alone.
fn serial<DB: Backend>(job: &dyn Job<DB>) -> Serial {
    match job.aggregate() {
        Some(aggregate) if job.strict() => Serial::Strict(aggregate.to_owned()),
        Some(aggregate) => Serial::Aggregate(aggregate.to_owned()),
        None => Serial::Message(job.message_id().to_owned()),
    }
}

/// The delay before asking again after the `times`-th consecutive failure: 100 ms, doubling, at
/// most a minute.
fn growing_delay(times: u32) -> Duration {
    let doublings = times.saturating_sub(1).min(16);
    FIRST_UNHANDLED_DELAY
        .saturating_mul(1 << doublings)
        .min(MAX_UNHANDLED_DELAY)
}

/// Hands a pulled delivery back to the broker unhandled, at shutdown.
async fn settle_unhandled(delivery: Delivery) {
    if let Err(error) = delivery.nack(Duration::ZERO).await {
        tracing::warn!(%error, "could not hand a delivery back at shutdown; the broker will redeliver it");
    }
}

/// Settles a delivery that cannot be handled at all (unknown type, undecodable payload, unusable
/// id, oversized payload, or a transient failure that outlasted [`UNHANDLED_LIMIT`] attempts):
/// kept as rejected, with its bytes and the reason, then acknowledged; or, for an unknown type
/// under [`UnknownTypes::Acknowledge`], acknowledged and counted. If it cannot be kept, it is
/// handed back to the broker after a growing delay instead.
async fn reject<DB: Backend>(
    shared: &Shared<DB>,
    delivery: Delivery,
    error: Error,
    report: &mut RunReport,
) {
    let (envelope, attempt, acker) = delivery.into_parts();
    report.delivered(&mut Vec::new());
    let kept = keep_rejected(shared, &envelope, &error, report).await;
    let settled = terminate_if_kept(shared, &envelope, kept, acker, attempt);
    if let Err(error) = settled.await {
        tracing::warn!(%error, "settling a rejected delivery failed; the broker will redeliver it");
    }
}

/// Terminates a delivery of `envelope` once it is kept as rejected; one that could not be kept
/// is handed back after a delay that grows with its `attempt`.
async fn terminate_if_kept<DB: Backend>(
    shared: &Shared<DB>,
    envelope: &Envelope,
    kept: Result<(), sqlx::Error>,
    acker: Box<dyn Acknowledge>,
    attempt: u32,
) -> Result<(), SourceError> {
    match kept {
        Ok(()) => {
            shared.hand_backs.settled(envelope.id());
            acker.terminate().await
        }
        Err(database) => {
            tracing::error!(%database, "could not keep a rejected delivery; handing it back");
            shared.hand_backs.handed_back(envelope.id());
            acker.nack(growing_delay(attempt)).await
        }
    }
}

/// Keeps a delivery as rejected with the reason, an oversized one cut to the size limit (or counts
/// an unknown type that is acknowledged).
async fn keep_rejected<DB: Backend>(
    shared: &Shared<DB>,
    envelope: &Envelope,
    error: &Error,
    report: &mut RunReport,
) -> Result<(), sqlx::Error> {
    let skip = matches!(error, Error::UnknownMessageType(_))
        && shared.unknown_types == UnknownTypes::Acknowledge;
    if skip {
        tracing::warn!(
            id = envelope.id(),
            message_type = envelope.message_type(),
            "no handler for this type; acknowledged"
        );
        report.unknown_acknowledged += 1;
        metrics::counter!("inbox_unknown_types_total", "consumer" => shared.consumer.clone())
            .increment(1);
        return Ok(());
    }
    match error {
        Error::PayloadTooLarge { limit, .. } => {
            let reason = format!("{error} (its first {limit} bytes are kept)");
            store_rejected(shared, &envelope.truncated(*limit), &reason, report).await
        }
        _ => store_rejected(shared, envelope, &error.to_string(), report).await,
    }
}

/// Keeps a delivery as rejected, with its bytes and `reason`.
async fn store_rejected<DB: Backend>(
    shared: &Shared<DB>,
    envelope: &Envelope,
    reason: &str,
    report: &mut RunReport,
) -> Result<(), sqlx::Error> {
    tracing::warn!(
        id = envelope.id(),
        message_type = envelope.message_type(),
        reason,
        "delivery rejected"
    );
    inbox_core::storage::messages::reject(&shared.pool, &shared.consumer, envelope, reason).await?;
    report.rejected += 1;
    metrics::counter!("inbox_rejected_total", "consumer" => shared.consumer.clone()).increment(1);
    Ok(())
}

/// Runs jobs as the scheduler hands them out (a batch at a time in batched mode) until it is
/// closed and empty; the worker that finishes a delivery's last job settles it, after the batch
/// committed.
async fn handle_all<DB: Backend>(
    shared: Arc<Shared<DB>>,
    scheduler: Arc<Scheduler<Work<DB>>>,
) -> RunReport {
    /// Tells the scheduler this worker is gone, also when it unwinds.
    struct Gone<'s, DB: Backend>(&'s Scheduler<Work<DB>>);
    impl<DB: Backend> Drop for Gone<'_, DB> {
        fn drop(&mut self) {
            self.0.worker_gone();
        }
    }
    let _gone = Gone(&scheduler);
    let mut own = shared.worker_connection();
    let mut report = RunReport::default();
    let (size, linger) = (shared.batch.size(), shared.batch.lingers());
    loop {
        // Where the database has one writer, a batching worker takes its turn before its jobs:
        // they wait in the scheduler for the worker whose turn it is (a full batch), not in the
        // small batches of workers waiting for their turn.
        let mut turn = match &shared.writer {
            Some(writer) => Some(writer.lock().await),
            None => None,
        };
        // Before it waits for work, the worker settles its connection: nothing it holds stays
        // open while it waits.
        let settling = match turn.as_deref_mut() {
            Some(writer) => writer.settle(),
            None => own.settle(),
        };
        let taken = scheduler.take_up_to(size, linger, settling).await;
        if taken.is_empty() {
            break;
        }
        let (work, busy): (Vec<_>, Vec<_>) = taken.into_iter().unzip();
        let stopped = scheduler.stopped(&busy);
        let (jobs, tried): (Vec<_>, Vec<_>) = work.into_iter().map(Work::tried).unzip();
        let with_envelopes = jobs
            .into_iter()
            .zip(tried.iter().map(|t| &t.pending.envelope));
        let connection = match turn.as_deref_mut() {
            Some(writer) => &mut **writer,
            None => &mut *own,
        };
        let results = shared
            .execute_batch(
                connection,
                with_envelopes.collect(),
                stopped.into_iter().collect(),
                &mut report,
            )
            .await;
        drop(turn);
        conclude(&shared, &scheduler, results, busy, tried, &mut report).await;
    }
    report
}

/// What a worker does with the jobs it ran (each job's result, its hold on its key in the
/// scheduler, and what it was, in the same order): a job that failed before anything of it was
/// recorded goes back to the scheduler, to be tried again after a delay; each other job is
/// finished, and the last job of a delivery to finish settles it with the broker. The jobs are
/// all put back or finished before any delivery is settled, so the scheduler frees their keys
/// without waiting for the broker.
async fn conclude<DB: Backend>(
    shared: &Shared<DB>,
    scheduler: &Arc<Scheduler<Work<DB>>>,
    results: Vec<Result<Handled, Error>>,
    busy: Vec<Busy<'_, Work<DB>>>,
    tried: Vec<Tried>,
    report: &mut RunReport,
) {
    let mut finished = Vec::with_capacity(results.len());
    for ((result, busy), tried) in results.into_iter().zip(busy).zip(tried) {
        if let Some(done) = put_back_unhandled(shared, scheduler, busy, result, tried) {
            finished.push(done);
        }
    }
    for (result, tried) in finished {
        if let Some((results, acker, attempt)) = tried.pending.finish(result, tried.attempt) {
            let pending = &tried.pending;
            settle_delivery(shared, pending, results, acker, attempt, report).await;
        }
    }
}

impl<DB: Backend> Work<DB> {
    /// The job, and what is left to know of it once a batch has run it.
    fn tried(self) -> (Box<dyn Job<DB>>, Tried) {
        let tried = Tried {
            handler: self.job.handler(),
            pending: self.pending,
            attempt: self.attempt,
            tries: self.tries,
        };
        (self.job, tried)
    }
}

/// Puts a job back in the scheduler when its transaction failed before anything of it was
/// recorded (the database unreachable or refusing writes, the connection lost), to be tried
/// again after a delay that grows with its tries: first among its aggregate's jobs, which wait
/// for it. Handed back to the broker instead, it would let the next message of its aggregate
/// apply first (and come back stale under monotonic ordering), and count a delivery with a broker
/// that drops a message delivered too often.
///
/// Returns the result when it is final: the job's outcome or a recorded failure, one that no
/// other try changes, the [`UNHANDLED_LIMIT`]-th attempt, or any try once the run is ending (the
/// delivery then goes back to the broker, and so do the later jobs of its key, unrun: they must
/// not overtake it).
fn put_back_unhandled<DB: Backend>(
    shared: &Shared<DB>,
    scheduler: &Arc<Scheduler<Work<DB>>>,
    busy: Busy<'_, Work<DB>>,
    result: Result<Handled, Error>,
    tried: Tried,
) -> Option<(Result<Handled, Error>, Tried)> {
    let Err(error) = &result else {
        return Some((result, tried));
    };
    let limit_reached = tried.attempt >= UNHANDLED_LIMIT && !error.is_unreachable();
    if !error.is_unrecorded() || limit_reached {
        return Some((result, tried));
    }
    if scheduler.is_closed() {
        busy.stop();
        return Some((result, tried));
    }
    let Ok(job) = shared.prepare_for(tried.handler, &tried.pending.envelope) else {
        return Some((result, tried));
    };
    let delay = growing_delay(tried.tries);
    if !matches!(error, Error::Behind { .. }) {
        tracing::warn!(%error, attempt = tried.attempt, ?delay, "handling failed before the failure could be recorded; trying the message again");
    }
    let work = Work {
        job,
        pending: tried.pending,
        attempt: tried.attempt + u32::from(!error.is_unreachable()),
        tries: tried.tries.saturating_add(1),
    };
    scheduler.put_back(busy, work, delay);
    None
}

impl Held for Pending {
    fn in_progress(&self) -> Option<BoxFuture<'static, Result<(), SourceError>>> {
        let settling = self.settling.lock().unwrap_or_else(|e| e.into_inner());
        settling.acker.as_ref().map(|acker| acker.in_progress())
    }
}

impl Pending {
    /// A delivery that `jobs` handlers' jobs share. Only a delivery for one handler lets the
    /// guard delete its queue row with the handler's writes: each job commits on its own, and
    /// the row must stay until the last one has.
    fn new(delivery: Delivery, jobs: usize, room: OwnedSemaphorePermit) -> Self {
        let (mut envelope, attempt, acker) = delivery.into_parts();
        if jobs > 1 {
            envelope = envelope.without_queue_receipt();
        }
        let settling = Settling {
            results: Vec::new(),
            acker: Some(acker),
            remaining: jobs,
            attempt,
        };
        Self {
            envelope,
            attempt,
            settling: Mutex::new(settling),
            _room: room,
        }
    }

    /// Adds one job's result, at its `attempt`; for the last one, returns them all, the means to
    /// settle, and the highest attempt.
    fn finish(&self, result: Result<Handled, Error>, attempt: u32) -> Option<Finished> {
        let mut settling = self.settling.lock().unwrap_or_else(|e| e.into_inner());
        settling.results.push(result);
        settling.attempt = settling.attempt.max(attempt);
        settling.remaining -= 1;
        if settling.remaining > 0 {
            return None;
        }
        let acker = settling.acker.take()?;
        let results = std::mem::take(&mut settling.results);
        Some((results, acker, settling.attempt))
    }
}

/// Settles a delivery once all its jobs ran (the last of them at `attempt`): acknowledged,
/// handed back, or kept as rejected.
async fn settle_delivery<DB: Backend>(
    shared: &Shared<DB>,
    pending: &Pending,
    results: Vec<Result<Handled, Error>>,
    acker: Box<dyn Acknowledge>,
    attempt: u32,
    report: &mut RunReport,
) {
    if results
        .iter()
        .any(|r| matches!(r, Ok(h) if h.outcome == Outcome::Processed))
    {
        shared.record_lag(&pending.envelope);
    }
    let id = pending.envelope.id();
    let settled = match settle(&results, attempt, report) {
        Settlement::Ack => {
            report.acked += 1;
            shared.hand_backs.settled(id);
            acker.ack().await
        }
        Settlement::Terminate => {
            report.acked += 1;
            shared.hand_backs.settled(id);
            acker.terminate().await
        }
        Settlement::Retry(delay) => {
            report.failed += 1;
            acker.retry_later(delay).await
        }
        Settlement::HandBack(delay) => {
            report.failed += 1;
            shared.hand_backs.handed_back(id);
            acker.nack(delay).await
        }
        Settlement::Reject(reason) => {
            let kept = store_rejected(shared, &pending.envelope, &reason, report).await;
            report.failed += u64::from(kept.is_err());
            terminate_if_kept(shared, &pending.envelope, kept, acker, attempt).await
        }
    };
    in_flight(&shared.consumer).decrement(1.0);
    if let Err(error) = settled {
        tracing::warn!(%error, "settling a delivery failed; the broker will redeliver it");
    }
}

/// `inbox_in_flight{consumer}`: deliveries pulled from the source and not settled yet.
fn in_flight(consumer: &str) -> metrics::Gauge {
    metrics::gauge!("inbox_in_flight", "consumer" => consumer.to_owned())
}

/// What to tell the broker about a delivery.
#[derive(Debug)]
enum Settlement {
    /// Every handler is done with it: processed (or skipped), or failed with the retry owned by
    /// the store.
    Ack,
    /// Every handler is done with it, and for one of them it is dead and kept: the broker must not
    /// deliver it again.
    Terminate,
    /// A handler failed and its failure is recorded: the store retries it after this delay (and
    /// the broker may deliver it again then).
    Retry(Duration),
    /// It was not handled, and nothing of it is recorded: deliver it again after this delay.
    HandBack(Duration),
    /// It cannot be handled, for this reason: keep it as rejected, then acknowledge it.
    Reject(String),
}

/// Counts the outcomes of one delivery's handlers and decides its settlement, for the
/// `attempt`-th delivery:
/// - acknowledged when each handler's result is durable: committed, or dead (then terminated);
/// - handed back after the retry delay when a handler failed and its retry is recorded (the
///   policy's attempt limit bounds these), or after the time left when it came before its retry
///   was due (acknowledged after [`NOT_DUE_HANDBACKS`] deliveries: the store retries it);
/// - kept as rejected when a handler's error is about the message itself;
/// - handed back after a delay that grows with `attempt` when the database failed transiently
///   (the run tried it again meanwhile, and is ending), and kept as rejected after
///   [`UNHANDLED_LIMIT`] attempts the database refused.
fn settle(results: &[Result<Handled, Error>], attempt: u32, report: &mut RunReport) -> Settlement {
    let mut retry: Option<Duration> = None;
    let mut hand_back: Option<Duration> = None;
    let mut dead = false;
    let mut rejection: Option<String> = None;
    let mut outcomes = Vec::with_capacity(results.len());
    for result in results {
        let delay = match result {
            Ok(done) => {
                outcomes.push(done.outcome);
                report.add(done.outcome, 1);
                report.add(Outcome::Released, u64::from(done.released));
                continue;
            }
            Err(Error::Handler {
                retry_after: None, ..
            }) => {
                outcomes.push(Outcome::Dead);
                report.add(Outcome::Dead, 1);
                dead = true;
                continue;
            }
            Err(Error::Handler {
                retry_after: Some(delay),
                ..
            }) => {
                outcomes.push(Outcome::Retrying);
                report.add(Outcome::Retrying, 1);
                *delay
            }
            Err(Error::RetryNotDue { retry_after, .. }) => {
                report.not_due += 1;
                if attempt >= NOT_DUE_HANDBACKS {
                    continue;
                }
                *retry_after
            }
            Err(error) if !error.is_transient() => {
                rejection.get_or_insert_with(|| error.to_string());
                continue;
            }
            Err(error) if attempt >= UNHANDLED_LIMIT && !error.is_unreachable() => {
                let reason = || format!("not handled after {attempt} tries: {error}");
                rejection.get_or_insert_with(reason);
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, attempt, "handling failed before the failure could be recorded; handing the delivery back");
                let delay = growing_delay(attempt);
                hand_back = Some(hand_back.map_or(delay, |shortest| shortest.min(delay)));
                continue;
            }
        };
        retry = Some(retry.map_or(delay, |shortest| shortest.min(delay)));
    }
    report.delivered(&mut outcomes);
    if let Some(reason) = rejection {
        return Settlement::Reject(reason);
    }
    match (hand_back, retry, dead) {
        (Some(delay), _, _) => Settlement::HandBack(delay),
        (None, Some(delay), _) => Settlement::Retry(delay),
        (None, None, true) => Settlement::Terminate,
        (None, None, false) => Settlement::Ack,
    }
}
