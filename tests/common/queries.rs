//! Reads of the ledger and of the inbox tables, for assertions. Defined per database by
//! `ledger_queries!`, next to the handlers of `ledger_handlers!`.

/// Defines, for `Pool<$db>`: `ledger` (a database from `$connect` with the ledger's tables),
/// `second_pool`, `balance`, `applied`, `count`, `status`, `last_sequence`, `freeze` and
/// `run_until_applied`.
#[allow(unused_macros)]
macro_rules! ledger_queries {
    ($db:ty, $connect:path) => {
        pub use queries::*;

        /// Each test binary uses some of these.
        #[allow(dead_code)]
        mod queries {
        pub type Pool = sqlx::Pool<$db>;

        /// A fresh database with the ledger's tables, or `None` if this backend is not configured.
        pub async fn ledger(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            for ddl in $crate::common::ledger::LEDGER_TABLES {
                sqlx::query(ddl).execute(&pool).await.expect("create ledger table");
            }
            Some(pool)
        }

        /// Another pool on the same database: a second process, as far as the inbox can tell.
        pub async fn second_pool(pool: &Pool) -> Pool {
            let options = (*pool.connect_options()).clone();
            Pool::connect_with(options).await.expect("connect a second pool")
        }

        pub async fn balance(pool: &Pool, account: &str) -> i64 {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT COALESCE(MAX(balance), 0) FROM accounts WHERE id = $1"))
                .bind(account.to_owned())
                .fetch_one(pool)
                .await
                .expect("read balance")
        }

        /// `(sequence, event_id)` of the events applied to `account`, in application order.
        pub async fn applied(pool: &Pool, account: &str) -> Vec<(i64, String)> {
            sqlx::query_as($crate::common::sql::<$db>("SELECT sequence, event_id FROM applied WHERE account = $1 ORDER BY position"))
                .bind(account.to_owned())
                .fetch_all(pool)
                .await
                .expect("read applied")
        }

        pub async fn count(pool: &Pool, table: &'static str) -> i64 {
            let sql = match table {
                "applied" => "SELECT COUNT(*) FROM applied",
                "audit_log" => "SELECT COUNT(*) FROM audit_log",
                _ => "SELECT COUNT(*) FROM inbox_messages",
            };
            sqlx::query_scalar(sql).fetch_one(pool).await.expect("count rows")
        }

        /// The inbox status recorded for `message_id` under `handler`, if any.
        pub async fn status(pool: &Pool, handler: &str, message_id: &str) -> Option<String> {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT status FROM inbox_messages WHERE handler = $1 AND message_id = $2"))
                .bind(handler.to_owned())
                .bind(message_id.to_owned())
                .fetch_optional(pool)
                .await
                .expect("read inbox status")
        }

        pub async fn last_sequence(pool: &Pool, handler: &str, account: &str) -> Option<i64> {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT last_sequence FROM inbox_streams WHERE handler = $1 AND aggregate_id = $2"))
                .bind(handler.to_owned())
                .bind(account.to_owned())
                .fetch_optional(pool)
                .await
                .expect("read stream")
        }

        pub async fn freeze(pool: &Pool, account: &str, frozen: bool) {
            let updated = sqlx::query($crate::common::sql::<$db>("UPDATE accounts SET frozen = $1 WHERE id = $2"))
                .bind(frozen)
                .bind(account.to_owned())
                .execute(pool)
                .await
                .expect("freeze account");
            if updated.rows_affected() == 0 {
                sqlx::query($crate::common::sql::<$db>("INSERT INTO accounts (id, frozen) VALUES ($1, $2)"))
                    .bind(account.to_owned())
                    .bind(frozen)
                    .execute(pool)
                    .await
                    .expect("freeze account");
            }
        }

        /// Runs `inbox` over `source` until `applied` events are applied (or a minute passed).
        pub async fn run_until_applied<S: inbox::Source>(
            inbox: &inbox::Inbox<$db>,
            pool: &Pool,
            source: S,
            applied: i64,
        ) -> inbox::RunReport {
            let pool = pool.clone();
            let done = async move {
                for _ in 0..2_400 {
                    if count(&pool, "applied").await >= applied {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            };
            inbox.run_until(source, done).await.expect("run")
        }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use ledger_queries;
