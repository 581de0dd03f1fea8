//! What the benchmarks share: the `Credited` event, its handler on each backend (one business
//! write), a fresh database with the accounts it credits, and the PostgreSQL database to measure.

use inbox::prelude::*;
use sqlx::{Pool, Postgres, Sqlite};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The business write: credit an account.
pub const CREDIT: &str = "UPDATE accounts SET balance = balance + $1 WHERE id = $2";

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
pub struct Credited {
    pub event_id: Uuid,
    pub account: String,
    pub sequence: i64,
    pub amount: i64,
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "account",
    name = "credit"
)]
pub async fn credit_sqlite(
    tx: &mut sqlx::SqliteConnection,
    msg: Credited,
) -> Result<(), HandlerError> {
    let credit = sqlx::query(CREDIT).bind(msg.amount).bind(msg.account);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "account",
    name = "credit"
)]
pub async fn credit_postgres(
    tx: &mut sqlx::PgConnection,
    msg: Credited,
) -> Result<(), HandlerError> {
    let credit = sqlx::query(CREDIT).bind(msg.amount).bind(msg.account);
    credit.execute(&mut *tx).await?;
    Ok(())
}

/// The PostgreSQL database `DATABASE_URL` names, on a pool of up to `connections`, with its
/// URL; `None` (and a line that says it is skipped) when it names none.
pub async fn postgres_from_env(
    connections: u32,
) -> Result<Option<(Pool<Postgres>, String)>, Failure> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(connections)
                .connect(&url)
                .await?;
            Ok(Some((pool, url)))
        }
        _ => {
            println!("PostgreSQL: skipped (set DATABASE_URL=postgres://... to measure it)");
            Ok(None)
        }
    }
}

/// A new SQLite file `name` in the temp directory (the old one deleted), on a pool of up to 24
/// connections, as PostgreSQL's: room for each of 16 workers to keep its own, as the runtime
/// does where the pool has one per worker and one more.
pub async fn fresh_sqlite(name: &str) -> Result<Pool<Sqlite>, Failure> {
    let path = std::env::temp_dir().join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let url = format!("sqlite://{}", path.display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(24);
    Ok(pool.connect_with(inbox::sqlite_options(&url)?).await?)
}

/// The inbox schema without handler `credit`'s rows, and `accounts` accounts `acct-<n>` of
/// balance 0.
pub async fn prepare<DB: inbox::Backend>(
    pool: &Pool<DB>,
    accounts: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    inbox::migrate(pool).await?;
    for sql in [
        "DROP TABLE IF EXISTS accounts",
        "CREATE TABLE accounts (id VARCHAR(100) PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0)",
        "DELETE FROM inbox_messages WHERE handler = 'credit'",
        "DELETE FROM inbox_streams WHERE handler = 'credit'",
    ] {
        sqlx::raw_sql(sql).execute(pool).await?;
    }
    let ids: Vec<String> = (0..accounts).map(|n| format!("('acct-{n}')")).collect();
    for chunk in ids.chunks(1_000) {
        let insert = format!("INSERT INTO accounts (id) VALUES {}", chunk.join(", "));
        sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
            .execute(pool)
            .await?;
    }
    Ok(())
}
