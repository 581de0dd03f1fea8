//! Retention on real databases: a purge deletes the dedup rows older than its window in batches
//! while live traffic goes on, and what operators resolved before it with the history of what is
//! gone; it keeps everything inside the window and every parked, dead or rejected message that
//! waits for an operator, and runs on one instance at a time.

mod common;

/// Rows older than any window these tests use.
const ANCIENT: &str = "2000-01-01 00:00:00";
/// Rows inside a window that reaches back to 2010.
const INSIDE: &str = "2020-01-01 00:00:00";

/// A window that keeps [`INSIDE`] rows and purges [`ANCIENT`] ones: back to 2010-01-01.
fn window_to_2010() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_262_304_000))
        .expect("the clock is past 2010")
}

macro_rules! retention_suite {
    ($db:ty, $conn:ty, $connect:path, $batch:expr) => {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        use inbox::prelude::*;
        use inbox::Retention;

        use super::{ANCIENT, INSIDE, window_to_2010};
        use crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        /// Inserts `rows` dedup rows of handler `credit` with ids `{prefix}-n`, in `status`, all
        /// received and settled at `at` (a thousand rows per statement).
        async fn seed(pool: &Pool, prefix: &str, rows: i64, status: &str, at: &str) {
            let mut tx = pool.begin().await.expect("begin seeding");
            let numbers: Vec<i64> = (1..=rows).collect();
            for chunk in numbers.chunks(1_000) {
                let mut insert = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO inbox_messages (consumer, handler, message_id, message_type, aggregate_id, \
                     sequence_number, status, payload_hash, payload) ",
                );
                insert.push_values(chunk, |mut row, &i| {
                    row.push("'default', 'credit'").push_bind(format!("{prefix}-{i}")).push("'test.credited'");
                    row.push_bind(format!("acct-{i}")).push_bind(i).push_bind(status.to_owned());
                    row.push_bind(vec![0_u8; 32]).push_bind(vec![0_u8; 32]);
                });
                insert.build().execute(&mut *tx).await.expect("seed dedup rows");
            }
            tx.commit().await.expect("commit the seeded rows");
            let at = format!("'{at}'");
            let backdate = [
                format!("UPDATE inbox_messages SET received_at = {at}, failed_at = {at} WHERE message_id LIKE $1"),
                format!("UPDATE inbox_messages SET processed_at = {at} WHERE message_id LIKE $1 AND status IN ('processed', 'stale')"),
            ];
            for update in backdate {
                sqlx::query($crate::common::sql::<$db>(&update))
                    .bind(format!("{prefix}-%"))
                    .execute(pool)
                    .await
                    .expect("backdate dedup rows");
            }
        }

        async fn rows(pool: &Pool, prefix: &str) -> i64 {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT COUNT(*) FROM inbox_messages WHERE message_id LIKE $1"))
                .bind(format!("{prefix}-%"))
                .fetch_one(pool)
                .await
                .expect("count rows")
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_purge_under_load_deletes_only_old_rows_in_batches_while_dispatch_goes_on() {
            let Some(pool) = ledger("purge_under_load").await else { return };
            seed(&pool, "old", 200_000, "processed", ANCIENT).await;
            seed(&pool, "stale", 1_000, "stale", ANCIENT).await;
            seed(&pool, "inside", 1_000, "processed", INSIDE).await;
            seed(&pool, "parked", 10, "parked", ANCIENT).await;
            seed(&pool, "dead", 10, "dead", ANCIENT).await;
            let inbox = builder(&pool).handler(credit).build().await.unwrap();
            let retention = Retention::new(window_to_2010()).batch_size(5_000);

            let preview = inbox::purge_preview(&pool, &retention).await.unwrap();
            assert_eq!((preview.purgeable, preview.parked, preview.dead), (201_000, 10, 10));

            let dispatched = Arc::new(AtomicU64::new(0));
            let purging = Arc::new(tokio::sync::Notify::new());
            let producer = tokio::spawn({
                let (inbox, dispatched, purging) = (inbox.clone(), dispatched.clone(), purging.clone());
                async move {
                    let done = purging.notified();
                    tokio::pin!(done);
                    for n in 0.. {
                        let event = Credited::new(format!("live-{n}"), format!("live-{}", n % 7), n, 1);
                        let envelope = Envelope::encode(format!("d-{n}"), &event).unwrap();
                        tokio::select! {
                            () = &mut done => return,
                            handled = inbox.dispatch(&envelope) => handled.expect("live traffic is handled"),
                        };
                        dispatched.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            crate::common::eventually("live traffic flows", || dispatched.load(Ordering::SeqCst) > 10).await;
            let before = dispatched.load(Ordering::SeqCst);
            let report = inbox::purge(&pool, &retention).await.unwrap();
            let during = dispatched.load(Ordering::SeqCst) - before;
            purging.notify_one();
            producer.await.unwrap();

            assert!(report.led);
            assert_eq!(report.purged, 201_000, "{report:?}");
            assert!(report.batches >= 201_000 / 5_000, "small batches, each its own transaction: {report:?}");
            assert!(during >= report.batches / 2, "dispatch went on during the purge: {during} in {} batches", report.batches);
            assert_eq!((report.kept_parked, report.kept_dead), (10, 10), "parked and dead are never purged by age");
            for (prefix, left) in [("old", 0), ("stale", 0), ("inside", 1_000), ("parked", 10), ("dead", 10)] {
                assert_eq!(rows(&pool, prefix).await, left, "{prefix} rows left");
            }
        }

        #[tokio::test]
        async fn a_purged_message_is_no_duplicate_but_its_stream_still_makes_it_stale() {
            let Some(pool) = ledger("purge_then_redeliver").await else { return };
            let event = Credited::new("e-1", "acct", 1, 5);
            assert_eq!(credit.process(&pool, event.clone()).await.unwrap(), Outcome::Processed);
            sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE inbox_messages SET processed_at = '{ANCIENT}'")))
                .execute(&pool)
                .await
                .unwrap();

            let report = inbox::purge(&pool, &Retention::new(window_to_2010())).await.unwrap();

            assert_eq!(report.purged, 1);
            assert_eq!(credit.process(&pool, event).await.unwrap(), Outcome::Stale, "the stream row outlives the purge");
            assert_eq!(balance(&pool, "acct").await, 5);
        }

        /// Runs each statement (no parameters), for backdating.
        async fn run_all(pool: &Pool, statements: &[String]) {
            for statement in statements {
                sqlx::query(sqlx::AssertSqlSafe(statement.clone())).execute(pool).await.expect(statement);
            }
        }

        async fn rows_of(pool: &Pool, query: &'static str) -> i64 {
            sqlx::query_scalar(query).fetch_one(pool).await.expect(query)
        }

        #[tokio::test]
        async fn a_purge_deletes_what_operators_resolved_before_the_window_and_keeps_what_waits() {
            let Some(pool) = ledger("purge_resolved").await else { return };
            seed(&pool, "dead", 3, "dead", ANCIENT).await;
            let inbox = builder(&pool).handler(credit).build().await.unwrap();
            for dead in ["dead-1", "dead-2"] {
                inbox.discard("credit", dead, "ops", "refunded by hand").await.unwrap();
            }
            let broker = inbox::MemoryBroker::new();
            for n in 1..=3 {
                broker.publish(Envelope::new("test.unknown", format!("u-{n}"), b"{}".to_vec()));
            }
            broker.close();
            inbox.run(broker.source()).await.unwrap();
            let rejected = inbox.rejected().await.unwrap();
            inbox.discard_rejected(rejected[0].id, "ops", "not ours").await.unwrap();
            // u-3's replay is asked for, not done yet: it still waits.
            let replay = inbox::storage::operators::Operator { by: "ops", reason: "its handler ships" };
            let asked = inbox::storage::operators::request_rejected_replay(&pool, inbox.consumer(), rejected[2].id, replay);
            assert!(asked.await.unwrap());
            for (id, sequence, amount) in [("e-1", 1, 5), ("e-1", 1, 6), ("e-2", 2, 5), ("e-2", 2, 6)] {
                credit.process(&pool, Credited::new(id, "acct", sequence, amount)).await.unwrap();
            }
            let conflict = inbox::storage::operators::conflicts(&pool, None).await.unwrap()[0].id;
            let operator = inbox::storage::operators::Operator { by: "ops", reason: "a bad producer" };
            assert!(inbox::storage::operators::discard_conflict(&pool, conflict, operator).await.unwrap());
            // Everything long ago, except dead-2's discard (its action too is long ago).
            let at = format!("'{ANCIENT}'");
            run_all(&pool, &[
                format!("UPDATE inbox_messages SET resolved_at = {at} WHERE message_id = 'dead-1'"),
                format!("UPDATE inbox_rejected SET received_at = {at}"),
                format!("UPDATE inbox_rejected SET resolved_at = {at} WHERE resolution IS NOT NULL"),
                format!("UPDATE inbox_conflicts SET resolved_at = {at} WHERE resolution IS NOT NULL"),
                format!("UPDATE inbox_actions SET performed_at = {at}"),
            ]).await;
            let retention = Retention::new(window_to_2010());

            let preview = inbox::purge_preview(&pool, &retention).await.unwrap();
            let report = inbox::purge(&pool, &retention).await.unwrap();

            assert_eq!((preview.resolved, preview.rejected, preview.dead), (3, 2, 1), "{preview:?}");
            assert_eq!((report.resolved, report.actions), (3, 2), "dead-1, u-1 and a conflict, with their actions: {report:?}");
            assert_eq!((report.kept_dead, report.kept_rejected), (1, 2), "{report:?}");
            let left = [
                rows(&pool, "dead").await,
                rows_of(&pool, "SELECT COUNT(*) FROM inbox_rejected").await,
                rows_of(&pool, "SELECT COUNT(*) FROM inbox_conflicts").await,
                rows_of(&pool, "SELECT COUNT(*) FROM inbox_actions").await,
            ];
            assert_eq!(left, [2, 2, 1, 2], "dead-2 (discarded inside the window) and its action, dead-3, u-2, u-3 and its action, e-2's conflict");
            assert_eq!(status(&pool, "credit", "dead-2").await.as_deref(), Some("discarded"));
            let kept: Vec<String> = sqlx::query_scalar("SELECT delivery_id FROM inbox_rejected ORDER BY delivery_id").fetch_all(&pool).await.unwrap();
            assert_eq!(kept, ["u-2", "u-3"], "u-3's replay was asked for, not done");
            assert_eq!(inbox::storage::operators::conflicts(&pool, None).await.unwrap()[0].message_id, "e-2");
        }

        #[tokio::test]
        async fn an_inbox_purges_with_its_configured_retention_only() {
            let Some(pool) = ledger("inbox_purge").await else { return };
            seed(&pool, "old", 20, "processed", ANCIENT).await;
            let without = builder(&pool).handler(credit).build().await.unwrap();
            assert_eq!(without.purge().await.unwrap().purged, 0, "no retention configured");

            let retention = Retention::new(window_to_2010()).batch_size(8);
            let with = builder(&pool).handler(credit).retention(retention).build().await.unwrap();
            let report = with.purge().await.unwrap();

            assert_eq!((report.purged, report.batches), (20, 3));
            assert_eq!(rows(&pool, "old").await, 0);
        }

        #[tokio::test]
        async fn a_running_inbox_purges_on_its_schedule() {
            let Some(pool) = ledger("scheduled_purge").await else { return };
            seed(&pool, "old", 20, "processed", ANCIENT).await;
            let retention = Retention::new(window_to_2010()).every(std::time::Duration::from_millis(20));
            let inbox = builder(&pool).handler(credit).retention(retention).build().await.unwrap();
            let broker = inbox::MemoryBroker::new();
            let purged = async {
                while rows(&pool, "old").await > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            };

            let run = tokio::time::timeout(std::time::Duration::from_secs(30), inbox.run_until(broker.source(), purged));

            run.await.expect("the run purges the old rows").unwrap();
        }
    };
}

/// For a backend whose purge leader holds a server lock (PostgreSQL's advisory lock, MySQL's
/// `GET_LOCK`; SQLite has one writer anyway). Expands inside a module that ran `retention_suite!`.
macro_rules! purge_leader_case {
    () => {
        #[tokio::test]
        async fn one_instance_purges_at_a_time() {
            let Some(pool) = ledger("purge_leader").await else {
                return;
            };
            seed(&pool, "old", 100, "processed", ANCIENT).await;
            let retention = Retention::new(window_to_2010());
            let elsewhere = second_pool(&pool).await;
            let leader = inbox::storage::purge::lead_purge(&elsewhere)
                .await
                .unwrap()
                .expect("nobody else is purging");

            let report = inbox::purge(&pool, &retention).await.unwrap();
            assert!(!report.led, "another instance holds the lock: {report:?}");
            assert_eq!(rows(&pool, "old").await, 100);

            leader.step_down().await.unwrap();
            let report = inbox::purge(&pool, &retention).await.unwrap();
            assert!(report.led);
            assert_eq!(rows(&pool, "old").await, 0);
        }
    };
}

mod sqlite {
    retention_suite!(
        sqlx::Sqlite,
        sqlx::SqliteConnection,
        crate::common::sqlite,
        None
    );
}

mod postgres {
    retention_suite!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::common::postgres,
        None
    );
    purge_leader_case!();
}

#[cfg(feature = "mysql")]
mod mysql {
    retention_suite!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        crate::common::mysql,
        None
    );
    purge_leader_case!();
}
