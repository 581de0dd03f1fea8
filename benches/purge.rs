//! What a retention purge costs as the table grows: the same 20,000 old rows purged (in batches of
//! 5,000) from a table that also holds 20,000, then 400,000 recent rows. A purge driven by the
//! index on `processed_at` costs the same at both sizes; one that scanned the table would grow with
//! it. Prints both times and their ratio, measured in the same run.
//!
//! `cargo bench --bench purge` runs on a SQLite file; `DATABASE_URL=postgres://...` adds PostgreSQL
//! (a scratch database: the purge deletes every old row in it).

use std::time::{Duration, Instant};

use inbox::{Backend, Retention};
use sqlx::{Pool, Postgres, Sqlite};

const OLD_ROWS: i64 = 20_000;
const TABLE_SIZES: [i64; 2] = [20_000, 400_000];
const BATCH: u32 = 5_000;

/// Inserts `rows` processed dedup rows named `{prefix}-n`, handled now.
async fn seed<DB: Backend>(pool: &Pool<DB>, prefix: &str, rows: i64) -> Result<(), sqlx::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let insert = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) \
         INSERT INTO inbox_messages (consumer, handler, message_id, message_type, status, \
         payload_hash, processed_at) \
         SELECT 'bench', 'purge', '{prefix}-' || i, 'bench', 'processed', CAST('hash' AS bytea), \
         CURRENT_TIMESTAMP FROM n"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(insert))
        .execute(pool)
        .await?;
    Ok(())
}

/// Leaves the benchmark's consumer with `recent` recent rows and [`OLD_ROWS`] old ones.
async fn prepare<DB: Backend>(pool: &Pool<DB>, recent: i64) -> Result<(), inbox::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    inbox::migrate(pool).await?;
    sqlx::raw_sql("DELETE FROM inbox_messages WHERE consumer = 'bench'")
        .execute(pool)
        .await?;
    seed(pool, "recent", recent).await?;
    seed(pool, "old", OLD_ROWS).await?;
    sqlx::raw_sql(
        "UPDATE inbox_messages SET processed_at = '2000-01-01 00:00:00' WHERE message_id LIKE 'old-%'",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The time to purge the old rows from a table of `recent` other rows.
async fn purge_time<DB: Backend>(pool: &Pool<DB>, recent: i64) -> Result<Duration, inbox::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    prepare(pool, recent).await?;
    let week = Retention::new(Duration::from_secs(7 * 86_400))
        .batch_size(BATCH)
        .pause(Duration::ZERO);
    let started = Instant::now();
    let report = inbox::purge(pool, &week).await?;
    let took = started.elapsed();
    assert_eq!(report.purged, OLD_ROWS as u64, "{report:?}");
    Ok(took)
}

async fn measure<DB: Backend>(backend: &str, pool: &Pool<DB>) -> Result<(), inbox::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let [small, large] = TABLE_SIZES;
    let small_time = purge_time(pool, small).await?;
    let large_time = purge_time(pool, large).await?;
    println!("{backend}: purge {OLD_ROWS} old rows in batches of {BATCH}");
    println!(
        "  beside {small:>7} recent rows  {:>8.1} ms",
        small_time.as_secs_f64() * 1e3
    );
    println!(
        "  beside {large:>7} recent rows  {:>8.1} ms",
        large_time.as_secs_f64() * 1e3
    );
    println!(
        "  ratio {:.2}x for a table {}x larger (a scan per batch would grow with the table)",
        large_time.as_secs_f64() / small_time.as_secs_f64(),
        large / small
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::temp_dir().join("inbox_bench_purge.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let url = format!("sqlite://{}", path.display());
    let sqlite: Pool<Sqlite> = sqlx::SqlitePool::connect_with(inbox::sqlite_options(&url)?).await?;
    measure("SQLite (WAL, synchronous = FULL)", &sqlite).await?;

    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let postgres: Pool<Postgres> = sqlx::PgPool::connect(&url).await?;
            measure("PostgreSQL", &postgres).await?;
        }
        _ => println!("PostgreSQL: skipped (set DATABASE_URL=postgres://... to measure it)"),
    }
    Ok(())
}
