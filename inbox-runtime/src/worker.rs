//! The worker loop: one router pulls deliveries and hands each to the worker that owns its
//! aggregate; workers guard, commit, then settle with the broker.

use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use std::time::Duration;

use inbox_core::{Backend, Error, Outcome};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::inbox::{RunError, RunReport, Shared, UnknownTypes};
use crate::route::{Handled, Job};
use crate::source::{Delivery, Source};

/// Deliveries queued per worker before the router waits: bounds the work pulled but not done.
const QUEUE_PER_WORKER: usize = 16;

struct Work<DB: Backend> {
    delivery: Delivery,
    jobs: Vec<Box<dyn Job<DB>>>,
}

pub(crate) async fn run<DB: Backend, S: Source>(
    shared: Arc<Shared<DB>>,
    mut source: S,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<RunReport, RunError> {
    let mut report = RunReport::default();
    sweep(&shared, &mut report, Expiry::Later).await;
    let (stop_sweeping, sweeper) = spawn_sweeper(Arc::clone(&shared));
    let (stop_purging, purger) = spawn_purger(Arc::clone(&shared));
    let (queues, workers): (Vec<_>, Vec<_>) = (0..shared.workers)
        .map(|_| spawn_worker(Arc::clone(&shared)))
        .unzip();
    let routed = route(&shared, &mut source, &queues, shutdown, &mut report).await;
    drop(queues);
    for worker in workers {
        match worker.await {
            Ok(done) => report.merge(done),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
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

/// Sweeps every [`Shared::sweep_period`] until the sender is dropped; returns what the sweeps
/// released and expired.
fn spawn_sweeper<DB: Backend>(
    shared: Arc<Shared<DB>>,
) -> (oneshot::Sender<()>, JoinHandle<RunReport>) {
    let (stop, mut stopped) = oneshot::channel::<()>();
    let sweeper = tokio::spawn(async move {
        let period = shared.sweep_period();
        let mut report = RunReport::default();
        loop {
            tokio::select! {
                _ = &mut stopped => return report,
                () = tokio::time::sleep(period) => {}
            }
            sweep(&shared, &mut report, Expiry::Now).await;
        }
    });
    (stop, sweeper)
}

/// Whether a sweep expires gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Now,
    /// Not when a run starts: after downtime every gap looks overdue, though the missing message
    /// may be waiting in the source.
    Later,
}

/// Releases parked messages whose predecessor has applied (a release that failed earlier), handles
/// the replays operators requested, marks dead the parked messages whose gap outlived its timeout
/// (unless `expiry` says later), and updates the backlog gauges.
async fn sweep<DB: Backend>(shared: &Shared<DB>, report: &mut RunReport, expiry: Expiry) {
    match shared.resume().await {
        Ok(released) => report.add(Outcome::Released, u64::from(released)),
        Err(error) => tracing::warn!(%error, "could not release parked messages"),
    }
    match shared.replay_requested().await {
        Ok(replayed) => report.replayed += u64::from(replayed),
        Err(error) => tracing::warn!(%error, "could not handle the requested replays"),
    }
    if expiry == Expiry::Later {
        return gauge_backlog(shared).await;
    }
    match shared.expire_gaps().await {
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

/// Pulls deliveries until the source ends, `shutdown` completes or the source fails, and hands each
/// to its worker; a delivery that cannot be handled at all is rejected here.
async fn route<DB: Backend, S: Source>(
    shared: &Shared<DB>,
    source: &mut S,
    queues: &[mpsc::Sender<Work<DB>>],
    shutdown: impl Future<Output = ()>,
    report: &mut RunReport,
) -> Result<(), RunError> {
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            next = source.next() => next.map_err(RunError::Source)?,
        };
        let Some(delivery) = next else {
            return Ok(());
        };
        let jobs = match shared.prepare(delivery.envelope()) {
            Ok(jobs) => jobs,
            Err(error) => {
                reject(shared, delivery, error, report).await;
                continue;
            }
        };
        let queue = &queues[worker_for(&jobs, &delivery, queues.len())];
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => {
                settle_unhandled(delivery).await;
                return Ok(());
            }
            permit = queue.reserve() => permit,
        };
        match permit {
            Ok(permit) => {
                in_flight(&shared.consumer).increment(1.0);
                permit.send(Work { delivery, jobs });
            }
            // The worker is gone only if it panicked; joining it re-raises that panic.
            Err(_) => return Ok(()),
        }
    }
}

/// Hands a pulled delivery back to the broker unhandled, at shutdown.
async fn settle_unhandled(delivery: Delivery) {
    if let Err(error) = delivery.nack(Duration::ZERO).await {
        tracing::warn!(%error, "could not hand a delivery back at shutdown; the broker will redeliver it");
    }
}

/// Settles a delivery that cannot be handled at all (unknown type, undecodable payload, unusable
/// id, oversized payload): kept as rejected, with its bytes and the reason, then acknowledged; or,
/// for an unknown type under [`UnknownTypes::Acknowledge`], acknowledged and counted. If it cannot
/// be kept, it is handed back to the broker instead.
async fn reject<DB: Backend>(
    shared: &Shared<DB>,
    delivery: Delivery,
    error: Error,
    report: &mut RunReport,
) {
    let envelope = delivery.envelope();
    let skip = matches!(error, Error::UnknownMessageType(_))
        && shared.unknown_types == UnknownTypes::Acknowledge;
    let kept = if skip {
        tracing::warn!(
            id = envelope.id(),
            message_type = envelope.message_type(),
            "no handler for this type; acknowledged"
        );
        report.unknown_acknowledged += 1;
        metrics::counter!("inbox_unknown_types_total", "consumer" => shared.consumer.clone())
            .increment(1);
        Ok(())
    } else {
        tracing::warn!(id = envelope.id(), message_type = envelope.message_type(), %error, "delivery rejected");
        DB::reject(&shared.pool, &shared.consumer, envelope, &error.to_string())
            .await
            .map(|_| {
                report.rejected += 1;
                metrics::counter!("inbox_rejected_total", "consumer" => shared.consumer.clone())
                    .increment(1);
            })
    };
    let settled = match kept {
        Ok(()) => delivery.ack().await,
        Err(database) => {
            tracing::error!(%database, "could not keep a rejected delivery; handing it back");
            delivery.nack(Duration::ZERO).await
        }
    };
    if let Err(error) = settled {
        tracing::warn!(%error, "settling a rejected delivery failed; the broker will redeliver it");
    }
}

/// The worker that owns the delivery's aggregate (or, without one, its id).
fn worker_for<DB: Backend>(
    jobs: &[Box<dyn Job<DB>>],
    delivery: &Delivery,
    workers: usize,
) -> usize {
    let key = jobs
        .iter()
        .find_map(|job| job.aggregate())
        .unwrap_or(delivery.envelope().id());
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % workers as u64) as usize
}

fn spawn_worker<DB: Backend>(
    shared: Arc<Shared<DB>>,
) -> (mpsc::Sender<Work<DB>>, JoinHandle<RunReport>) {
    let (queue, work) = mpsc::channel(QUEUE_PER_WORKER);
    (queue, tokio::spawn(handle_all(shared, work)))
}

/// Handles queued deliveries in order until the router closes the queue.
async fn handle_all<DB: Backend>(
    shared: Arc<Shared<DB>>,
    mut work: mpsc::Receiver<Work<DB>>,
) -> RunReport {
    let mut report = RunReport::default();
    while let Some(Work { delivery, jobs }) = work.recv().await {
        let results = shared.execute(jobs, delivery.envelope()).await;
        let settlement = settle(&results, &mut report);
        let settled = match settlement {
            Settlement::Ack => {
                report.acked += 1;
                delivery.ack().await
            }
            Settlement::Retry(delay) => {
                report.failed += 1;
                delivery.nack(delay).await
            }
        };
        in_flight(&shared.consumer).decrement(1.0);
        if let Err(error) = settled {
            tracing::warn!(%error, "settling a delivery failed; the broker will redeliver it");
        }
    }
    report
}

/// `inbox_in_flight{consumer}`: deliveries pulled from the source and not settled yet.
fn in_flight(consumer: &str) -> metrics::Gauge {
    metrics::gauge!("inbox_in_flight", "consumer" => consumer.to_owned())
}

/// What to tell the broker about a delivery.
#[derive(Debug, PartialEq)]
enum Settlement {
    /// Every handler is done with it: processed (or skipped), or dead and kept.
    Ack,
    /// Deliver it again after this delay.
    Retry(Duration),
}

/// Counts the outcomes of one delivery's handlers and decides its settlement: acknowledged only
/// when each handler's result is durable (committed, or recorded dead); else handed back after the
/// shortest retry delay, at once if a failure could not even be recorded.
fn settle(results: &[Result<Handled, Error>], report: &mut RunReport) -> Settlement {
    let mut retry: Option<Duration> = None;
    for result in results {
        let delay = match result {
            Ok(done) => {
                report.add(done.outcome, 1);
                report.add(Outcome::Released, u64::from(done.released));
                continue;
            }
            Err(Error::Handler {
                retry_after: None, ..
            }) => {
                report.add(Outcome::Dead, 1);
                continue;
            }
            Err(Error::Handler {
                retry_after: Some(delay),
                ..
            }) => {
                report.add(Outcome::Retrying, 1);
                *delay
            }
            Err(error) => {
                tracing::warn!(%error, "handling failed before the failure could be recorded; handing the delivery back");
                Duration::ZERO
            }
        };
        retry = Some(retry.map_or(delay, |shortest| shortest.min(delay)));
    }
    retry.map_or(Settlement::Ack, Settlement::Retry)
}
