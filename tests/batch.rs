//! Batched mode on real databases: the messages of a batch commit together, and one message's
//! failure neither commits nor loses the others' work, nor applies its own; its handler runs once
//! for the attempt. Duplicates in a batch cost no handler call. (Every behaviour suite also runs
//! batched: see `on_every_backend!(suite, batched)`.)

mod common;

macro_rules! batch_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;
        use std::sync::Mutex;

        use inbox::prelude::*;
        use inbox::{Batch, MemoryBroker};

        type Pool = sqlx::Pool<$db>;

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "batch.step")]
        struct Step {
            id: String,
            account: String,
        }

        /// How many times the handler ran for each id, committed or not.
        static CALLS: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

        /// Writes its row, then fails for good on an id starting with `bad`: a failure after a write.
        #[inbox_handler(key = "id", aggregate = "account", name = "step")]
        async fn step(tx: &mut $conn, msg: Step) -> Result<(), HandlerError> {
            *CALLS.lock().unwrap().entry(msg.id.clone()).or_default() += 1;
            sqlx::query($crate::common::sql::<$db>(
                "INSERT INTO written (id) VALUES ($1)",
            ))
            .bind(&msg.id)
            .execute(&mut *tx)
            .await?;
            if msg.id.starts_with("bad") {
                return Err(HandlerError::permanent(HandlerError::msg("bad is refused")));
            }
            Ok(())
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            let ddl = "CREATE TABLE written (id VARCHAR(64) NOT NULL)";
            sqlx::query(ddl).execute(&pool).await.unwrap();
            Some(pool)
        }

        async fn written(pool: &Pool) -> Vec<String> {
            let sql = "SELECT id FROM written ORDER BY id";
            sqlx::query_scalar(sql).fetch_all(pool).await.unwrap()
        }

        #[tokio::test]
        async fn a_failure_in_a_batch_rolls_back_only_itself_and_runs_once() {
            let Some(pool) = database("batch_failure").await else {
                return;
            };
            let inbox = Inbox::builder(pool.clone())
                .workers(1)
                .batch(Batch::new(8))
                .handler(step)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            let ids = ["a", "b", "c", "bad", "d", "e", "a", "f"];
            for (n, id) in ids.iter().enumerate() {
                let message = Step {
                    id: (*id).into(),
                    account: format!("acct-{id}"),
                };
                broker.publish(Envelope::encode(format!("delivery-{n}"), &message).unwrap());
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(
                written(&pool).await,
                ["a", "b", "c", "d", "e", "f"],
                "each good one once, nothing of bad"
            );
            let calls = CALLS.lock().unwrap().clone();
            let ran = |id: &str| calls.get(id).copied().unwrap_or(0);
            assert_eq!(ran("bad"), 1, "one attempt, one run");
            // One transaction: what ran before bad was rolled back with it and ran again, once.
            assert_eq!((ran("a"), ran("b"), ran("c")), (2, 2, 2), "{calls:?}");
            assert_eq!((ran("d"), ran("e"), ran("f")), (1, 1, 1), "{calls:?}");
            assert_eq!(report.count(Outcome::Processed), 6, "{report:?}");
            assert_eq!(
                report.count(Outcome::Duplicate),
                1,
                "the second `a`, without a handler call"
            );
            assert_eq!(report.count(Outcome::Dead), 1, "{report:?}");
            assert_eq!(
                broker.acked(),
                ids.len() as u64,
                "every delivery settled after the commits"
            );
            let dead = inbox.dead().await.unwrap();
            assert_eq!(
                (dead[0].message_id.as_str(), dead[0].attempt_count),
                ("bad", 1)
            );
        }

        #[tokio::test]
        async fn one_message_per_transaction_runs_every_handler_once() {
            let Some(pool) = database("batch_baseline").await else {
                return;
            };
            let inbox = Inbox::builder(pool.clone())
                .workers(1)
                .handler(step)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            for id in ["g", "bad-alone", "h"] {
                let message = Step {
                    id: id.into(),
                    account: format!("acct-{id}"),
                };
                broker.publish(Envelope::encode(format!("delivery-{id}"), &message).unwrap());
            }
            broker.close();

            inbox.run(broker.source()).await.unwrap();

            let calls = CALLS.lock().unwrap().clone();
            assert_eq!(
                (calls.get("g"), calls.get("h")),
                (Some(&1), Some(&1)),
                "{calls:?}"
            );
            assert_eq!(written(&pool).await, ["g", "h"]);
        }
    };
}

common::on_every_backend!(batch_suite);
