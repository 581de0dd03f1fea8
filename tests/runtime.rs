//! The runtime on real databases: registry and dispatch, the worker loop over an at-least-once
//! broker, redelivery, crashes between commit and ack, and graceful shutdown.

mod common;

macro_rules! runtime_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{BuildError, Error, MemoryBroker, RetryPolicy, RunReport, Source};

        use $crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        /// Panics on a negative amount, after writing: the panic must roll the write back.
        #[inbox_handler(key = "event_id", name = "explode")]
        async fn explode(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO audit_log (event_id, amount) VALUES ($1, $2)"))
                .bind(msg.event_id)
                .bind(msg.amount)
                .execute(&mut *tx)
                .await?;
            assert!(msg.amount >= 0, "negative amount {}", msg.amount);
            Ok(())
        }

        /// Retries at once, almost: the tests wait for redeliveries, not for backoff.
        fn eager_retries() -> RetryPolicy {
            RetryPolicy::new(100).backoff(Duration::from_millis(1), Duration::from_millis(5))
        }

        async fn billing(pool: &Pool, workers: usize) -> Inbox<$db> {
            builder(&pool)
                .consumer("billing")
                .workers(workers)
                .retry(eager_retries())
                .handler(credit)
                .build()
                .await
                .expect("build inbox")
        }

        fn envelope(event: &Credited) -> Envelope {
            Envelope::encode(format!("delivery-{}", event.event_id), event).expect("encode")
        }

        #[tokio::test]
        async fn dispatch_runs_every_handler_of_the_type() {
            let Some(pool) = ledger("dispatch_every_handler").await else { return };
            let inbox = builder(&pool).handler(credit).handler(audit).build().await.unwrap();
            let paid = envelope(&Credited::new("e-1", "acct", 1, 30));

            let first = inbox.dispatch(&paid).await.unwrap();
            let again = inbox.dispatch(&paid).await.unwrap();

            let outcomes = |handled: &[inbox::Handled]| handled.iter().map(|h| (h.handler, h.outcome)).collect::<Vec<_>>();
            assert_eq!(outcomes(&first), [("credit", Outcome::Processed), ("audit", Outcome::Processed)]);
            assert_eq!(outcomes(&again), [("credit", Outcome::Duplicate), ("audit", Outcome::Duplicate)]);
            assert_eq!(balance(&pool, "acct").await, 30);
            assert_eq!(count(&pool, "audit_log").await, 1);
        }

        #[tokio::test]
        async fn dispatch_of_one_handler_reads_as_its_outcome() {
            let Some(pool) = ledger("dispatch_one_outcome").await else { return };
            let inbox = builder(&pool).handler(credit).build().await.unwrap();
            let paid = envelope(&Credited::new("e-1", "acct", 1, 30));

            assert_eq!(inbox.dispatch(paid.clone()).await.unwrap(), Outcome::Processed);
            let again = inbox.dispatch(&paid).await.unwrap();
            assert_eq!(again.outcome(), Some(Outcome::Duplicate));
            assert_eq!(balance(&pool, "acct").await, 30);
        }

        /// The first event of new aggregates at sequence 0 applies, in a batch too.
        #[tokio::test]
        async fn first_events_at_sequence_zero_apply() {
            let Some(pool) = ledger("runtime_sequence_zero").await else { return };
            let inbox = billing(&pool, 1).await;
            let broker = MemoryBroker::new();
            for account in ["a", "b"] {
                broker.publish(envelope(&Credited::new(format!("{account}-0"), account, 0, 1)));
                broker.publish(envelope(&Credited::new(format!("{account}-1"), account, 1, 2)));
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(report.handler_calls_with(Outcome::Processed), 4, "{report:?}");
            assert_eq!((balance(&pool, "a").await, balance(&pool, "b").await), (3, 3));
        }

        #[tokio::test]
        async fn the_report_counts_deliveries_apart_from_handler_calls() {
            let Some(pool) = ledger("report_deliveries").await else { return };
            let inbox = builder(&pool).handler(credit).handler(audit).build().await.unwrap();
            let broker = MemoryBroker::new();
            for _ in 0..3 {
                broker.publish(envelope(&Credited::new("e-1", "acct", 1, 30)));
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(report.deliveries, 3, "{report:?}");
            let processed = (report.deliveries_with(Outcome::Processed), report.handler_calls_with(Outcome::Processed));
            let duplicates = (report.deliveries_with(Outcome::Duplicate), report.handler_calls_with(Outcome::Duplicate));
            assert_eq!(processed, (1, 2), "one delivery, two handlers: {report:?}");
            assert_eq!(duplicates, (2, 4), "two deliveries, two handlers each: {report:?}");
        }

        #[tokio::test]
        async fn registering_a_handler_twice_is_a_build_error() {
            let Some(pool) = ledger("register_twice").await else { return };

            let error = builder(&pool).handler(credit).handler(audit).handler(credit).build().await.err().unwrap();

            assert!(matches!(error, BuildError::DuplicateHandler { name: "credit", .. }), "{error}");
            assert!(error.to_string().contains("registered twice"), "{error}");
        }

        #[tokio::test]
        async fn unknown_type_and_undecodable_payloads_are_clear_errors() {
            let Some(pool) = ledger("bad_envelopes").await else { return };
            let inbox = billing(&pool, 1).await;

            let unknown = Envelope::new("order.refunded", "d-1", b"{}".to_vec());
            let error = inbox.dispatch(&unknown).await.unwrap_err();
            assert!(matches!(&error, Error::UnknownMessageType(t) if t == "order.refunded"), "{error}");

            let malformed = Envelope::new("test.credited", "d-2", b"{\"event_id\": ".to_vec());
            let error = inbox.dispatch(&malformed).await.unwrap_err();
            assert!(matches!(error, Error::Decode { .. }), "{error}");
            assert!(error.to_string().contains("cannot decode a `test.credited` payload"), "{error}");

            let wrong_types = br#"{"event_id": 7, "account": "a", "sequence": 1, "amount": 1}"#.to_vec();
            let error = inbox.dispatch(&Envelope::new("test.credited", "d-3", wrong_types)).await.unwrap_err();
            assert!(error.to_string().contains("invalid type: integer `7`, expected a string"), "{error}");

            assert_eq!(count(&pool, "inbox_messages").await, 0);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn run_keeps_each_aggregate_in_delivery_order() {
            let Some(pool) = ledger("run_in_order").await else { return };
            let inbox = billing(&pool, 4).await;
            let broker = MemoryBroker::new();
            let (accounts, per_account) = (30, 10);
            let mut published = 0;
            // Round-robin over accounts, so consecutive deliveries belong to different aggregates;
            // every third event is published twice, right after itself.
            for sequence in 1..=per_account {
                for account in 0..accounts {
                    let event = Credited::new(format!("{account}-{sequence}"), format!("acct-{account}"), sequence, sequence);
                    let copies = if (account + sequence) % 3 == 0 { 2 } else { 1 };
                    for _ in 0..copies {
                        broker.publish(envelope(&event));
                        published += 1;
                    }
                }
            }
            broker.close();

            let report: RunReport = inbox.run(broker.source()).await.unwrap();

            let distinct = (accounts * per_account) as u64;
            assert_eq!(report.handler_calls_with(Outcome::Processed), distinct, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Duplicate), published - distinct, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Stale), 0, "an aggregate's messages were reordered: {report:?}");
            assert_eq!(report.acked, published);
            assert_eq!(broker.acked(), published);
            for account in 0..accounts {
                let account = format!("acct-{account}");
                let sequences: Vec<i64> = applied(&pool, &account).await.into_iter().map(|(s, _)| s).collect();
                assert_eq!(sequences, (1..=per_account).collect::<Vec<_>>(), "{account}");
                assert_eq!(balance(&pool, &account).await, (1..=per_account).sum::<i64>());
                assert_eq!(last_sequence(&pool, "credit", &account).await, Some(per_account));
            }
        }

        /// Lets the handler of account `hold` go on, one message per permit.
        static HOLD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

        /// Credits, but waits for a [`HOLD`] permit on account `hold`, inside its transaction.
        #[inbox_handler(key = "event_id", aggregate = "account", name = "held")]
        async fn held(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            if msg.account == "hold" {
                HOLD.acquire().await.expect("the semaphore stays open").forget();
            }
            apply_credit(tx, &msg).await
        }

        #[tokio::test]
        async fn an_aggregate_that_is_held_up_holds_up_no_other() {
            if <$db as inbox::Backend>::DEFAULT_WORKERS == 1 {
                $crate::common::skip::skip("held_aggregate", "one writer at a time on this backend, so a held transaction holds up every other");
                return;
            }
            let Some(pool) = ledger("held_aggregate").await else { return };
            let inbox = builder(&pool).workers(2).handler(held).build().await.unwrap();
            let broker = MemoryBroker::new();
            broker.publish(envelope(&Credited::new("held-1", "hold", 1, 1)));
            let others = 40;
            for n in 0..others {
                broker.publish(envelope(&Credited::new(format!("other-{n}"), format!("acct-{n}"), 1, 1)));
            }
            // Batched, the messages that share the held one's batch wait with it; no other does.
            let batch_mates = $batch.map_or(0, |batch: inbox::Batch| batch.size() - 1) as i64;
            let others_done = async {
                while count(&pool, "applied").await < others - batch_mates {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                HOLD.add_permits(1);
            };

            let run = tokio::time::timeout(Duration::from_secs(20), inbox.run_until(broker.source(), others_done));

            let report = run.await.expect("the other aggregates waited behind the held one").unwrap();
            assert_eq!(report.handler_calls_with(Outcome::Processed), others as u64 + 1, "{report:?}");
            assert_eq!(balance(&pool, "hold").await, 1);
        }

        #[tokio::test]
        async fn failed_delivery_is_handed_back_and_redelivered_until_it_succeeds() {
            let Some(pool) = ledger("redelivery").await else { return };
            let inbox = billing(&pool, 2).await;
            freeze(&pool, "acct", true).await;
            let broker = MemoryBroker::new();
            broker.publish(envelope(&Credited::new("e-1", "acct", 1, 30)));
            broker.close();

            let run = tokio::spawn({
                let inbox = inbox.clone();
                let source = broker.source();
                async move { inbox.run(source).await }
            });
            $crate::common::eventually("the failing delivery came back three times", || broker.redelivered() >= 3).await;
            assert_eq!(status(&pool, "credit", "e-1").await.as_deref(), Some("failed"));
            freeze(&pool, "acct", false).await;
            let report = run.await.unwrap().unwrap();

            assert!(report.failed >= 3, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 1);
            assert_eq!(broker.acked(), 1);
            assert_eq!(balance(&pool, "acct").await, 30);
        }

        #[tokio::test]
        async fn a_panicking_handler_is_an_error_and_its_worker_lives_on() {
            let Some(pool) = ledger("handler_panic").await else { return };
            let inbox = builder(&pool).workers(1).retry(eager_retries()).handler(explode).build().await.unwrap();
            let poison = envelope(&Credited::new("bad", "acct", 1, -5));

            let error = inbox.dispatch(&poison).await.unwrap_err();
            assert!(matches!(error, Error::Handler { handler: "explode", .. }), "{error}");
            assert!(error.to_string().contains("handler panicked: negative amount -5"), "{error}");
            assert_eq!(count(&pool, "audit_log").await, 0, "the panic rolled the write back");

            let broker = MemoryBroker::new();
            broker.publish(poison);
            for i in 0..5 {
                broker.publish(envelope(&Credited::new(format!("good-{i}"), "acct", 1, 1)));
            }
            let stop = {
                let broker = broker.clone();
                async move { $crate::common::eventually("the good ones are done and the poison came back", || broker.acked() == 5 && broker.redelivered() >= 2).await }
            };
            let report = inbox.run_until(broker.source(), stop).await.unwrap();

            assert!(report.failed >= 2, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 5, "{report:?}");
            assert_eq!(count(&pool, "audit_log").await, 5);
            assert_eq!(status(&pool, "explode", "bad").await.as_deref(), Some("failed"), "kept for its next attempt");
        }

        #[tokio::test]
        async fn crash_between_commit_and_ack_redelivers_as_a_duplicate() {
            let Some(pool) = ledger("crash_before_ack").await else { return };
            let inbox = billing(&pool, 1).await;
            let broker = MemoryBroker::new();
            broker.publish(envelope(&Credited::new("e-1", "acct", 1, 30)));
            broker.close();
            let mut source = broker.source();

            let delivery = source.next().await.unwrap().unwrap();
            let handled = inbox.dispatch(delivery.envelope()).await.unwrap();
            assert_eq!(handled[0].outcome, Outcome::Processed);
            drop(delivery); // committed, then the process died before acknowledging
            assert_eq!(broker.redelivered(), 1);

            let report = inbox.run(source).await.unwrap();
            assert_eq!(report.handler_calls_with(Outcome::Duplicate), 1, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Processed), 0, "{report:?}");
            assert_eq!(broker.acked(), 1);
            assert_eq!(balance(&pool, "acct").await, 30);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_stops_pulling_and_settles_what_was_pulled() {
            let Some(pool) = ledger("graceful_shutdown").await else { return };
            let inbox = billing(&pool, 2).await;
            let broker = MemoryBroker::new();
            let total = 300;
            for i in 0..total {
                broker.publish(envelope(&Credited::new(format!("e-{i}"), format!("acct-{}", i % 7), i + 1, 1)));
            }

            let stop = {
                let broker = broker.clone();
                async move { $crate::common::eventually("some deliveries were acknowledged", || broker.acked() >= 20).await }
            };
            let report = inbox.run_until(broker.source(), stop).await.unwrap();

            assert_eq!(broker.in_flight(), 0, "every pulled delivery is settled");
            assert!(broker.queued() > 0, "shutdown stopped pulling before the end");
            assert_eq!(broker.acked() + broker.queued() as u64, total as u64);
            assert_eq!(report.acked, broker.acked());
            assert_eq!(count(&pool, "inbox_messages").await, broker.acked() as i64, "committed = acknowledged");
        }

        /// A run whose future is dropped (a `select!` with a signal, a timeout) leaves no worker
        /// behind holding a connection: each finishes what was queued and ends, so once the inbox
        /// is dropped too, the pool has every connection back.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_dropped_run_gives_its_connections_back() {
            let Some(pool) = ledger("dropped_run").await else { return };
            let inbox = billing(&pool, 4).await;
            let broker = MemoryBroker::new();
            for i in 0..200 {
                broker.publish(envelope(&Credited::new(format!("e-{i}"), format!("acct-{}", i % 9), i / 9 + 1, 1)));
            }
            let started = {
                let broker = broker.clone();
                async move { $crate::common::eventually("some deliveries were acknowledged", || broker.acked() >= 10).await }
            };

            tokio::select! {
                _ = inbox.run(broker.source()) => panic!("the run ended on its own"),
                () = started => {}
            }
            drop(inbox);

            $crate::common::eventually("every connection is back in the pool", || {
                pool.num_idle() == pool.size() as usize
            })
            .await;
        }

        #[tokio::test]
        async fn an_unroutable_delivery_is_kept_as_rejected_and_the_run_goes_on() {
            let Some(pool) = ledger("rejected_delivery").await else { return };
            let inbox = billing(&pool, 1).await;
            let broker = MemoryBroker::new();
            broker.publish(Envelope::new("order.refunded", "d-1", b"{\"id\": 1}".to_vec()));
            broker.publish(envelope(&Credited::new("e-1", "acct", 1, 30)));
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!((report.rejected, report.handler_calls_with(Outcome::Processed)), (1, 1), "{report:?}");
            assert_eq!(broker.acked(), 2, "kept, so acknowledged");
            let rejected = inbox.rejected().await.unwrap();
            assert_eq!(rejected.len(), 1);
            assert_eq!(rejected[0].payload, b"{\"id\": 1}");
            assert_eq!(rejected[0].reason, "no handler is registered for message type `order.refunded`");
        }

        #[tokio::test]
        async fn a_worker_keeps_its_connection_between_messages() {
            let Some(pool) = ledger("kept_connection").await else { return };
            let released = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = std::sync::Arc::clone(&released);
            let counting = sqlx::pool::PoolOptions::<$db>::new()
                .max_connections(4)
                .after_release(move |_, _| {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Box::pin(async { Ok(true) })
                })
                .connect_with((*pool.connect_options()).clone())
                .await
                .expect("connect a counting pool");
            let inbox = billing(&counting, 1).await;
            let broker = MemoryBroker::new();
            let messages = 120;
            for n in 0..messages {
                broker.publish(envelope(&Credited::new(format!("e-{n}"), format!("acct-{}", n % 7), n / 7 + 1, 1)));
            }
            broker.close();
            let before = released.load(std::sync::atomic::Ordering::Relaxed);

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(report.handler_calls_with(Outcome::Processed), messages as u64, "{report:?}");
            let released = released.load(std::sync::atomic::Ordering::Relaxed) - before;
            // One per sweep, purge and the worker's connection itself; one per message without it.
            assert!(released < 10, "{released} connections went back to the pool for {messages} messages");
        }
    };
}

