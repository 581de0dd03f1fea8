//! The guard on real databases: dedup, the sequence guard, rollback on handler errors, and
//! conflicting duplicates. Every test runs on SQLite and, when configured, on PostgreSQL.

mod common;

macro_rules! guard_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;

        use inbox::Error;
        use inbox::prelude::*;

        use $crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// Guards one `Credited` event through `credit`.
        async fn apply(
            pool: &Pool,
            event_id: &str,
            account: &str,
            sequence: i64,
            amount: i64,
        ) -> Outcome {
            let event = Credited::new(event_id, account, sequence, amount);
            credit.process(pool, event).await.expect("process")
        }

        /// Runs `process` of `message` from `tasks` concurrent tasks and counts the outcomes.
        async fn process_concurrently(
            pool: &Pool,
            messages: Vec<Credited>,
        ) -> BTreeMap<Outcome, usize> {
            let tasks: Vec<_> = messages
                .into_iter()
                .map(|message| {
                    let pool = pool.clone();
                    tokio::spawn(async move { credit.process(&pool, message).await })
                })
                .collect();
            let mut outcomes = BTreeMap::new();
            for task in tasks {
                let outcome = task.await.expect("task").expect("process");
                *outcomes.entry(outcome).or_default() += 1;
            }
            outcomes
        }

        #[tokio::test]
        async fn duplicate_delivery_has_one_effect() {
            let Some(pool) = ledger("duplicate_delivery").await else {
                return;
            };
            let paid = Credited::new("e-1", "acct", 1, 30);

            assert_eq!(
                credit.process(&pool, paid.clone()).await.unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                credit.process(&pool, paid.clone()).await.unwrap(),
                Outcome::Duplicate
            );
            assert_eq!(
                credit.process(&pool, paid).await.unwrap(),
                Outcome::Duplicate
            );

            assert_eq!(balance(&pool, "acct").await, 30);
            assert_eq!(count(&pool, "applied").await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_duplicates_have_one_effect() {
            let Some(pool) = ledger("concurrent_duplicates").await else {
                return;
            };
            let paid = Credited::new("e-1", "acct", 1, 30);

            let outcomes = process_concurrently(&pool, vec![paid; 16]).await;

            assert_eq!(outcomes.get(&Outcome::Processed), Some(&1), "{outcomes:?}");
            assert_eq!(outcomes.get(&Outcome::Duplicate), Some(&15), "{outcomes:?}");
            assert_eq!(balance(&pool, "acct").await, 30);
            assert_eq!(count(&pool, "applied").await, 1);
        }

        #[tokio::test]
        async fn stale_sequence_is_recorded_and_skipped() {
            let Some(pool) = ledger("stale_sequence").await else {
                return;
            };
            let second = Credited::new("e-2", "acct", 2, 20);
            let first = Credited::new("e-1", "acct", 1, 10);

            assert_eq!(
                credit.process(&pool, second).await.unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                credit.process(&pool, first.clone()).await.unwrap(),
                Outcome::Stale
            );
            assert_eq!(
                credit.process(&pool, first).await.unwrap(),
                Outcome::Duplicate
            );

            assert_eq!(balance(&pool, "acct").await, 20);
            assert_eq!(
                status(&pool, "credit", "e-1").await.as_deref(),
                Some("stale")
            );
            assert_eq!(last_sequence(&pool, "credit", "acct").await, Some(2));
        }

        /// Sequences start at 0: the first event of a new aggregate at 0 applies, like any
        /// other first event, on every database.
        #[tokio::test]
        async fn a_first_event_at_sequence_zero_applies() {
            let Some(pool) = ledger("sequence_zero").await else {
                return;
            };

            assert_eq!(apply(&pool, "e-0", "acct", 0, 1).await, Outcome::Processed);
            assert_eq!(apply(&pool, "e-1", "acct", 1, 2).await, Outcome::Processed);
            assert_eq!(apply(&pool, "e-9", "acct", 0, 4).await, Outcome::Stale);

            assert_eq!(balance(&pool, "acct").await, 3);
            assert_eq!(last_sequence(&pool, "credit", "acct").await, Some(1));
        }

        #[tokio::test]
        async fn equal_sequence_is_stale_and_gaps_are_allowed() {
            let Some(pool) = ledger("equal_sequence").await else {
                return;
            };

            assert_eq!(apply(&pool, "e-1", "acct", 5, 1).await, Outcome::Processed);
            assert_eq!(apply(&pool, "e-2", "acct", 5, 2).await, Outcome::Stale);
            assert_eq!(apply(&pool, "e-3", "acct", 9, 4).await, Outcome::Processed);

            assert_eq!(balance(&pool, "acct").await, 5);
            assert_eq!(last_sequence(&pool, "credit", "acct").await, Some(9));
        }

        #[tokio::test]
        async fn ids_and_aggregates_compare_byte_for_byte() {
            let Some(pool) = ledger("byte_for_byte").await else {
                return;
            };

            // Ids that differ in case or in trailing spaces are different messages.
            assert_eq!(apply(&pool, "e-1", "acct", 1, 1).await, Outcome::Processed);
            assert_eq!(apply(&pool, "e-1 ", "acct", 2, 2).await, Outcome::Processed);
            assert_eq!(apply(&pool, "E-1", "acct", 3, 4).await, Outcome::Processed);
            assert_eq!(
                apply(&pool, "e-1  ", "acct", 4, 8).await,
                Outcome::Processed
            );
            // So are aggregates: `acct ` has a stream of its own, at sequence 1.
            assert_eq!(
                apply(&pool, "e-2", "acct ", 1, 16).await,
                Outcome::Processed
            );
            assert_eq!(apply(&pool, "e-3", "ACCT", 1, 32).await, Outcome::Processed);

            assert_eq!(count(&pool, "applied").await, 6);
            assert_eq!(last_sequence(&pool, "credit", "acct").await, Some(4));
            assert_eq!(last_sequence(&pool, "credit", "acct ").await, Some(1));
            assert_eq!(last_sequence(&pool, "credit", "ACCT").await, Some(1));
            for id in ["e-1", "e-1 ", "E-1", "e-1  "] {
                assert_eq!(
                    status(&pool, "credit", id).await.as_deref(),
                    Some("processed"),
                    "{id:?}"
                );
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_first_events_of_a_new_aggregate_serialize() {
            let Some(pool) = ledger("concurrent_first_events").await else {
                return;
            };
            let accounts: Vec<String> = (0..40).map(|i| format!("acct-{i}")).collect();
            let messages = accounts
                .iter()
                .flat_map(|a| {
                    [
                        Credited::new(format!("{a}-1"), a, 1, 1),
                        Credited::new(format!("{a}-2"), a, 2, 10),
                    ]
                })
                .collect();

            let outcomes = process_concurrently(&pool, messages).await;

            assert_eq!(
                outcomes.get(&Outcome::Processed).copied().unwrap_or(0)
                    + outcomes.get(&Outcome::Stale).copied().unwrap_or(0),
                80,
                "{outcomes:?}"
            );
            for account in &accounts {
                let applied = applied(&pool, account).await;
                let sequences: Vec<i64> = applied.iter().map(|(sequence, _)| *sequence).collect();
                assert!(
                    sequences == [1, 2] || sequences == [2],
                    "{account} applied {sequences:?}"
                );
                let expected: i64 = sequences.iter().map(|s| if *s == 1 { 1 } else { 10 }).sum();
                assert_eq!(
                    balance(&pool, account).await,
                    expected,
                    "{account}: lost update"
                );
                assert_eq!(last_sequence(&pool, "credit", account).await, Some(2));
            }
        }

        #[tokio::test]
        async fn handler_error_rolls_back_and_redelivery_succeeds() {
            let Some(pool) = ledger("handler_error").await else {
                return;
            };
            freeze(&pool, "acct", true).await;
            let paid = Credited::new("e-1", "acct", 1, 30);

            let error = credit.process(&pool, paid.clone()).await.unwrap_err();
            assert!(
                matches!(
                    &error,
                    Error::Handler {
                        handler: "credit",
                        attempt: 1,
                        retry_after: Some(_),
                        ..
                    }
                ),
                "{error}"
            );
            assert!(
                error.to_string().contains("account acct is frozen"),
                "{error}"
            );
            assert_eq!(
                status(&pool, "credit", "e-1").await.as_deref(),
                Some("failed"),
                "a failed message is kept as failed, not seen"
            );
            assert_eq!(
                count(&pool, "applied").await,
                0,
                "the handler's writes must roll back"
            );
            assert_eq!(last_sequence(&pool, "credit", "acct").await, None);

            freeze(&pool, "acct", false).await;
            let early = credit.process(&pool, paid.clone()).await.unwrap_err();
            let Error::RetryNotDue { retry_after, .. } = early else {
                panic!("a redelivery before the backoff runs nothing: {early}");
            };
            assert!(
                retry_after > std::time::Duration::from_millis(500),
                "{retry_after:?}"
            );
            assert_eq!(count(&pool, "applied").await, 0);
            tokio::time::sleep(retry_after).await;
            assert_eq!(
                credit.process(&pool, paid).await.unwrap(),
                Outcome::Processed
            );
            assert_eq!(balance(&pool, "acct").await, 30);
            assert_eq!(
                status(&pool, "credit", "e-1").await.as_deref(),
                Some("processed")
            );
        }

        #[tokio::test]
        async fn conflicting_duplicate_is_not_applied() {
            let Some(pool) = ledger("conflicting_duplicate").await else {
                return;
            };

            assert_eq!(apply(&pool, "e-1", "acct", 1, 30).await, Outcome::Processed);
            assert_eq!(apply(&pool, "e-1", "acct", 1, 99).await, Outcome::Conflict);

            assert_eq!(balance(&pool, "acct").await, 30);
            assert_eq!(count(&pool, "applied").await, 1);
        }

        #[tokio::test]
        async fn handlers_have_their_own_dedup_scope() {
            let Some(pool) = ledger("own_dedup_scope").await else {
                return;
            };
            let paid = Credited::new("e-1", "acct", 1, 30);

            assert_eq!(
                credit.process(&pool, paid.clone()).await.unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                audit.process(&pool, paid.clone()).await.unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                audit.process(&pool, paid).await.unwrap(),
                Outcome::Duplicate
            );

            assert_eq!(count(&pool, "audit_log").await, 1);
            assert_eq!(balance(&pool, "acct").await, 30);
        }

        #[tokio::test]
        async fn oversized_and_empty_ids_are_refused_before_anything_is_written() {
            let Some(pool) = ledger("invalid_ids").await else {
                return;
            };
            let oversized = "x".repeat(inbox::MAX_ID_LEN + 1);

            let error = credit
                .process(&pool, Credited::new(oversized, "acct", 1, 1))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::InvalidIdentity {
                        what: "message id",
                        ..
                    }
                ),
                "{error}"
            );
            assert!(error.to_string().contains("the limit is 512"), "{error}");
            let error = credit
                .process(&pool, Credited::new("e-1", "", 1, 1))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::InvalidIdentity {
                        what: "aggregate id",
                        ..
                    }
                ),
                "{error}"
            );

            assert_eq!(count(&pool, "inbox_messages").await, 0);
            assert_eq!(count(&pool, "applied").await, 0);
        }

        #[tokio::test]
        async fn the_plain_function_stays_callable_unguarded() {
            let Some(pool) = ledger("plain_function").await else {
                return;
            };
            let paid = Credited::new("e-1", "acct", 1, 30);

            let mut tx = pool.begin().await.unwrap();
            credit(&mut tx, paid.clone()).await.unwrap();
            credit(&mut tx, paid).await.unwrap();
            tx.commit().await.unwrap();

            assert_eq!(
                balance(&pool, "acct").await,
                60,
                "unguarded calls apply every time"
            );
            assert_eq!(count(&pool, "inbox_messages").await, 0);
        }
    };
}

