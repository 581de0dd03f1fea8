//! The purge's statements: what a window would delete, one batch of deletes (of dedup rows, or of
//! what operators resolved), and the lock that lets one instance purge at a time.

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
    /// What operators resolved before the window, which a purge deletes: discarded dead letters,
    /// rejected deliveries replayed or discarded, and conflicts resolved.
    pub resolved: i64,
    /// Rejected deliveries received before the window and not resolved, which a purge keeps.
    pub rejected: i64,
}

/// What operators resolved, which a purge deletes once it is older than the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Dead letters an operator discarded, by when.
    Discarded,
    /// Rejected deliveries an operator replayed or discarded, by when.
    Rejected,
    /// Conflicts an operator resolved, by when.
    Conflicts,
    /// Operators' actions performed before the window on a message or a rejected delivery that
    /// is gone, or on a gap.
    Actions,
}

impl Resolved {
    /// Every kind, in the order a purge deletes them: the actions last, once the rows they were
    /// about are gone.
    pub const ALL: [Resolved; 4] = [
        Resolved::Discarded,
        Resolved::Rejected,
        Resolved::Conflicts,
        Resolved::Actions,
    ];

    /// The kind's name, as the `kind` label of `inbox_purged_resolved_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolved::Discarded => "discarded",
            Resolved::Rejected => "rejected",
            Resolved::Conflicts => "conflicts",
            Resolved::Actions => "actions",
        }
    }

    fn statement<DB: Backend>(self) -> &'static str {
        DB::SQL.purge.resolved[self as usize]
    }
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
            resolved: row.int(3)?,
            rejected: row.int(4)?,
        })
    }
}

/// What a purge of rows older than `older_than_secs` would delete, and what it keeps.
pub async fn preview<DB: Backend>(
    pool: &Pool<DB>,
    older_than_secs: f64,
) -> Result<PurgePreview, sqlx::Error> {
    let older = [Param::Real(older_than_secs); 7];
    let mut conn = pool.acquire().await?;
    sql::fetch_one::<DB, PurgePreview>(&mut conn, DB::SQL.purge.preview, &older).await
}

/// Deletes at most `limit` processed or stale rows older than `older_than_secs`, oldest first,
/// through the index on `processed_at`, in one short transaction. Returns how many.
pub async fn batch<DB: Backend>(
    pool: &Pool<DB>,
    older_than_secs: f64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    delete_batch(pool, DB::SQL.purge.batch, older_than_secs, limit).await
}

/// Deletes at most `limit` rows of what operators resolved (of one kind) before
/// `older_than_secs`, oldest first, through the index on when it was resolved, in one short
/// transaction. Returns how many.
pub async fn resolved_batch<DB: Backend>(
    pool: &Pool<DB>,
    kind: Resolved,
    older_than_secs: f64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    delete_batch(pool, kind.statement::<DB>(), older_than_secs, limit).await
}

async fn delete_batch<DB: Backend>(
    pool: &Pool<DB>,
    statement: &'static str,
    older_than_secs: f64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let params = [Param::Real(older_than_secs), Param::Int(limit)];
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, statement, &params).await
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
