//! The storage side of the guard: one implementation per database, sharing the same SQL.
//!
//! The statements use `$n` placeholders and `CURRENT_TIMESTAMP`, which PostgreSQL and SQLite both
//! understand; what differs between the backends is how a guarded transaction begins and where the
//! schema comes from.

use std::future::Future;

use sqlx::migrate::Migrator;
use sqlx::{Pool, Postgres, Sqlite, Transaction};

/// What the guard records when it first sees a message.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The dedup key.
    pub message_id: &'a str,
    /// The message's type tag.
    pub message_type: &'a str,
    /// The aggregate, if any.
    pub aggregate: Option<&'a str>,
    /// The sequence, if any.
    pub sequence: Option<i64>,
    /// The SHA-256 of the message's canonical encoding.
    pub payload_hash: &'a [u8],
}

/// The answer to a [`Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// First time: the dedup row is now held by this transaction.
    New,
    /// Seen before, with this payload hash.
    Seen {
        /// The hash stored when the message was first recorded.
        payload_hash: Vec<u8>,
    },
}

/// A database the inbox can guard messages in.
///
/// Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database the inbox supports",
    note = "the inbox runs on `sqlx::Postgres` and `sqlx::Sqlite`"
)]
pub trait Backend: sqlx::Database {
    /// Begins the transaction that guards one message (SQLite: `BEGIN IMMEDIATE`, so the write lock
    /// is taken up front instead of failing on upgrade).
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send;

    /// Inserts the dedup row, or reports the one already there.
    fn claim(
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Claimed, sqlx::Error>> + Send;

    /// Records that a claimed message was skipped as stale.
    fn mark_stale(
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Locks the aggregate's stream row, creating it if missing, and moves it to `sequence` if that
    /// is newer than the last applied one. Returns `false` when it is not newer (stale).
    ///
    /// Creation is an upsert on the primary key, so two first messages of a new aggregate serialize
    /// on the key instead of both seeing "no row".
    fn advance_stream(
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
        aggregate: &str,
        sequence: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Locks the aggregate's stream row (creating it if missing) without moving it: serializes the
    /// handlers of one aggregate that have no sequence.
    fn lock_stream(
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
        aggregate: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Applies the inbox schema migrations that have not run yet.
    fn migrate(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send;

    /// Fails if the inbox tables are missing.
    fn check_schema(pool: &Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The schema as plain DDL, for teams that run their own migrations.
    fn schema_sql() -> &'static str;
}

const INSERT_CLAIM: &str = "INSERT INTO inbox_messages \
    (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
    VALUES ($1, $2, $3, $4, $5, $6, 'processed', $7, CURRENT_TIMESTAMP) \
    ON CONFLICT (consumer, handler, message_id) DO NOTHING";

const SELECT_CLAIM: &str = "SELECT payload_hash FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const MARK_STALE: &str = "UPDATE inbox_messages SET status = 'stale' \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const ADVANCE_STREAM: &str = "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
    VALUES ($1, $2, $3, $4) \
    ON CONFLICT (consumer, handler, aggregate_id) \
    DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
    WHERE inbox_streams.last_sequence < excluded.last_sequence";

const LOCK_STREAM: &str = "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
    VALUES ($1, $2, $3, 0) \
    ON CONFLICT (consumer, handler, aggregate_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP";

const CHECK_SCHEMA: &str = "SELECT 1 FROM inbox_messages, inbox_streams WHERE 1 = 0";

/// The name of the table that records which inbox migrations ran, kept apart from the
/// application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_inbox_migrations";

macro_rules! sql_backend {
    ($db:ty, |$pool:ident| $begin:expr, $migrations:literal, $ddl:literal) => {
        impl Backend for $db {
            async fn begin($pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
                $begin.await
            }

            async fn claim(
                conn: &mut Self::Connection,
                claim: &Claim<'_>,
            ) -> Result<Claimed, sqlx::Error> {
                let inserted = sqlx::query(INSERT_CLAIM)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(claim.message_id)
                    .bind(claim.message_type)
                    .bind(claim.aggregate)
                    .bind(claim.sequence)
                    .bind(claim.payload_hash)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                if inserted == 1 {
                    return Ok(Claimed::New);
                }
                let payload_hash: Vec<u8> = sqlx::query_scalar(SELECT_CLAIM)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(claim.message_id)
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(Claimed::Seen { payload_hash })
            }

            async fn mark_stale(
                conn: &mut Self::Connection,
                claim: &Claim<'_>,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(MARK_STALE)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(claim.message_id)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn advance_stream(
                conn: &mut Self::Connection,
                claim: &Claim<'_>,
                aggregate: &str,
                sequence: i64,
            ) -> Result<bool, sqlx::Error> {
                let advanced = sqlx::query(ADVANCE_STREAM)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(aggregate)
                    .bind(sequence)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                Ok(advanced == 1)
            }

            async fn lock_stream(
                conn: &mut Self::Connection,
                claim: &Claim<'_>,
                aggregate: &str,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(LOCK_STREAM)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(aggregate)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError> {
                let embedded = sqlx::migrate!($migrations);
                let mut migrator = Migrator::with_migrations(embedded.migrations.to_vec());
                migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
                migrator.run(pool).await
            }

            async fn check_schema(pool: &Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::query(CHECK_SCHEMA).execute(pool).await?;
                Ok(())
            }

            fn schema_sql() -> &'static str {
                include_str!($ddl)
            }
        }
    };
}

sql_backend!(
    Postgres,
    |pool| pool.begin(),
    "./migrations/postgres",
    "../migrations/postgres/0001_inbox.sql"
);
sql_backend!(
    Sqlite,
    |pool| pool.begin_with("BEGIN IMMEDIATE"),
    "./migrations/sqlite",
    "../migrations/sqlite/0001_inbox.sql"
);

/// Connection options for an embedded SQLite database as the inbox wants it: write-ahead log,
/// `synchronous = FULL` (a commit is on disk before the delivery is acknowledged), a busy timeout
/// so concurrent writers wait instead of failing, and the file created if missing.
///
/// ```
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::SqlitePool::connect_with(inbox_core::sqlite_options("sqlite://app.db")?).await?;
/// # Ok(()) }
/// ```
pub fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use std::str::FromStr;

    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(std::time::Duration::from_secs(30)))
}
