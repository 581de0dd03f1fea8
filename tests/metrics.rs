//! The metrics a scripted run leaves behind, read through a recorder installed for this test
//! binary: a counter per outcome, the handler duration, rejected deliveries, the in-flight,
//! parked and dead-letter gauges, the end-to-end lag and the purge counters; on every backend,
//! one message per transaction and batched.

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use inbox::prelude::*;
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.step")]
struct Step {
    id: String,
    stream: String,
    sequence: i64,
    fail: bool,
}

fn step(id: &str, stream: &str, sequence: i64) -> Step {
    Step {
        id: id.into(),
        stream: stream.into(),
        sequence,
        fail: false,
    }
}

#[inbox_handler(
    key = "id",
    sequence = "sequence",
    aggregate = "stream",
    ordering = "strict"
)]
async fn strict_steps(msg: Step) -> Result<(), HandlerError> {
    match msg.fail {
        true => Err(HandlerError::msg("this step always fails")),
        false => Ok(()),
    }
}

#[inbox_handler(key = "id", sequence = "sequence", aggregate = "stream")]
async fn monotonic_steps(_msg: Step) -> Result<(), HandlerError> {
    Ok(())
}

/// The tests of this binary run one at a time: a snapshot drains the counters it reads.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The recorder of this test binary, installed by the first test that asks for it. Each test
/// reads only the metrics of its own consumers.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