common::on_every_backend!(guard_suite);

/// Without the `mysql` feature the MySQL suites are not even built: say so, and fail in CI.
#[cfg(not(feature = "mysql"))]
#[test]
fn mysql_suites_are_built() {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI must run the MySQL tests: build them with `--all-features`");
    }
    common::skip::skip(
        "mysql_suites_are_built",
        "every MySQL suite is left out of this build (run `cargo test --workspace --all-features`)",
    );
}

/// SQLite specifics: durability settings, and a guarded transaction that holds the write lock from
/// its first statement.
mod sqlite_settings {
    use std::time::Duration;

    use inbox::Backend;
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::{ConnectOptions, Sqlite};

    #[tokio::test]
    async fn sqlite_options_choose_wal_full_sync_and_a_page_cache() {
        let pool = crate::common::sqlite("sqlite_pragmas").await.unwrap();
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await
            .unwrap();
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&pool)
            .await
            .unwrap();
        let cache: i64 = sqlx::query_scalar("PRAGMA cache_size")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(journal, "wal");
        assert_eq!(synchronous, 2, "2 is FULL");
        assert_eq!(cache, -65_536, "64 MiB, in KiB");
    }

    #[tokio::test]
    async fn guarded_transaction_takes_the_write_lock_up_front() {
        let pool = crate::common::sqlite("sqlite_immediate").await.unwrap();
        let guarded = Sqlite::begin(&pool).await.unwrap();

        let options: &SqliteConnectOptions = &pool.connect_options();
        let mut other = options
            .clone()
            .busy_timeout(Duration::ZERO)
            .connect()
            .await
            .unwrap();
        let error = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("locked"), "{error}");

        guarded.rollback().await.unwrap();
    }
}
