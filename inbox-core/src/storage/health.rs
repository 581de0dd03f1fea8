//! What a health probe reads, cheaply enough to poll: whether every migration of the inbox schema
//! is applied, and a consumer's backlog of parked, failed and dead messages with the age of the
//! oldest (one query per status, each on its partial index).

use sqlx::Pool;
use sqlx::migrate::{Migrate, MigrateError};

use super::sql::{self, Param};
use super::{Backend, Columns, FromColumns, MIGRATIONS_TABLE};

/// PostgreSQL's backlog statement (the default of [`Backend::HEALTH_BACKLOG`]).
pub const POSTGRES_BACKLOG: &str = "\
    SELECT 'parked', COUNT(*), EXTRACT(EPOCH FROM now() - MIN(received_at))::float8 \
    FROM inbox_messages WHERE consumer = $1 AND status = 'parked' \
    UNION ALL SELECT 'failed', COUNT(*), EXTRACT(EPOCH FROM now() - MIN(received_at))::float8 \
    FROM inbox_messages WHERE consumer = $2 AND status = 'failed' \
    UNION ALL SELECT 'dead', COUNT(*), EXTRACT(EPOCH FROM now() - MIN(received_at))::float8 \
    FROM inbox_messages WHERE consumer = $3 AND status = 'dead'";

/// SQLite's backlog statement (`received_at` is UTC text).
pub const SQLITE_BACKLOG: &str = "\
    SELECT 'parked', COUNT(*), (julianday('now') - julianday(MIN(received_at))) * 86400.0 \
    FROM inbox_messages WHERE consumer = $1 AND status = 'parked' \
    UNION ALL SELECT 'failed', COUNT(*), (julianday('now') - julianday(MIN(received_at))) * 86400.0 \
    FROM inbox_messages WHERE consumer = $2 AND status = 'failed' \
    UNION ALL SELECT 'dead', COUNT(*), (julianday('now') - julianday(MIN(received_at))) * 86400.0 \
    FROM inbox_messages WHERE consumer = $3 AND status = 'dead'";

/// MySQL's backlog statement (the session's time zone is UTC).
pub const MYSQL_BACKLOG: &str = "\
    SELECT 'parked', COUNT(*), CAST(TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM inbox_messages WHERE consumer = ? AND status = 'parked' \
    UNION ALL SELECT 'failed', COUNT(*), CAST(TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM inbox_messages WHERE consumer = ? AND status = 'failed' \
    UNION ALL SELECT 'dead', COUNT(*), CAST(TIMESTAMPDIFF(MICROSECOND, MIN(received_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM inbox_messages WHERE consumer = ? AND status = 'dead'";

/// How many messages of one status a consumer holds, and how long the oldest has waited.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Backlog {
    /// `parked`, `failed` or `dead`.
    pub status: String,
    /// How many.
    pub count: i64,
    /// The oldest one's age, in seconds (`None` when there is none).
    pub oldest_secs: Option<f64>,
}

impl FromColumns for Backlog {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(Self {
            status: row.text(0)?,
            count: row.int(1)?,
            oldest_secs: row.maybe_real(2)?,
        })
    }
}

/// The parked, failed and dead messages of `consumer`, in that order.
pub async fn backlog<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
) -> Result<Vec<Backlog>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer); 3];
    sql::fetch_all::<DB, Backlog>(&mut conn, DB::HEALTH_BACKLOG, &params).await
}

/// The versions of the inbox schema's migrations that are not applied (empty: the schema is
/// current).
pub async fn missing_migrations<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<i64>, MigrateError> {
    let mut conn = pool.acquire().await?;
    let applied = conn.list_applied_migrations(MIGRATIONS_TABLE).await?;
    let missing = DB::migrations()
        .iter()
        .map(|migration| migration.version)
        .filter(|version| !applied.iter().any(|done| done.version == *version))
        .collect();
    Ok(missing)
}
