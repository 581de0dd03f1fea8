//! Conflicts kept for an operator: a delivery whose id was seen before with other content is
//! never applied, and is kept, with its payload and headers, next to the stored message (one row
//! per content, counting its deliveries), through a runtime, batched or not, and through
//! `process`.

mod common;

macro_rules! conflicts_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use inbox::MemoryBroker;
        use inbox::prelude::*;
        use inbox::storage::operators::{self, Conflict};

        use $crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// The amount of a kept conflict's payload.
        fn amount(conflict: &Conflict) -> i64 {
            let payload: serde_json::Value =
                serde_json::from_slice(&conflict.payload).expect("a JSON payload");
            payload["amount"].as_i64().expect("an amount")
        }

        /// An inbox of `credit`, one message per transaction or batched, as the suite runs.
        async fn credit_inbox(pool: &sqlx::Pool<$db>) -> inbox::Inbox<$db> {
            $crate::common::builder(pool, $batch)
                .handler(credit)
                .build()
                .await
                .unwrap()
        }

        #[tokio::test]
        async fn a_conflicting_delivery_is_kept_with_its_payload_and_never_applied() {
            let Some(pool) = ledger("conflict_kept").await else {
                return;
            };
            let inbox = credit_inbox(&pool).await;
            let broker = MemoryBroker::new();
            let paid = Credited::new("e-1", "acct", 1, 30);
            let other = Credited::new("e-1", "acct", 1, 99);
            broker.publish(Envelope::encode("d-1", &paid).unwrap());
            let traced = Envelope::encode("d-2", &other).unwrap();
            broker.publish(traced.with_header("correlation-id", "corr-99"));
            broker.publish(Envelope::encode("d-3", &other).unwrap());
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(
                report.handler_calls_with(Outcome::Conflict),
                2,
                "{report:?}"
            );
            assert_eq!(balance(&pool, "acct").await, 30, "never applied");
            let conflicts = operators::conflicts(&pool, None).await.unwrap();
            assert_eq!(conflicts.len(), 1, "one row per content: {conflicts:?}");
            let kept = &conflicts[0];
            let at = (
                kept.consumer.as_str(),
                kept.handler.as_str(),
                kept.message_id.as_str(),
            );
            assert_eq!(at, ("default", "credit", "e-1"));
            assert_eq!((amount(kept), kept.deliveries), (99, 2));
            assert!(kept.headers.contains("corr-99"), "{kept:?}");
            assert_ne!(kept.payload_hash, kept.stored_payload_hash);
            let status = inbox::status(&pool).await.unwrap();
            let counted = ("default".to_owned(), "credit".to_owned(), 1);
            assert_eq!(status.conflicts, [counted]);
        }

        /// Two deliveries of one id whose payloads differ only in a number past 64 bits (which
        /// parsed JSON holds only roughly) are two contents: the second is a conflict, not a
        /// duplicate dropped unseen.
        #[tokio::test]
        async fn a_delivery_differing_only_in_a_number_past_64_bits_is_a_conflict() {
            let Some(pool) = ledger("conflict_big_number").await else {
                return;
            };
            let inbox = credit_inbox(&pool).await;
            let broker = MemoryBroker::new();
            for (delivery, reference) in [("d-1", "18446744073709551616"), ("d-2", "18446744073709551617")] {
                let payload = format!(
                    r#"{{"event_id":"e-1","account":"acct","sequence":1,"amount":30,"reference":{reference}}}"#
                );
                broker.publish(Envelope::new("test.credited", delivery, payload.into_bytes()));
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(report.handler_calls_with(Outcome::Processed), 1, "{report:?}");
            assert_eq!(report.handler_calls_with(Outcome::Conflict), 1, "{report:?}");
            assert_eq!(balance(&pool, "acct").await, 30);
        }

        #[tokio::test]
        async fn each_content_of_an_id_is_kept_once_through_process() {
            let Some(pool) = ledger("conflict_process").await else {
                return;
            };
            let process = |amount| credit.process(&pool, Credited::new("e-1", "acct", 1, amount));

            assert_eq!(process(30).await.unwrap(), Outcome::Processed);
            for amount in [40, 50, 40] {
                assert_eq!(process(amount).await.unwrap(), Outcome::Conflict);
            }
            assert_eq!(process(30).await.unwrap(), Outcome::Duplicate);

            let conflicts = operators::conflicts(&pool, Some("default")).await.unwrap();
            let kept: Vec<(i64, i64)> = conflicts
                .iter()
                .map(|c| (amount(c), c.deliveries))
                .collect();
            assert_eq!(kept, [(40, 2), (50, 1)]);
            assert_eq!(
                operators::conflicts(&pool, Some("billing")).await.unwrap(),
                []
            );
            let one = operators::conflict(&pool, conflicts[1].id).await.unwrap();
            assert_eq!(one.as_ref(), Some(&conflicts[1]));
            assert_eq!(balance(&pool, "acct").await, 30);
        }
    };
}

common::on_every_backend!(conflicts_suite, batched);
