//! The purge's statements: what a window would delete, one batch of deletes, and the lock that
//! lets one instance purge at a time.

use sqlx::{Connection, Pool};

use super::Backend;
use super::sql::{self, Columns, FromColumns, Param};

/// What a purge with a given window would do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgePreview {
    /// Processed and stale rows older than the window: the ones a purge deletes.
    pub purgeable: i64,
    /// Parked messages older than the window, which a purge keeps.
    pub parked: i64,
    /// Dead letters older than the window, which a purge keeps.
    pub dead: i64,
}

/// The right to purge, held by one instance at a time (see [`lead_purge`]).
///
/// On PostgreSQL and MySQL it holds the connection that owns the lock; the lock goes when
/// [`PurgeLeader::step_down`] closes it, or when the connection drops.
pub struct PurgeLeader<DB: sqlx::Database> {
    lock: Option<DB::Connection>,
}

impl<DB: Backend> PurgeLeader<DB> {
    /// Gives the right to purge back: another instance can take it as soon as this returns.
    pub async fn step_down(self) -> Result<(), sqlx::Error> {
        let Some(mut lock) = self.lock else {
            return Ok(());
        };
        if let Some(unlock) = DB::SQL.purge.unlock {
            sql::execute::<DB>(&mut lock, unlock, &[]).await?;
        }
        lock.close().await
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for PurgeLeader<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurgeLeader")
            .field("locked", &self.lock.is_some())
            .finish()
    }
}

impl FromColumns for PurgePreview {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(PurgePreview {
            purgeable: row.int(0)?,
            parked: row.int(1)?,
            dead: row.int(2)?,
        })
    }
}

/// What a purge of rows older than `older_than_secs` would delete, and what it keeps.
pub async fn preview<DB: Backend>(
    pool: &Pool<DB>,
    older_than_secs: f64,
) -> Result<PurgePreview, sqlx::Error> {
    let older = Param::Real(older_than_secs);
    let mut conn = pool.acquire().await?;
    sql::fetch_one::<DB, PurgePreview>(&mut conn, DB::SQL.purge.preview, &[older, older, older])
        .await
}

/// Deletes at most `limit` processed or stale rows older than `older_than_secs`, oldest first,
/// through the index on `processed_at`, in one short transaction. Returns how many.
pub async fn batch<DB: Backend>(
    pool: &Pool<DB>,
    older_than_secs: f64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let params = [Param::Real(older_than_secs), Param::Int(limit)];
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, DB::SQL.purge.batch, &params).await
}

/// Takes the right to purge if no other instance holds it: a lock named after the inbox's table
/// (PostgreSQL: an advisory lock; MySQL: `GET_LOCK`), on a connection of its own that leaves the
/// pool, so the lock lives exactly as long as that connection; on SQLite, whose writers take
/// turns anyway, always granted.
pub async fn lead_purge<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<Option<PurgeLeader<DB>>, sqlx::Error> {
    let Some(take_lock) = DB::SQL.purge.lock else {
        return Ok(Some(PurgeLeader { lock: None }));
    };
    let mut lock = pool.acquire().await?.detach();
    let led: i64 = sql::fetch_one::<DB, i64>(&mut lock, take_lock, &[]).await?;
    if led == 1 {
        return Ok(Some(PurgeLeader { lock: Some(lock) }));
    }
    lock.close().await?;
    Ok(None)
}
