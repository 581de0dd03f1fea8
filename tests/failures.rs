//! Failures on real databases: retries with backoff, dead letters after the last attempt or a
//! permanent error, the attempt number in `Context`, and a failure that cannot be recorded.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use inbox::{Acknowledge, Delivery, Envelope, Source, SourceError};

/// A source that delivers one envelope as its `attempt`-th delivery, then nothing, and notes how
/// that delivery was settled.
struct DeliveredBefore {
    envelope: Option<Envelope>,
    attempt: u32,
    settled: Arc<Mutex<Vec<&'static str>>>,
}

/// Notes `ack` or `nack`.
struct Noted(Arc<Mutex<Vec<&'static str>>>);

impl Noted {
    fn note(self, what: &'static str) -> BoxFuture<'static, Result<(), SourceError>> {
        self.0.lock().expect("notes").push(what);
        Box::pin(async { Ok(()) })
    }
}

impl Acknowledge for Noted {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        self.note("ack")
    }

    fn nack(self: Box<Self>, _delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        self.note("nack")
    }
}

impl Source for DeliveredBefore {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        match self.envelope.take() {
            Some(envelope) => {
                let noted = Box::new(Noted(Arc::clone(&self.settled)));
                Ok(Some(Delivery::new(envelope, self.attempt, noted)))
            }
            None => std::future::pending().await,
        }
    }
}