/// The suite, once per backend and mode (`common::on_every_backend!`). Each test counts under
/// consumer names of its own, so that no run reads another's metrics.
macro_rules! metrics_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;
        use std::time::{Duration, SystemTime};

        use inbox::prelude::*;
        use inbox::{MemoryBroker, Retention, RetryPolicy};
        use metrics_util::debugging::DebugValue;

        use super::{
            ONE_AT_A_TIME, Step, label, monotonic_steps, outcomes_counted, snapshotter, step,
            strict_steps,
        };

        /// The suite's mode, a batch waiting long enough to take every delivery of a short run.
        fn batch() -> Option<inbox::Batch> {
            $batch.map(|batch: inbox::Batch| batch.linger(Duration::from_millis(20)))
        }

        #[tokio::test]
        async fn a_scripted_run_counts_every_outcome() {
            let _alone = ONE_AT_A_TIME.lock().await;
            let snapshotter = snapshotter();
            let Some(pool) = $connect("metrics").await else {
                return;
            };
            let consumer = crate::common::unique("billing");
            let retry =
                RetryPolicy::new(2).backoff(Duration::from_millis(1), Duration::from_millis(1));
            let inbox = crate::common::builder(&pool, batch())
                .consumer(&consumer)
                .retry(retry)
                .handler(strict_steps)
                .build()
                .await
                .unwrap();
            let monotonic = Inbox::builder(pool.clone())
                .consumer(&consumer)
                .handler(monotonic_steps)
                .build()
                .await
                .unwrap();
            let send = |inbox: &Inbox<$db>, step: Step| {
                let inbox = inbox.clone();
                async move { inbox.dispatch(&Envelope::encode("d", &step).unwrap()).await }
            };

            send(&inbox, step("s-2", "a", 2)).await.unwrap(); // parked
            send(&inbox, step("s-1", "a", 1)).await.unwrap(); // processed, releases s-2
            send(&inbox, step("s-1", "a", 1)).await.unwrap(); // duplicate
            let conflicting = Step {
                sequence: 9,
                ..step("s-1", "a", 1)
            };
            send(&inbox, conflicting).await.unwrap(); // conflict
            let poison = Step {
                fail: true,
                ..step("p-1", "b", 1)
            };
            send(&inbox, poison.clone()).await.unwrap_err(); // retrying
            tokio::time::sleep(Duration::from_millis(20)).await; // its 1 ms backoff is surely over
            send(&inbox, poison).await.unwrap_err(); // dead
            send(&monotonic, step("m-2", "c", 2)).await.unwrap(); // processed
            send(&monotonic, step("m-1", "c", 1)).await.unwrap(); // stale
            let broker = MemoryBroker::new();
            broker.publish(Envelope::new("test.unknown", "d-9", b"{}".to_vec())); // rejected
            let published = SystemTime::now() - Duration::from_secs(3);
            let timed = Envelope::encode("d-10", &step("r-1", "d", 1)).unwrap();
            broker.publish(timed.with_produced_at(published)); // processed, 3 s after publication
            broker.close();
            inbox.run(broker.source()).await.unwrap(); // its first sweep sets the backlog gauges
            sqlx::query("UPDATE inbox_messages SET processed_at = '2000-01-01 00:00:00'")
                .execute(&pool)
                .await
                .unwrap();
            let year = Retention::new(Duration::from_secs(365 * 24 * 3600));
            let purge = inbox::purge(&pool, &year).await.unwrap();
            assert_eq!((purge.purged, purge.batches), (5, 1));

            let mut outcomes = BTreeMap::new();
            let mut named = BTreeMap::new();
            for (composite, _, _, value) in snapshotter.snapshot().into_vec() {
                let (key, label) = (composite.key(), |name| label(&composite, name));
                // The purge's counters have no consumer: this test's purge is the only one.
                if label("consumer").is_some_and(|counted| counted != consumer) {
                    continue;
                }
                match (key.name(), value) {
                    ("inbox_messages_total", DebugValue::Counter(n)) => {
                        let at = (label("handler").unwrap(), label("outcome").unwrap());
                        *outcomes.entry(at).or_insert(0) += n;
                    }
                    ("inbox_handler_duration_seconds", DebugValue::Histogram(samples)) => {
                        named.insert(
                            format!("duration {}", label("handler").unwrap()),
                            samples.len() as u64,
                        );
                    }
                    ("inbox_rejected_total", DebugValue::Counter(n)) => {
                        _ = named.insert("rejected".into(), n)
                    }
                    ("inbox_in_flight", DebugValue::Gauge(n)) => {
                        _ = named.insert("in flight".into(), n.into_inner() as u64)
                    }
                    ("inbox_parked_messages" | "inbox_dead_letters", DebugValue::Gauge(n)) => {
                        let at = format!("{} {}", key.name(), label("handler").unwrap());
                        named.insert(at, n.into_inner() as u64);
                    }
                    ("inbox_lag_seconds", DebugValue::Histogram(lags)) => {
                        let lags = lags.iter().map(|lag| lag.into_inner() as u64);
                        named.insert("lag samples".into(), lags.len() as u64);
                        named.insert("lag".into(), lags.max().unwrap());
                    }
                    (
                        "inbox_purged_total" | "inbox_purge_batches_total",
                        DebugValue::Counter(n),
                    ) => _ = named.insert(key.name().into(), n),
                    _ => {}
                }
            }
            let expected = [
                (("strict_steps", "parked"), 1),
                (("strict_steps", "processed"), 2),
                (("strict_steps", "released"), 1),
                (("strict_steps", "duplicate"), 1),
                (("strict_steps", "conflict"), 1),
                (("strict_steps", "retry"), 1),
                (("strict_steps", "dead"), 1),
                (("monotonic_steps", "processed"), 1),
                (("monotonic_steps", "stale"), 1),
            ];
            let expected: BTreeMap<_, _> = expected
                .into_iter()
                .map(|((h, o), n)| ((h.to_owned(), o.to_owned()), n))
                .collect();
            assert_eq!(outcomes, expected);
            assert_eq!(named.get("rejected"), Some(&1));
            assert_eq!(
                named.get("in flight"),
                Some(&0),
                "settled deliveries leave the gauge"
            );
            assert_eq!(named.get("inbox_dead_letters strict_steps"), Some(&1));
            assert_eq!(named.get("inbox_parked_messages strict_steps"), Some(&0));
            let lag = "only d-10 says when it was published, 3 s before it was handled";
            assert_eq!(named.get("lag samples"), Some(&1), "{lag}");
            assert!(named.get("lag").is_some_and(|lag| *lag >= 3), "{lag}");
            let purged = "s-1, s-2, r-1, m-2 processed and m-1 stale; the dead p-1 is kept";
            assert_eq!(named.get("inbox_purged_total"), Some(&5), "{purged}");
            assert_eq!(named.get("inbox_purge_batches_total"), Some(&1));
            let ran = "s-1, s-2, r-1 and the two failed attempts ran the handler";
            assert_eq!(named.get("duration strict_steps"), Some(&5), "{ran}");
        }

        /// A run counts each outcome once: in batched mode, a failure in a batch once, not again
        /// when the rest of its batch is run again without it.
        #[tokio::test]
        async fn a_run_counts_each_outcome_once() {
            let _alone = ONE_AT_A_TIME.lock().await;
            let snapshotter = snapshotter();
            let script = [
                step("s-2", "a", 2), // parked
                step("s-1", "a", 1), // processed, releases s-2
                step("s-1", "a", 1), // duplicate
                Step {
                    sequence: 9,
                    ..step("s-1", "a", 1)
                }, // conflict
                // retry, then dead: the memory broker delivers it again after its backoff
                Step {
                    fail: true,
                    ..step("p-1", "b", 1)
                },
                step("c-1", "c", 1), // processed
                step("c-2", "c", 2), // processed
            ];
            let Some(pool) = $connect("metrics_run").await else {
                return;
            };
            let consumer = crate::common::unique("run");
            let quick = Duration::from_millis(1);
            let inbox = crate::common::builder(&pool, batch())
                .consumer(&consumer)
                .retry(RetryPolicy::new(2).backoff(quick, quick))
                .handler(strict_steps)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            for (n, step) in script.iter().enumerate() {
                broker.publish(Envelope::encode(format!("d-{n}"), step).unwrap());
            }
            broker.close();

            inbox.run(broker.source()).await.unwrap();

            let expected = [
                ("parked", 1),
                ("processed", 3),
                ("released", 1),
                ("duplicate", 1),
                ("conflict", 1),
                ("retry", 1),
                ("dead", 1),
            ];
            let expected: BTreeMap<_, _> = expected
                .into_iter()
                .map(|(o, n)| (o.to_owned(), n))
                .collect();
            assert_eq!(outcomes_counted(snapshotter, &consumer), expected);
        }

        /// What an operator's gap skip (or a sweep) releases is counted as what a delivery
        /// releases, and a release that fails as the failure it is.
        #[tokio::test]
        async fn a_release_that_no_delivery_made_is_counted_too() {
            let _alone = ONE_AT_A_TIME.lock().await;
            let snapshotter = snapshotter();
            let Some(pool) = $connect("released_by_an_operator").await else {
                return;
            };
            let consumer = crate::common::unique("skipping");
            let inbox = crate::common::builder(&pool, batch())
                .consumer(&consumer)
                .handler(strict_steps)
                .build()
                .await
                .unwrap();
            let failing = Step {
                fail: true,
                ..step("s-3", "a", 3)
            };
            for step in [step("s-2", "a", 2), failing] {
                inbox
                    .dispatch(&Envelope::encode("d", &step).unwrap())
                    .await
                    .unwrap();
            }

            let skipped = inbox.skip_gap("strict_steps", "a").await;

            let failed = matches!(skipped, Err(inbox::Error::Handler { attempt: 1, .. }));
            assert!(failed, "s-2 released, then s-3 failed: {skipped:?}");
            let expected = [("parked", 2), ("released", 1), ("retry", 1)];
            let expected: BTreeMap<_, _> = expected
                .into_iter()
                .map(|(o, n)| (o.to_owned(), n))
                .collect();
            assert_eq!(outcomes_counted(snapshotter, &consumer), expected);
        }
    };
}

common::on_every_backend!(metrics_suite, batched);

/// `inbox_messages_total` of `consumer`, by outcome.
fn outcomes_counted(snapshotter: &Snapshotter, consumer: &str) -> BTreeMap<String, u64> {
    let mut outcomes = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let ("inbox_messages_total", DebugValue::Counter(n)) = (key.key().name(), value)
            && label(&key, "consumer").as_deref() == Some(consumer)
        {
            *outcomes.entry(label(&key, "outcome").unwrap()).or_insert(0) += n;
        }
    }
    outcomes
}

/// The value of the label `name` of the metric `key`, if it has one.
fn label(key: &CompositeKey, name: &str) -> Option<String> {
    let mut labels = key.key().labels();
    labels
        .find(|l| l.key() == name)
        .map(|l| l.value().to_owned())
}
