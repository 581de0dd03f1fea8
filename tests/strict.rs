//! Strict ordering on real databases: parking, release in order, crashes in the middle of a
//! release chain, two processes on one database, gap timeouts and skipping a gap. Every test runs
//! on SQLite and, when configured, on PostgreSQL and MySQL.

mod common;

macro_rules! strict_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{Error, MemoryBroker, RunReport};

        use $crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        fn event(account: &str, sequence: i64) -> Credited {
            Credited::new(format!("{account}-{sequence}"), account, sequence, sequence)
        }

        async fn strict(pool: &Pool, account: &str, sequence: i64) -> Outcome {
            credit_strict.process(pool, event(account, sequence)).await.expect("process")
        }

        async fn inbox(pool: &Pool) -> Inbox<$db> {
            builder(&pool)
                .handler(credit_strict)
                .build()
                .await
                .expect("build inbox")
        }

        #[tokio::test]
        async fn consuming_does_not_wait_for_the_first_sweep() {
            if <$db as inbox::Backend>::DEFAULT_WORKERS == 1 {
                $crate::common::skip::skip("first_sweep_beside", "one writer at a time on this backend, so a held stream lock holds up every write");
                return;
            }
            let Some(pool) = ledger("first_sweep_beside").await else { return };
            assert_eq!(strict(&pool, "crashed", 1).await, Outcome::Processed);
            assert_eq!(strict(&pool, "crashed", 3).await, Outcome::Parked);
            // #2 applied, and the process died before releasing #3: the first sweep releases it.
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_streams SET last_sequence = 2 WHERE aggregate_id = 'crashed'")).execute(&pool).await.unwrap();
            // Someone holds the stream (at the guard's isolation: on MySQL, REPEATABLE READ would
            // gap-lock the new stream too): the first sweep waits for it.
            let mut holder = <$db as inbox::Backend>::begin(&pool).await.unwrap();
            sqlx::query($crate::common::sql::<$db>("SELECT last_sequence FROM inbox_streams WHERE aggregate_id = 'crashed' FOR UPDATE")).fetch_one(&mut *holder).await.unwrap();
            let inbox = builder(&pool).workers(2).handler(credit_strict).build().await.unwrap();
            let broker = inbox::MemoryBroker::new();
            broker.publish(Envelope::encode("d-1", &event("live", 1)).unwrap());
            broker.close();
            let run = tokio::spawn({
                let (inbox, source) = (inbox.clone(), broker.source());
                async move { inbox.run(source).await }
            });

            let consumed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while balance(&pool, "live").await == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            });
            consumed.await.expect("the delivery waited for the first sweep");
            holder.rollback().await.unwrap();
            let report = run.await.unwrap().unwrap();

            assert_eq!(report.handler_calls_with(Outcome::Released), 1, "{report:?}");
            assert_eq!(balance(&pool, "crashed").await, 1 + 3);
        }

        /// Makes every failed message's retry due now, as if its backoff had passed.
        async fn due_now(pool: &Pool) {
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET retry_at_ms = 0 WHERE status = 'failed'")).execute(pool).await.unwrap();
        }

        async fn sequences(pool: &Pool, account: &str) -> Vec<i64> {
            applied(pool, account).await.into_iter().map(|(sequence, _)| sequence).collect()
        }

        /// `accounts` × `per_account` contiguous events, three of every seven delivered twice (30%
        /// of the deliveries are duplicates), shuffled.
        fn shuffled_stream(accounts: usize, per_account: i64, seed: u64) -> (Vec<Credited>, usize) {
            let mut stream = Vec::new();
            let mut distinct = 0;
            for account in 0..accounts {
                for sequence in 1..=per_account {
                    let event = event(&format!("acct-{account}"), sequence);
                    distinct += 1;
                    if distinct % 7 < 3 {
                        stream.push(event.clone());
                    }
                    stream.push(event);
                }
            }
            let duplicates = stream.len() - distinct;
            let percent = (duplicates * 100 + stream.len() / 2) / stream.len();
            assert_eq!(percent, 30, "{duplicates} duplicates of {} deliveries", stream.len());
            $crate::common::shuffle(&mut stream, seed);
            (stream, distinct)
        }

        fn publish(broker: &MemoryBroker, stream: &[Credited]) {
            for (n, event) in stream.iter().enumerate() {
                broker.publish(Envelope::encode(format!("delivery-{n}"), event).expect("encode"));
            }
            broker.close();
        }

        /// Every account applied 1..=per_account exactly once, in order, and nothing is parked.
        async fn assert_in_order_fold(pool: &Pool, accounts: usize, per_account: i64) {
            for account in 0..accounts {
                let account = format!("acct-{account}");
                let expected: Vec<i64> = (1..=per_account).collect();
                assert_eq!(sequences(pool, &account).await, expected, "{account}");
                assert_eq!(balance(pool, &account).await, expected.iter().sum::<i64>(), "{account}");
            }
            let parked: i64 = sqlx::query_scalar($crate::common::sql::<$db>("SELECT COUNT(*) FROM inbox_messages WHERE status = 'parked'"))
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(parked, 0, "nothing is left parked");
        }

        #[tokio::test]
        async fn a_message_ahead_of_its_predecessor_is_parked_then_released() {
            let Some(pool) = ledger("park_release").await else { return };

            assert_eq!(strict(&pool, "acct", 3).await, Outcome::Parked);
            assert_eq!(strict(&pool, "acct", 2).await, Outcome::Parked);
            assert_eq!(strict(&pool, "acct", 3).await, Outcome::Duplicate, "a parked message is not parked twice");
            assert!(sequences(&pool, "acct").await.is_empty(), "parked messages do not run");
            assert_eq!(status(&pool, "credit_strict", "acct-3").await.as_deref(), Some("parked"));

            assert_eq!(strict(&pool, "acct", 1).await, Outcome::Processed);

            assert_eq!(sequences(&pool, "acct").await, [1, 2, 3]);
            assert_eq!(balance(&pool, "acct").await, 6);
            assert_eq!(status(&pool, "credit_strict", "acct-3").await.as_deref(), Some("processed"));
            assert_eq!(last_sequence(&pool, "credit_strict", "acct").await, Some(3));
        }

        /// Delivered 2, 1, 3 (in one batch, in batched mode): 2 is parked, 1 applies and
        /// releases it, and 3 then finds 2 applied, as one message per transaction would.
        #[tokio::test]
        async fn the_message_after_a_release_applies_in_its_own_turn() {
            let Some(pool) = ledger("after_release").await else { return };
            let broker = MemoryBroker::new();
            publish(&broker, &[event("acct", 2), event("acct", 1), event("acct", 3)]);

            let report: RunReport = inbox(&pool).await.run(broker.source()).await.unwrap();

            let outcomes = [Outcome::Parked, Outcome::Processed, Outcome::Released];
            let counts = outcomes.map(|outcome| report.handler_calls_with(outcome));
            assert_eq!(counts, [1, 2, 1], "{report:?}");
            assert_eq!(sequences(&pool, "acct").await, [1, 2, 3]);
        }

        #[tokio::test]
        async fn a_failing_message_is_not_overtaken_while_it_waits_for_its_retry() {
            let Some(pool) = ledger("strict_retry").await else { return };
            let inbox = inbox(&pool).await;
            let delivery = |sequence| Envelope::encode(format!("d-{sequence}"), &event("acct", sequence)).unwrap();
            sqlx::query($crate::common::sql::<$db>("INSERT INTO crash_points (account, sequence) VALUES ('acct', 1)")).execute(&pool).await.unwrap();

            let error = inbox.dispatch(&delivery(1)).await.unwrap_err();
            assert!(matches!(error, Error::Handler { retry_after: Some(_), .. }), "{error}");
            for sequence in [2, 3] {
                assert_eq!(inbox.dispatch(&delivery(sequence)).await.unwrap()[0].outcome, Outcome::Parked);
            }
            sqlx::query($crate::common::sql::<$db>("DELETE FROM crash_points")).execute(&pool).await.unwrap();
            let early = inbox.dispatch(&delivery(1)).await.unwrap_err();
            let Error::RetryNotDue { retry_after, .. } = early else { panic!("{early}") };
            tokio::time::sleep(retry_after).await;
            let retried = inbox.dispatch(&delivery(1)).await.unwrap();

            assert_eq!((retried[0].outcome, retried[0].released), (Outcome::Processed, 2));
            assert_eq!(sequences(&pool, "acct").await, [1, 2, 3]);
        }

        /// `process()` has no runtime whose sweep would release what a delivery leaves parked:
        /// it applies the whole chain its message unblocks, past what one delivery releases.
        #[tokio::test]
        async fn process_applies_a_whole_chain_however_long() {
            let Some(pool) = ledger("whole_chain").await else { return };
            let last = i64::from(inbox::RELEASES_PER_MESSAGE) + 20;
            for sequence in 2..=last {
                assert_eq!(strict(&pool, "acct", sequence).await, Outcome::Parked);
            }

            assert_eq!(strict(&pool, "acct", 1).await, Outcome::Processed);

            assert_eq!(sequences(&pool, "acct").await, (1..=last).collect::<Vec<_>>());
        }

        #[tokio::test]
        async fn strict_skips_what_already_applied() {
            let Some(pool) = ledger("strict_stale").await else { return };
            strict(&pool, "acct", 1).await;
            strict(&pool, "acct", 2).await;

            let twin = Credited::new("acct-2-twin", "acct", 2, 100);
            assert_eq!(credit_strict.process(&pool, twin).await.unwrap(), Outcome::Stale);

            assert_eq!(balance(&pool, "acct").await, 3);
        }

        #[tokio::test]
        async fn a_parked_twin_of_a_released_sequence_is_settled_stale() {
            let Some(pool) = ledger("parked_twin").await else { return };
            let twin = Credited::new("acct-2-twin", "acct", 2, 100);
            assert_eq!(strict(&pool, "acct", 2).await, Outcome::Parked);
            assert_eq!(credit_strict.process(&pool, twin).await.unwrap(), Outcome::Parked);

            assert_eq!(strict(&pool, "acct", 1).await, Outcome::Processed);

            assert_eq!(sequences(&pool, "acct").await, [1, 2]);
            assert_eq!(status(&pool, "credit_strict", "acct-2-twin").await.as_deref(), Some("stale"));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn shuffled_duplicated_stream_folds_in_order() {
            let Some(pool) = ledger("strict_shuffled").await else { return };
            let (accounts, per_account) = (200, 20);
            let (stream, distinct) = shuffled_stream(accounts, per_account, 2024);
            let broker = MemoryBroker::new();
            publish(&broker, &stream);

            let report: RunReport = inbox(&pool).await.run(broker.source()).await.unwrap();

            let applied = report.handler_calls_with(Outcome::Processed) + report.handler_calls_with(Outcome::Released);
            assert_eq!(applied, distinct as u64, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Duplicate), (stream.len() - distinct) as u64, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Stale), 0, "{report:?}");
            assert!(report.handler_calls_with(Outcome::Parked) > 0, "the stream was out of order: {report:?}");
            assert_eq!(broker.acked(), stream.len() as u64);
            assert_in_order_fold(&pool, accounts, per_account).await;
        }

        #[tokio::test]
        async fn a_release_chain_cut_by_a_crash_resumes_on_the_next_run() {
            let Some(pool) = ledger("crash_in_chain").await else { return };
            for sequence in [2, 3, 4] {
                assert_eq!(strict(&pool, "acct", sequence).await, Outcome::Parked);
            }
            sqlx::query($crate::common::sql::<$db>("INSERT INTO crash_points (account, sequence) VALUES ('acct', 3)")).execute(&pool).await.unwrap();

            assert_eq!(strict(&pool, "acct", 1).await, Outcome::Processed);
            assert_eq!(sequences(&pool, "acct").await, [1, 2], "the chain stopped between 2 and 3");
            assert_eq!(status(&pool, "credit_strict", "acct-3").await.as_deref(), Some("failed"), "a failed release is recorded");
            assert_eq!(status(&pool, "credit_strict", "acct-4").await.as_deref(), Some("parked"));

            sqlx::query($crate::common::sql::<$db>("DELETE FROM crash_points")).execute(&pool).await.unwrap();
            due_now(&pool).await;
            let restarted = inbox(&pool).await;
            let broker = MemoryBroker::new();
            broker.close();
            let report = restarted.run(broker.source()).await.unwrap();

            assert_eq!(report.replayed, 1, "#3 is retried from the store, and releases #4: {report:?}");
            assert_eq!(sequences(&pool, "acct").await, [1, 2, 3, 4], "{report:?}");
            assert_eq!(balance(&pool, "acct").await, 10);
            assert!(restarted.parked().await.unwrap().is_empty());
        }

        #[tokio::test]
        async fn the_next_delivery_for_the_aggregate_resumes_a_cut_chain() {
            let Some(pool) = ledger("resume_on_delivery").await else { return };
            for sequence in [2, 3] {
                strict(&pool, "acct", sequence).await;
            }
            sqlx::query($crate::common::sql::<$db>("INSERT INTO crash_points (account, sequence) VALUES ('acct', 2)")).execute(&pool).await.unwrap();
            strict(&pool, "acct", 1).await;
            assert_eq!(sequences(&pool, "acct").await, [1]);
            sqlx::query($crate::common::sql::<$db>("DELETE FROM crash_points")).execute(&pool).await.unwrap();
            // A release cut by a crash (not a failure) leaves #2 parked behind an applied #1.
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET status = 'parked' WHERE message_id = 'acct-2'")).execute(&pool).await.unwrap();

            let handled = inbox(&pool).await.dispatch(&Envelope::encode("again", &event("acct", 1)).unwrap()).await.unwrap();

            assert_eq!((handled[0].outcome, handled[0].released), (Outcome::Duplicate, 2));
            assert_eq!(sequences(&pool, "acct").await, [1, 2, 3]);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn two_processes_on_one_database_apply_each_aggregate_in_order() {
            let Some(pool) = ledger("two_processes").await else { return };
            let (accounts, per_account) = (100, 20);
            let (stream, distinct) = shuffled_stream(accounts, per_account, 77);
            let broker = MemoryBroker::new();
            publish(&broker, &stream);
            let first = inbox(&pool).await;
            let second = inbox(&second_pool(&pool).await).await;

            let (a, b) = tokio::join!(first.run(broker.source()), second.run(broker.source()));

            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(a.acked > 0 && b.acked > 0, "both processes took deliveries: {a:?} {b:?}");
            let applied: u64 = [&a, &b].iter().map(|r| r.handler_calls_with(Outcome::Processed) + r.handler_calls_with(Outcome::Released)).sum();
            assert_eq!(applied, distinct as u64);
            assert_in_order_fold(&pool, accounts, per_account).await;
        }

        #[tokio::test]
        async fn a_gap_that_never_fills_times_out_naming_the_missing_sequence() {
            let Some(pool) = ledger("gap_timeout").await else { return };
            for sequence in [1, 3, 4] {
                strict(&pool, "stuck", sequence).await;
            }
            strict(&pool, "fresh", 2).await;
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00' WHERE aggregate_id = 'stuck'"))
                .execute(&pool)
                .await
                .unwrap();
            let inbox = inbox(&pool).await;

            let expired = inbox.expire_gaps().await.unwrap();

            assert_eq!(expired.len(), 1, "{expired:?}");
            let (handler, gap) = &expired[0];
            assert_eq!((*handler, gap.aggregate.as_str(), gap.missing_sequence, gap.messages), ("credit_strict", "stuck", 2, 2));
            let dead: Vec<_> = inbox.dead().await.unwrap().into_iter().map(|m| (m.message_id, m.error_text)).collect();
            let reason = Some("gap timeout at sequence 2".to_owned());
            assert_eq!(dead, [("stuck-3".to_owned(), reason.clone()), ("stuck-4".to_owned(), reason)]);
            let parked: Vec<_> = inbox.parked().await.unwrap().into_iter().map(|m| m.message_id).collect();
            assert_eq!(parked, ["fresh-2"], "a gap within its timeout stays parked");

            assert_eq!(strict(&pool, "stuck", 2).await, Outcome::Processed);
            assert_eq!(sequences(&pool, "stuck").await, [1, 2], "dead messages are not released");
        }

        #[tokio::test]
        async fn expiry_leaves_a_message_that_can_apply_alone() {
            let Some(pool) = ledger("expiry_spares_ready").await else { return };
            strict(&pool, "acct", 2).await;
            sqlx::query($crate::common::sql::<$db>("INSERT INTO crash_points (account, sequence) VALUES ('acct', 2)")).execute(&pool).await.unwrap();
            assert_eq!(strict(&pool, "acct", 1).await, Outcome::Processed);
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();
            let inbox = inbox(&pool).await;

            assert_eq!(inbox.expire_gaps().await.unwrap(), [], "#2 is not behind a gap: its release failed");
            assert_eq!(status(&pool, "credit_strict", "acct-2").await.as_deref(), Some("failed"));
            sqlx::query($crate::common::sql::<$db>("DELETE FROM crash_points")).execute(&pool).await.unwrap();
            due_now(&pool).await;
            assert_eq!(inbox.replay_requested().await.unwrap(), 1, "a failed release is retried from the store");

            assert_eq!(sequences(&pool, "acct").await, [1, 2]);
        }

        #[tokio::test]
        async fn skipping_a_timed_out_gap_brings_its_messages_back() {
            let Some(pool) = ledger("skip_dead_gap").await else { return };
            for sequence in [1, 3, 4] {
                strict(&pool, "acct", sequence).await;
            }
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();
            let inbox = inbox(&pool).await;
            assert_eq!(inbox.expire_gaps().await.unwrap().len(), 1);

            assert_eq!(inbox.skip_gap("credit_strict", "acct").await.unwrap(), 2);

            assert_eq!(sequences(&pool, "acct").await, [1, 3, 4]);
            assert!(inbox.dead().await.unwrap().is_empty());
        }

        #[tokio::test]
        async fn strict_sequences_start_at_one() {
            let Some(pool) = ledger("strict_from_one").await else { return };

            let error = credit_strict.process(&pool, event("acct", 0)).await.unwrap_err();

            assert!(matches!(error, Error::InvalidIdentity { what: "sequence", .. }), "{error}");
            assert!(error.to_string().contains("it is 0; sequences run from 1"), "{error}");
        }

        #[tokio::test]
        async fn the_runtime_expires_gaps_while_it_runs() {
            let Some(pool) = ledger("gap_sweeper").await else { return };
            let inbox = builder(&pool).handler(credit_quick_gap).build().await.unwrap();
            let parked = inbox.dispatch(&Envelope::encode("d-1", &event("stuck", 2)).unwrap()).await.unwrap();
            assert_eq!(parked[0].outcome, Outcome::Parked);
            sqlx::query($crate::common::sql::<$db>("UPDATE inbox_messages SET received_at = '2000-01-01 00:00:00'")).execute(&pool).await.unwrap();
            let broker = MemoryBroker::new();

            let stop = {
                let inbox = inbox.clone();
                async move {
                    while inbox.dead().await.unwrap().is_empty() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            let report = tokio::time::timeout(Duration::from_secs(30), inbox.run_until(broker.source(), stop))
                .await
                .expect("the sweeper expires the gap")
                .unwrap();

            assert_eq!(report.gap_expired, 1, "{report:?}");
            assert_eq!(inbox.dead().await.unwrap()[0].error_text.as_deref(), Some("gap timeout at sequence 1"));
        }

        #[tokio::test]
        async fn an_operator_can_skip_a_gap() {
            let Some(pool) = ledger("skip_gap").await else { return };
            for sequence in [1, 3, 4] {
                strict(&pool, "acct", sequence).await;
            }
            let inbox = inbox(&pool).await;

            assert_eq!(inbox.skip_gap("credit_strict", "acct").await.unwrap(), 2);
            assert_eq!(inbox.skip_gap("credit_strict", "acct").await.unwrap(), 0, "nothing is parked any more");

            assert_eq!(sequences(&pool, "acct").await, [1, 3, 4]);
            let error = inbox.skip_gap("credit_strickt", "acct").await.unwrap_err();
            assert!(matches!(&error, Error::UnknownHandler(name) if name == "credit_strickt"), "{error}");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn an_aggregate_without_sequence_is_still_serialized() {
            let Some(pool) = ledger("unsequenced").await else { return };
            let tasks: Vec<_> = (0..20)
                .map(|i| {
                    let pool = pool.clone();
                    let event = Credited::new(format!("e-{i}"), "acct", 0, 1);
                    tokio::spawn(async move { credit_unsequenced.process(&pool, event).await })
                })
                .collect();
            let mut outcomes = BTreeMap::new();
            for task in tasks {
                *outcomes.entry(task.await.unwrap().unwrap()).or_insert(0) += 1;
            }

            assert_eq!(outcomes, BTreeMap::from([(Outcome::Processed, 20)]));
            assert_eq!(balance(&pool, "acct").await, 20, "no update was lost");
        }
    };
}

common::on_every_backend!(strict_suite, batched);
