//! The database killing the inbox's connections while it runs (a failover, a restarted proxy, an
//! operator's `pg_terminate_backend`): nothing lost and nothing applied twice, one message per
//! transaction and batched, on PostgreSQL and MySQL (SQLite has no connections to kill).

mod common;

/// `$whoami`: the statement that answers a connection's server-side id; `$kill`: the statement
/// that ends the connection with that id.
macro_rules! killed_connections_suite {
    ($db:ty, $conn:ty, $connect:path, $batch:expr, $whoami:expr, $kill:expr) => {
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use inbox::MemoryBroker;
        use inbox::prelude::*;
        use sqlx::Connection;

        use crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// A pool on the same database that notes the server-side id of every connection it opens.
        async fn noted_pool(pool: &Pool, ids: Arc<Mutex<Vec<i64>>>) -> Pool {
            let options = (*pool.connect_options()).clone();
            let noting = sqlx::pool::PoolOptions::<$db>::new()
                .max_connections(8)
                .after_connect(move |conn, _| {
                    let ids = Arc::clone(&ids);
                    Box::pin(async move {
                        let id: i64 = sqlx::query_scalar($whoami).fetch_one(&mut *conn).await?;
                        ids.lock().expect("ids").push(id);
                        Ok(())
                    })
                });
            noting.connect_with(options).await.expect("a second pool")
        }

        /// Ends every connection `ids` holds, from a connection of its own, every 300 ms for
        /// `rounds` rounds (connections opened meanwhile too); returns how many it ended.
        async fn kill_connections(pool: &Pool, ids: Arc<Mutex<Vec<i64>>>, rounds: usize) -> usize {
            let mut killer = pool
                .acquire()
                .await
                .expect("the killer's connection")
                .detach();
            let mut killed = 0;
            for _ in 0..rounds {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let doomed: Vec<i64> = std::mem::take(&mut *ids.lock().expect("ids"));
                for id in doomed {
                    // A connection that ended on its own is no longer there to kill.
                    let kill = sqlx::query(sqlx::AssertSqlSafe($kill(id))).execute(&mut killer);
                    killed += usize::from(kill.await.is_ok());
                }
            }
            killer.close().await.expect("close the killer's connection");
            killed
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn connections_killed_mid_run_lose_nothing_and_apply_nothing_twice() {
            let Some(pool) = ledger("killed_connections").await else {
                return;
            };
            let ids = Arc::new(Mutex::new(Vec::new()));
            let noted = noted_pool(&pool, Arc::clone(&ids)).await;
            let inbox = $crate::common::builder(&noted, $batch)
                .handler(credit_strict)
                .workers(4)
                .build()
                .await
                .unwrap();
            let (accounts, per_account) = (12, 40);
            let broker = MemoryBroker::new();
            for sequence in 1..=per_account {
                for account in 0..accounts {
                    let event = Credited::new(
                        format!("e-{account}-{sequence}"),
                        format!("acct-{account}"),
                        sequence,
                        1,
                    );
                    let envelope =
                        Envelope::encode(format!("d-{account}-{sequence}"), &event).unwrap();
                    broker.publish(envelope.clone());
                    broker.publish(envelope);
                }
            }
            let killer = tokio::spawn({
                let (pool, ids) = (pool.clone(), Arc::clone(&ids));
                async move { kill_connections(&pool, ids, 8).await }
            });

            let report =
                run_until_applied(&inbox, &pool, broker.source(), accounts * per_account).await;
            let killed = killer.await.unwrap();

            assert!(
                killed > 0,
                "connections were killed under the run: {report:?}"
            );
            let failed_attempts = "SELECT COUNT(*) FROM inbox_messages WHERE attempt_count > 0";
            let counted: i64 = sqlx::query_scalar(failed_attempts)
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(
                counted, 0,
                "a lost connection is not the handler's failure: no attempt counted"
            );
            assert_eq!(
                count(&pool, "applied").await,
                accounts * per_account,
                "{report:?}"
            );
            for account in 0..accounts {
                let account = format!("acct-{account}");
                let sequences: Vec<i64> = applied(&pool, &account)
                    .await
                    .into_iter()
                    .map(|(sequence, _)| sequence)
                    .collect();
                assert_eq!(
                    sequences,
                    (1..=per_account).collect::<Vec<_>>(),
                    "each once, in order: {account}"
                );
                assert_eq!(balance(&pool, &account).await, per_account);
            }
        }
    };
}

mod postgres {
    killed_connections_suite!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::common::postgres,
        None,
        "SELECT pg_backend_pid()::int8",
        |id: i64| format!("SELECT pg_terminate_backend({id})")
    );
}

mod postgres_batched {
    killed_connections_suite!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::common::postgres,
        Some(inbox::Batch::new(16)),
        "SELECT pg_backend_pid()::int8",
        |id: i64| format!("SELECT pg_terminate_backend({id})")
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    killed_connections_suite!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        crate::common::mysql,
        None,
        "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        |id: i64| format!("KILL {id}")
    );
}

#[cfg(feature = "mysql")]
mod mysql_batched {
    killed_connections_suite!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        crate::common::mysql,
        Some(inbox::Batch::new(16)),
        "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        |id: i64| format!("KILL {id}")
    );
}