macro_rules! failures_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{DeadLetterFilter, Error, MemoryBroker, RetryPolicy};
        use tokio::sync::Notify;

        /// A job whose `kind` says how its handler behaves.
        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "test.job")]
        struct Job {
            id: String,
            kind: String,
        }

        fn job(id: &str, kind: &str) -> Job {
            Job { id: id.into(), kind: kind.into() }
        }

        /// Lets the "gated" job through once the test has closed the pool.
        static GATE: Notify = Notify::const_new();
        static AT_GATE: AtomicBool = AtomicBool::new(false);

        /// `poison` always fails, `flaky` fails on its first two attempts, `invalid` fails
        /// permanently, `gated` fails after the test closes the pool; every job that succeeds
        /// records its attempt and the poison's status at that moment.
        #[inbox_handler(key = "id", name = "jobs")]
        async fn run_job(ctx: &mut Context<'_, $db>, job: Job) -> Result<(), HandlerError> {
            match job.kind.as_str() {
                "poison" => return Err(HandlerError::msg("poison never works")),
                "flaky" if ctx.attempt() < 3 => return Err(HandlerError::msg(format!("flaky, attempt {}", ctx.attempt()))),
                "invalid" => return Err(HandlerError::permanent(HandlerError::msg("invalid job"))),
                "gated" => {
                    AT_GATE.store(true, Ordering::SeqCst);
                    GATE.notified().await;
                    return Err(HandlerError::msg("gated job failed"));
                }
                _ => {}
            }
            // A plain read, then the insert: on MySQL a subquery inside an INSERT is a locking
            // read, whose scan waits on (and deadlocks with) the other jobs' uncommitted rows.
            let poison: Option<String> = sqlx::query_scalar($crate::common::sql::<$db>("SELECT status FROM inbox_messages WHERE message_id = 'poison'"))
                .fetch_optional(&mut **ctx)
                .await?;
            sqlx::query($crate::common::sql::<$db>("INSERT INTO done (id, attempt, poison) VALUES ($1, $2, $3)"))
                .bind(job.id)
                .bind(i64::from(ctx.attempt()))
                .bind(poison)
                .execute(&mut **ctx)
                .await?;
            Ok(())
        }

        /// The same handler after a fix: the poison job works now.
        #[inbox_handler(key = "id", name = "jobs")]
        async fn run_job_fixed(ctx: &mut Context<'_, $db>, job: Job) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO done (id, attempt) VALUES ($1, $2)"))
                .bind(job.id)
                .bind(i64::from(ctx.attempt()))
                .execute(&mut **ctx)
                .await?;
            Ok(())
        }

        type Pool = sqlx::Pool<$db>;

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            sqlx::query($crate::common::sql::<$db>("CREATE TABLE done (id TEXT NOT NULL, attempt BIGINT NOT NULL, poison TEXT)"))
                .execute(&pool)
                .await
                .unwrap();
            Some(pool)
        }

        fn quick(max_attempts: u32) -> RetryPolicy {
            RetryPolicy::new(max_attempts).backoff(Duration::from_millis(5), Duration::from_millis(20))
        }

        async fn inbox(pool: &Pool, retry: RetryPolicy) -> Inbox<$db> {
            builder(&pool).retry(retry).handler(run_job).build().await.unwrap()
        }

        async fn row(pool: &Pool, id: &str) -> Option<(String, i32, Option<String>, Option<String>)> {
            sqlx::query_as($crate::common::sql::<$db>("SELECT status, attempt_count, first_error, error_text FROM inbox_messages WHERE message_id = $1"))
                .bind(id.to_owned())
                .fetch_optional(pool)
                .await
                .unwrap()
        }

        async fn done(pool: &Pool) -> Vec<(String, i64, Option<String>)> {
            sqlx::query_as($crate::common::sql::<$db>("SELECT id, attempt, poison FROM done ORDER BY id")).fetch_all(pool).await.unwrap()
        }

        /// Dispatches `envelope` once its retry is due, as a broker that honours the handback
        /// delay redelivers it.
        async fn dispatch_due(inbox: &Inbox<$db>, envelope: &Envelope) -> Result<inbox::Dispatched, Error> {
            loop {
                match inbox.dispatch(envelope).await {
                    Err(Error::RetryNotDue { retry_after, .. }) => tokio::time::sleep(retry_after).await,
                    other => return other,
                }
            }
        }

        fn envelope(job: &Job) -> Envelope {
            Envelope::encode(format!("delivery-{}", job.id), job).unwrap()
        }

        #[tokio::test]
        async fn a_handler_failing_twice_succeeds_on_its_third_attempt() {
            let Some(pool) = database("flaky").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            let flaky = envelope(&job("flaky", "flaky"));

            for attempt in [1, 2] {
                let error = dispatch_due(&inbox, &flaky).await.unwrap_err();
                assert!(matches!(error, Error::Handler { attempt: a, retry_after: Some(_), .. } if a == attempt), "{error}");
            }
            assert_eq!(row(&pool, "flaky").await, Some(("failed".into(), 2, Some("flaky, attempt 1".into()), Some("flaky, attempt 2".into()))));
            let handled = dispatch_due(&inbox, &flaky).await.unwrap();

            assert_eq!(handled[0].outcome, Outcome::Processed);
            assert_eq!(done(&pool).await, [("flaky".into(), 3, None)], "applied once, on attempt 3");
            assert_eq!(row(&pool, "flaky").await.unwrap().0, "processed");
            assert_eq!(inbox.dispatch(&flaky).await.unwrap()[0].outcome, Outcome::Duplicate);
        }

        /// A retry from the store that ended with nothing recorded is put off by as long as it
        /// has been since the message's failure was recorded, within the given bounds.
        #[tokio::test]
        async fn a_retry_put_off_is_due_after_as_long_as_since_its_failure() {
            let Some(pool) = database("put_off").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            inbox.dispatch(envelope(&job("poison", "poison"))).await.unwrap_err();
            // SQLite keeps the time of the failure in whole seconds.
            tokio::time::sleep(Duration::from_millis(2_100)).await;
            let consumer: String = sqlx::query_scalar("SELECT consumer FROM inbox_messages").fetch_one(&pool).await.unwrap();
            let key = inbox::MessageKey { consumer: &consumer, handler: "jobs", message_id: "poison" };
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;

            inbox::storage::messages::postpone_retry::<$db>(&pool, &key, now, (100, 60_000)).await.unwrap();

            let due: i64 = sqlx::query_scalar("SELECT retry_at_ms FROM inbox_messages").fetch_one(&pool).await.unwrap();
            assert!((1_100..=4_000).contains(&(due - now)), "due {} ms from now", due - now);
            inbox::storage::messages::postpone_retry::<$db>(&pool, &key, now, (100, 500)).await.unwrap();
            let due: i64 = sqlx::query_scalar("SELECT retry_at_ms FROM inbox_messages").fetch_one(&pool).await.unwrap();
            assert_eq!(due - now, 500, "at most the longest delay");
        }

        /// A retry from the store whose handler fails again is recorded as any failure is, and
        /// waits for the policy's next delay: it is not put off as a try that recorded nothing.
        #[tokio::test]
        async fn a_retry_from_the_store_that_fails_again_waits_for_the_next_delay() {
            let Some(pool) = database("store_backoff").await else { return };
            let backoff = RetryPolicy::new(5).backoff(Duration::from_secs(1), Duration::from_secs(60));
            let inbox = inbox(&pool, backoff.jitter(0.0)).await;
            inbox.dispatch(envelope(&job("poison", "poison"))).await.unwrap_err();
            tokio::time::sleep(Duration::from_millis(1_100)).await;

            inbox.replay_requested().await.unwrap();

            let (status, attempts, _, _) = row(&pool, "poison").await.unwrap();
            assert_eq!((status.as_str(), attempts), ("failed", 2), "retried from the store, and failed again");
            let due: i64 = sqlx::query_scalar("SELECT retry_at_ms FROM inbox_messages").fetch_one(&pool).await.unwrap();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
            assert!(due - now > 1_500, "due after the second delay (2 s), not the first (1 s): in {} ms", due - now);
        }

        #[tokio::test]
        async fn a_poison_message_dies_after_its_last_attempt_while_others_flow() {
            let Some(pool) = database("poison").await else { return };
            let inbox = inbox(&pool, quick(4)).await;
            let broker = MemoryBroker::new();
            broker.publish(envelope(&job("poison", "poison")));
            for i in 0..40 {
                broker.publish(envelope(&job(&format!("good-{i:02}"), "good")));
            }
            broker.close();

            let run = inbox.run(broker.source());
            let report = tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .expect("the poison message dies, so the run ends")
                .unwrap();

            let (status, attempts, first, last) = row(&pool, "poison").await.unwrap();
            assert_eq!((status.as_str(), attempts), ("dead", 4), "dead after exactly max_attempts");
            assert_eq!((first.as_deref(), last.as_deref()), (Some("poison never works"), Some("poison never works")));
            assert_eq!(report.handler_calls_with(Outcome::Retrying), 3, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Dead), 1, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 40, "{report:?}");
            assert_eq!(broker.acked(), 41, "a dead message is kept, so its delivery is acknowledged");
            let during_retries = done(&pool).await.iter().filter(|(_, _, poison)| poison.as_deref() == Some("failed")).count();
            assert!(during_retries > 0, "other messages were handled while the poison one waited for its retries");
            let dead = inbox.dead().await.unwrap();
            assert_eq!((dead.len(), dead[0].attempt_count), (1, 4));
        }

        #[tokio::test]
        async fn a_permanent_error_is_dead_on_its_first_attempt() {
            let Some(pool) = database("permanent").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            let invalid = envelope(&job("invalid", "invalid"));

            let error = inbox.dispatch(&invalid).await.unwrap_err();

            assert!(matches!(error, Error::Handler { attempt: 1, retry_after: None, .. }), "{error}");
            assert_eq!(row(&pool, "invalid").await.unwrap().0, "dead");
            assert_eq!(inbox.dispatch(&invalid).await.unwrap()[0].outcome, Outcome::Dead, "a redelivery runs nothing");
        }

        #[tokio::test]
        async fn a_dead_message_replayed_after_a_fix_is_processed_once() {
            let Some(pool) = database("replay").await else { return };
            let broken = inbox(&pool, quick(2)).await;
            let poison = envelope(&job("poison", "poison"));
            broken.dispatch(&poison).await.unwrap_err();
            dispatch_due(&broken, &poison).await.unwrap_err();
            assert_eq!(broken.dead().await.unwrap().len(), 1);
            let fixed = builder(&pool).handler(run_job_fixed).build().await.unwrap();

            let replayed = fixed.replay("jobs", "poison", "ops@example.com", "fixed in 1.2.3").await.unwrap();
            let again = fixed.replay("jobs", "poison", "ops@example.com", "again").await.unwrap();

            assert_eq!((replayed, again), (Outcome::Processed, Outcome::Duplicate));
            assert_eq!(done(&pool).await, [("poison".into(), 1, None)], "applied once, as a first attempt");
            assert!(fixed.dead().await.unwrap().is_empty());
            let shown = fixed.show("jobs", "poison").await.unwrap().unwrap();
            assert_eq!((shown.status.as_str(), shown.resolution.as_deref()), ("processed", Some("replayed")));
            assert_eq!(fixed.show("jobs", "nothing").await.unwrap(), None);
            let resolution: (String, Option<String>, Option<String>, Option<String>) = sqlx::query_as(
                $crate::common::sql::<$db>("SELECT status, resolution, resolved_by, resolved_reason FROM inbox_messages WHERE message_id = 'poison'"),
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            let (by, why) = (Some("ops@example.com".to_owned()), Some("fixed in 1.2.3".to_owned()));
            assert_eq!(resolution, ("processed".into(), Some("replayed".into()), by, why));
            assert_eq!(fixed.dispatch(&poison).await.unwrap()[0].outcome, Outcome::Duplicate);
        }

        #[tokio::test]
        async fn a_replay_requested_from_outside_is_handled_by_the_running_inbox() {
            let Some(pool) = database("replay_requested").await else { return };
            let broken = inbox(&pool, quick(1)).await;
            broken.dispatch(&envelope(&job("poison", "poison"))).await.unwrap_err();
            let key = inbox::MessageKey { consumer: broken.consumer(), handler: "jobs", message_id: "poison" };
            inbox::request_replay(&pool, &key, ("ops@example.com", "fixed in 1.2.3")).await.unwrap();
            assert_eq!(done(&pool).await, [], "a request runs nothing by itself");

            let fixed = builder(&pool).handler(run_job_fixed).build().await.unwrap();
            let broker = MemoryBroker::new();
            broker.close();
            fixed.run(broker.source()).await.unwrap();

            assert_eq!(done(&pool).await, [("poison".into(), 1, None)], "the run's sweep handled it");
            assert!(fixed.dead().await.unwrap().is_empty());
        }

        /// A poison job, dead after one attempt, whose replay is requested.
        async fn replay_of_dead_poison(pool: &Pool) -> Inbox<$db> {
            let broken = inbox(pool, quick(1)).await;
            broken.dispatch(&envelope(&job("poison", "poison"))).await.unwrap_err();
            let key = inbox::MessageKey { consumer: broken.consumer(), handler: "jobs", message_id: "poison" };
            inbox::request_replay(pool, &key, ("ops@example.com", "try again")).await.unwrap();
            broken
        }

        #[tokio::test]
        async fn a_running_inbox_handles_a_replay_requested_while_it_runs() {
            let Some(pool) = database("replay_while_running").await else { return };
            let broken = inbox(&pool, quick(1)).await;
            broken.dispatch(&envelope(&job("poison", "poison"))).await.unwrap_err();
            let fixed = builder(&pool)
                .sweep_interval(Duration::from_millis(20))
                .handler(run_job_fixed)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            // Polled once the run has made its first sweep: the request waits for a later one.
            let operator = async {
                let key = inbox::MessageKey { consumer: "default", handler: "jobs", message_id: "poison" };
                inbox::request_replay(&pool, &key, ("ops@example.com", "fixed")).await.unwrap();
                while done(&pool).await.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            let run = tokio::time::timeout(Duration::from_secs(30), fixed.run_until(broker.source(), operator));
            let report = run.await.expect("a sweep handles the replay").unwrap();

            assert_eq!(report.replayed, 1);
            assert_eq!(done(&pool).await, [("poison".into(), 1, None)]);
        }

        #[tokio::test]
        async fn a_requested_replay_that_fails_again_waits_for_its_retry_delay_then_dies() {
            let Some(pool) = database("replay_backoff").await else { return };
            replay_of_dead_poison(&pool).await;
            let hour = Duration::from_secs(3600);
            let patient = inbox(&pool, RetryPolicy::new(3).backoff(hour, hour)).await;
            let attempts = |row: Option<(String, i32, Option<String>, Option<String>)>| row.map(|(status, n, ..)| (status, n));

            assert_eq!(patient.replay_requested().await.unwrap(), 0);
            assert_eq!(attempts(row(&pool, "poison").await), Some(("failed".into(), 1)));
            patient.replay_requested().await.unwrap();
            assert_eq!(attempts(row(&pool, "poison").await), Some(("failed".into(), 1)), "not due for an hour");

            // The hour passes.
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET retry_at_ms = 0")).execute(&pool).await.unwrap();
            let quick_one = inbox(&pool, RetryPolicy::new(2).backoff(Duration::ZERO, Duration::ZERO)).await;
            quick_one.replay_requested().await.unwrap();
            assert_eq!(attempts(row(&pool, "poison").await), Some(("dead".into(), 2)), "the policy gave up");
            quick_one.replay_requested().await.unwrap();
            assert_eq!(attempts(row(&pool, "poison").await), Some(("dead".into(), 2)), "a dead message is not replayed");
        }

        #[tokio::test]
        async fn a_requested_replay_that_no_longer_decodes_is_dead_with_the_reason() {
            let Some(pool) = database("replay_undecodable").await else { return };
            let broken = replay_of_dead_poison(&pool).await;
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET payload = $1 WHERE message_id = 'poison'"))
                .bind(b"{\"id\": 7}".to_vec())
                .execute(&pool)
                .await
                .unwrap();

            assert_eq!(broken.replay_requested().await.unwrap(), 0);

            let (status, _, _, error) = row(&pool, "poison").await.unwrap();
            assert_eq!(status, "dead");
            assert!(error.unwrap().starts_with("cannot be replayed: "), "the reason is kept");
            assert_eq!(broken.replay_requested().await.unwrap(), 0, "and it is not tried again");
        }

        #[tokio::test]
        async fn dead_letters_are_listed_by_handler_type_and_age() {
            let Some(pool) = database("dead_filter").await else { return };
            let inbox = inbox(&pool, quick(1)).await;
            for (id, kind) in [("p-1", "poison"), ("p-2", "invalid")] {
                inbox.dispatch(&envelope(&job(id, kind))).await.unwrap_err();
            }
            let count = |filter: DeadLetterFilter| {
                let inbox = inbox.clone();
                async move { inbox.dead_letters(&filter).await.unwrap().len() }
            };
            let all = DeadLetterFilter::default;

            assert_eq!(count(all()).await, 2);
            assert_eq!(count(all().handler("jobs")).await, 2);
            assert_eq!(count(all().handler("other")).await, 0);
            assert_eq!(count(all().limit(1)).await, 1, "one page");
            assert_eq!(count(all().limit(1).offset(1)).await, 1, "the next page");
            assert_eq!(count(all().offset(2)).await, 0, "past the last page");
            let pages = [all().limit(1), all().limit(1).offset(1)];
            let mut paged = Vec::new();
            for page in pages {
                paged.extend(inbox.dead_letters(&page).await.unwrap().into_iter().map(|m| m.message_id));
            }
            assert_eq!(paged, ["p-1", "p-2"], "pages follow the listing's order");
            assert_eq!(count(all().message_type("test.job")).await, 2);
            assert_eq!(count(all().message_type("test.other")).await, 0);
            assert_eq!(count(all().failed_within(Duration::from_secs(3600))).await, 2);
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET failed_at = '2000-01-01 00:00:00' WHERE message_id = 'p-1'"))
                .execute(&pool)
                .await
                .unwrap();
            assert_eq!(count(all().failed_within(Duration::from_secs(3600))).await, 1);
            let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
            assert_eq!(count(all().since(an_hour_ago)).await, 1);
            assert_eq!(count(all().since(std::time::UNIX_EPOCH)).await, 2);
        }

        #[tokio::test]
        async fn a_discarded_message_is_kept_with_who_and_why() {
            let Some(pool) = database("discard").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            let invalid = envelope(&job("invalid", "invalid"));
            inbox.dispatch(&invalid).await.unwrap_err();

            inbox.discard("jobs", "invalid", "ops@example.com", "customer cancelled").await.unwrap();

            let discarded = inbox.discarded().await.unwrap();
            assert_eq!(discarded.len(), 1);
            assert_eq!(discarded[0].resolved_reason.as_deref(), Some("customer cancelled"));
            assert!(inbox.dead().await.unwrap().is_empty());
            assert_eq!(inbox.dispatch(&invalid).await.unwrap()[0].outcome, Outcome::Duplicate);
            let error = inbox.discard("jobs", "invalid", "ops@example.com", "twice").await.unwrap_err();
            assert!(matches!(error, Error::NotDead { action: "discard", .. }), "{error}");
        }

        #[tokio::test]
        async fn bad_input_is_kept_with_its_bytes_and_a_reason() {
            let Some(pool) = database("bad_input").await else { return };
            let inbox = builder(&pool).max_payload_bytes(64).handler(run_job).build().await.unwrap();
            let oversized = format!("{{\"id\": \"big\", \"kind\": \"{}\"}}", "x".repeat(100));
            let too_large = format!("the payload is {} bytes; the limit is 64 (its first 64 bytes are kept)", oversized.len());
            let bad: [(&str, Vec<u8>, &str); 5] = [
                ("test.job", b"{\"id\": \"a\", \"kind\": ".to_vec(), "cannot decode a `test.job` payload: EOF while parsing a value at line 1 column 20"),
                ("test.nope", b"{}".to_vec(), "no handler is registered for message type `test.nope`"),
                ("test.job", b"{\"id\": \"\", \"kind\": \"good\"}".to_vec(), "invalid message id: it is empty"),
                ("test.job", b"{\"kind\": \"good\"}".to_vec(), "cannot decode a `test.job` payload: missing field `id` at line 1 column 16"),
                ("test.job", oversized.clone().into_bytes(), &too_large),
            ];
            let broker = MemoryBroker::new();
            for (n, (message_type, payload, _)) in bad.iter().enumerate() {
                broker.publish(Envelope::new(*message_type, format!("d-{n}"), payload.clone()).with_header("trace", "t-1"));
            }
            broker.publish(envelope(&job("fine", "good")));
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!((report.rejected, report.handler_calls_with(Outcome::Processed)), (5, 1), "{report:?}");
            assert_eq!(broker.acked(), 6);
            let rejected = inbox.rejected().await.unwrap();
            let kept: Vec<_> = rejected.iter().map(|r| (r.message_type.as_str(), r.payload.clone(), r.reason.as_str())).collect();
            let mut expected: Vec<_> = bad.iter().map(|(t, p, r)| (*t, p.clone(), *r)).collect();
            expected[4].1.truncate(64);
            assert_eq!(kept, expected, "an oversized delivery keeps its first max_payload_bytes");
            assert_eq!(rejected[0].envelope().unwrap().headers().get("trace").map(String::as_str), Some("t-1"));
        }

        #[tokio::test]
        async fn a_rejected_delivery_is_replayed_once_its_handler_exists() {
            let Some(pool) = database("replay_rejected").await else { return };
            let without = builder(&pool).handler(run_job_fixed).build().await.unwrap();
            let broker = MemoryBroker::new();
            broker.publish(Envelope::new("test.other", "d-1", b"{}".to_vec()));
            broker.close();
            without.run(broker.source()).await.unwrap();
            let id = without.rejected().await.unwrap()[0].id;

            let error = without.replay_rejected(id, "ops", "retry").await.unwrap_err();
            assert!(matches!(error, Error::UnknownMessageType(_)), "{error}");
            without.discard_rejected(id, "ops", "not ours").await.unwrap();

            assert!(without.rejected().await.unwrap().is_empty());
            let error = without.discard_rejected(id, "ops", "twice").await.unwrap_err();
            assert!(matches!(error, Error::UnknownRejected(n) if n == id), "{error}");
        }

        #[tokio::test]
        async fn unknown_types_can_be_acknowledged_and_counted() {
            let Some(pool) = database("unknown_ack").await else { return };
            let inbox = builder(&pool)
                .unknown_types(inbox::UnknownTypes::Acknowledge)
                .handler(run_job)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            broker.publish(Envelope::new("test.other", "d-1", b"{}".to_vec()));
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!((report.unknown_acknowledged, report.rejected), (1, 0));
            assert_eq!(broker.acked(), 1);
            assert!(inbox.rejected().await.unwrap().is_empty());
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_failure_that_cannot_be_recorded_is_not_acknowledged() {
            let Some(pool) = database("unrecordable").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            let broker = MemoryBroker::new();
            broker.publish(envelope(&job("gated", "gated")));
            let stop = {
                let pool = pool.clone();
                async move {
                    $crate::common::eventually("the handler is running", || AT_GATE.load(Ordering::SeqCst)).await;
                    let closing = pool.clone();
                    tokio::spawn(async move { closing.close().await });
                    $crate::common::eventually("the pool refuses new connections", || pool.is_closed()).await;
                    GATE.notify_one();
                    // Its next try is due after 100 ms, 200 ms, ...: stop after a few.
                    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
                }
            };

            let report = inbox.run_until(broker.source(), stop).await.unwrap();

            assert_eq!(broker.acked(), 0, "{report:?}");
            assert_eq!(report.failed, 1, "handed back once, at shutdown: {report:?}");
            $crate::common::eventually("the delivery is queued again", || broker.redelivered() == 1).await;
        }

        /// A database out of reach says nothing about the message: the run keeps it and tries it
        /// again, however often its broker delivered it before, instead of keeping it as
        /// rejected (if the database took that) or handing it back to a broker that may drop
        /// what it delivered too often.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_database_out_of_reach_counts_no_attempt_against_the_message() {
            let Some(pool) = database("out_of_reach").await else { return };
            let inbox = inbox(&pool, quick(5)).await;
            pool.close().await;
            let settled = Arc::new(Mutex::new(Vec::new()));
            let source = crate::DeliveredBefore {
                envelope: Some(envelope(&job("held", "ok"))),
                attempt: 12,
                settled: Arc::clone(&settled),
            };
            let while_running = Arc::new(Mutex::new(Vec::new()));
            let stop = {
                let (settled, while_running) = (Arc::clone(&settled), Arc::clone(&while_running));
                async move {
                    // Tries after 100 ms, 200 ms, 400 ms: each fails, none settles it.
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    *while_running.lock().unwrap() = settled.lock().unwrap().clone();
                }
            };

            let report = inbox.run_until(source, stop).await.unwrap();

            assert_eq!(*while_running.lock().unwrap(), Vec::<&str>::new(), "{report:?}");
            assert_eq!(*settled.lock().unwrap(), vec!["nack"], "handed back at shutdown");
            assert_eq!(report.rejected, 0, "{report:?}");
        }
    };
}

common::on_every_backend!(failures_suite, batched);