common::on_every_backend!(runtime_suite, batched);

/// SQLite has one writer at a time: in batched mode the runtime's workers take turns at their
/// batches, rather than all beginning one and waiting in SQLite's busy handler, which sleeps
/// between tries (one message per transaction gathers nothing while it waits: its workers begin
/// their own).
mod one_writer {
    use std::time::Duration;

    use inbox::prelude::*;
    use inbox::{Batch, MemoryBroker};

    use crate::common::ledger::Credited;

    crate::common::ledger::ledger_handlers!(sqlx::Sqlite, sqlx::SqliteConnection);
    crate::common::queries::ledger_queries!(sqlx::Sqlite, crate::common::sqlite);

    /// With no busy timeout, a transaction begun while another writes fails at once ("database
    /// is locked"), and its delivery is handed back: none is, so no two workers wrote at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn workers_take_turns_at_their_batches() {
        let pool = ledger("one_writer").await.expect("SQLite");
        let options = (*pool.connect_options()).clone();
        let impatient = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(9)
            .connect_with(options.busy_timeout(Duration::ZERO));
        let impatient = impatient.await.expect("open SQLite");
        let inbox = crate::common::builder(&impatient, Some(Batch::new(4))).workers(8);
        let inbox = inbox.handler(credit).build().await.expect("build inbox");
        let broker = MemoryBroker::new();
        let messages = 400;
        for n in 0..messages {
            let event = Credited::new(format!("e-{n}"), format!("acct-{}", n % 40), n / 40 + 1, 1);
            let envelope = Envelope::encode(format!("delivery-{n}"), &event);
            broker.publish(envelope.expect("encode"));
        }
        broker.close();

        let report = inbox.run(broker.source()).await.expect("run");

        let processed = report.handler_calls_with(Outcome::Processed);
        assert_eq!(processed, messages as u64, "{report:?}");
        assert_eq!(report.failed, 0, "{report:?}");
    }
}

/// On PostgreSQL a message on its own commits in one round trip with the check that its handler
/// left the transaction able to commit, which leaves an empty transaction for the connection's
/// next statement to roll back.
mod postgres_idle {
    use std::time::{Duration, Instant};

    use inbox::MemoryBroker;
    use inbox::prelude::*;

    use crate::common::ledger::Credited;

    crate::common::ledger::ledger_handlers!(sqlx::Postgres, sqlx::PgConnection);
    crate::common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

    /// The connections of `application` that are idle in a transaction.
    async fn idle_in_transaction(pool: &Pool, application: &str) -> i64 {
        let open = "SELECT COUNT(*) FROM pg_stat_activity \
            WHERE application_name = $1 AND state = 'idle in transaction'";
        let open = sqlx::query_scalar(open).bind(application);
        open.fetch_one(pool).await.expect("read pg_stat_activity")
    }

    /// A worker that waits for work sends that rollback first: its connection waits idle, not
    /// idle in a transaction (which `idle_in_transaction_session_timeout` would end, and which
    /// monitoring flags).
    #[tokio::test]
    async fn a_worker_waiting_for_work_holds_no_transaction_open() {
        let Some(pool) = ledger("idle_worker").await else {
            return;
        };
        let application = crate::common::unique("idle_worker");
        let options = (*pool.connect_options()).clone();
        let named = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.application_name(&application));
        let named = named.await.expect("connect");
        let inbox = Inbox::builder(named)
            .consumer("idle")
            .workers(1)
            .handler(credit);
        let inbox = inbox.build().await.expect("build inbox");
        let broker = MemoryBroker::new();
        let event = Credited::new("e-1", "acct", 1, 5);
        broker.publish(Envelope::encode("delivery-1", &event).expect("encode"));
        let source = broker.source();
        let running = tokio::spawn(async move { inbox.run(source).await });

        let deadline = Instant::now() + Duration::from_secs(10);
        while balance(&pool, "acct").await != 5 {
            assert!(Instant::now() < deadline, "the message was not processed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let settled = Instant::now() + Duration::from_secs(2);
        while idle_in_transaction(&pool, &application).await > 0 {
            assert!(
                Instant::now() < settled,
                "a waiting worker holds a transaction open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        broker.close();
        let report = running.await.expect("run task").expect("run");
        assert_eq!(
            report.handler_calls_with(Outcome::Processed),
            1,
            "{report:?}"
        );
    }
}
