//! Where the inbox keeps its rows: one [`Backend`] per database, holding that database's SQL and
//! quirks as data ([`Statements`]) in a module of its own (`postgres.rs`, `sqlite.rs`,
//! `mysql.rs`), and the algorithms written once against it, in modules named after who calls
//! them:
//!
//! | module | caller | what |
//! | --- | --- | --- |
//! | [`messages`] | the guard, on every message | dedup rows: claim, failures, settle, replay, reject |
//! | [`streams`] | the guard, for aggregates | stream rows, strict ordering: park, release, gaps |
//! | [`operators`] | operators, the CLI, gauges | dead letters, rejected deliveries, listings, counts |
//! | [`purge`] | retention | purge batches, the purge leader |
//! | [`outbox`] | the application, the relay, operators | outbox rows: write, claim, publish, retry |
//! | [`schema`] | setup | migrations, the schema check, plain DDL |
//!
//! Adding a database means one new module implementing [`Backend`]; see `docs/storage.md`.

use std::future::Future;

use futures::stream::BoxStream;

use sqlx::migrate::{Migrate, Migrator};
use sqlx::{Connection, Database, IntoArguments, Pool, Transaction};

use crate::queue::QueueReceipt;

pub mod bulk;
pub mod health;
pub mod messages;
#[cfg(feature = "mysql")]
mod mysql;
pub mod operators;
pub mod outbox;
mod postgres;
pub mod purge;
pub mod schema;
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
pub mod streams;

pub use sql::{Bind, Columns, FromColumns, Param, Run};
#[cfg(feature = "sqlite")]
pub use sqlite::sqlite_options;

/// A database the inbox can guard messages in: its statements and the few things that are not
/// statements (how a guarded transaction begins, what a write reports, where its migrations are).
///
/// Implemented for `sqlx::Postgres` (feature `postgres`), `sqlx::Sqlite` (feature `sqlite`) and
/// `sqlx::MySql` (feature `mysql`: MySQL 8, MariaDB 10.11).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database the inbox supports",
    note = "the inbox runs on `sqlx::Postgres`, `sqlx::Sqlite` and, with the `mysql` feature, `sqlx::MySql`"
)]
pub trait Backend:
    Database<Connection: Run + Migrate, Arguments: Bind + IntoArguments<Self>, Row: Columns>
{
    /// How many messages a runtime handles at once by default: SQLite has one writer at a time,
    /// so more workers there only wait for each other.
    const DEFAULT_WORKERS: usize;

    /// Whether one transaction at a time can write (SQLite): a runtime's workers then take
    /// turns at their batches in order, instead of in the database's busy handler, which
    /// sleeps between tries (a worker waiting there would hold a small batch, where waiting
    /// for its turn it fills one). One message per transaction gathers nothing while it waits,
    /// and its workers begin their own.
    const ONE_WRITER: bool = false;

    /// A setting the guard is written for that persists in the database, applied by
    /// [`migrate`](schema::migrate) before the migrations (SQLite: write-ahead logging, so
    /// readers and the one writer do not block each other); `None` where there is none.
    const DATABASE_SETTING: Option<&'static str> = None;

    /// The database's statements.
    const SQL: Statements;

    /// The statement that begins the transaction guarding one message, at the isolation the
    /// guard is written for (PostgreSQL, MySQL: `READ COMMITTED`; SQLite: `BEGIN IMMEDIATE`, so
    /// the write lock is taken up front instead of failing on upgrade).
    const BEGIN: &'static str;

    /// A consumer's parked, failed and dead messages: `(status, count, oldest age in seconds)`
    /// for each, the consumer bound once per status (see [`health::backlog`]).
    const HEALTH_BACKLOG: &'static str = health::POSTGRES_BACKLOG;

    /// Begins a guarded transaction on a connection of its own from `pool`.
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'static, Self>, sqlx::Error>> + Send {
        pool.begin_with(Self::BEGIN)
    }

    /// The statement that begins a guarded transaction whose handler has `timeout` to finish:
    /// [`Backend::BEGIN`], and where the database can bound every statement (PostgreSQL:
    /// `SET LOCAL statement_timeout`, in the same round trip), that bound. A handler stuck in a
    /// statement past its attempt (a lock wait, a `pg_sleep`) is then ended by the server, and
    /// lets go of the stream lock, instead of holding it for as long as the statement lasts.
    fn begin_within(_timeout: std::time::Duration) -> sqlx::SqlStr {
        sqlx::SqlSafeStr::into_sql_str(Self::BEGIN)
    }

    /// Begins a guarded transaction on `connection`, which stays the caller's once it ends.
    fn begin_on(
        connection: &mut Self::Connection,
    ) -> impl Future<Output = Result<Transaction<'_, Self>, sqlx::Error>> + Send {
        connection.begin_with(Self::BEGIN)
    }

    /// How many rows a statement wrote or matched.
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// The database's migrations.
    fn migrations() -> Migrator;

    /// The schema as plain DDL, for teams that run their own migrations.
    fn schema_sql() -> &'static str;

    /// Deletes the PostgreSQL queue row a delivery was claimed from, in the guarded transaction
    /// on `connection` (see [the queue](crate::queue)); nothing (the default) where the database
    /// holds no queue: the delivery's acknowledgement deletes the row.
    fn dequeue(
        connection: &mut Self::Connection,
        receipt: &QueueReceipt,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (connection, receipt);
        async { Ok(()) }
    }

    /// A stream that yields whenever a transaction that wrote to the outbox commits, to wake
    /// the relay; `None` (the default) where the database cannot say, and the relay polls.
    fn outbox_wakeups(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Option<BoxStream<'static, ()>>> + Send {
        let _ = pool;
        async { None }
    }
}

/// A statement that writes a row and gives back one of its columns: in one statement where the
/// database has `RETURNING`, else a write and then a read of the row it holds locked.
#[derive(Debug, Clone, Copy)]
pub enum Returning {
    /// `... RETURNING column`.
    Inline(&'static str),
    /// The write, then (if it touched a row) the read.
    ThenRead {
        /// The write.
        write: &'static str,
        /// The read, with parameters of its own.
        read: &'static str,
    },
}

/// Every statement of one database, by who runs them. Each takes its parameters once and in
/// the order its function documents, so one list of parameters fits every placeholder style.
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    /// Dedup rows.
    pub messages: MessageSql,
    /// Stream rows and strict ordering.
    pub streams: StreamSql,
    /// What operators read and resolve.
    pub operators: OperatorSql,
    /// The purge.
    pub purge: PurgeSql,
    /// The outbox and its relay.
    pub outbox: OutboxSql,
    /// A batch's claims and stream advances, many rows a statement.
    pub batch: BatchSql,
    /// What is kept for operators: consumers, operators' actions, conflicts.
    pub records: operators::RecordSql,
    /// The schema check.
    pub check_schema: &'static str,
    /// The unique indexes of a table (`$1`), a row per index and column: the index's name, then
    /// the column's ([`schema::check`]).
    pub unique_keys: &'static str,
}

/// The statements on dedup rows.
#[derive(Debug, Clone, Copy)]
pub struct MessageSql {
    /// Inserts a `processed` row; a row already there is left alone (no row written, or a
    /// unique violation, which the caller takes as the same answer) ([`messages::claim`]).
    pub claim: &'static str,
    /// Claims as [`MessageSql::claim`] and reads the row already there as [`MessageSql::seen`], in
    /// one statement ([`messages::claim`]): one row of `NULL`s when it inserted, the row there
    /// otherwise, and no row for one the statement could not see (committed after it began: claim
    /// again). `None` where the database cannot write and read in one statement (SQLite, whose
    /// statements cost no round trip, and MySQL).
    pub claim_or_seen: Option<&'static str>,
    /// As [`MessageSql::claim_or_seen`], and when it inserted, advances the message's stream as
    /// [`StreamSql::advance`] does, in the same statement ([`messages::claim_advancing`]): the row
    /// it inserted says in a fourth column how many streams moved (1, or 0 when the message is
    /// stale). `None` where the database has no such statement.
    pub claim_and_advance: Option<&'static str>,
    /// Takes a due `failed` row of the same content for its next attempt; gives its attempt count ([`messages::claim`]).
    pub retry_claim: Returning,
    /// Reads a dedup row's hash, status and retry time ([`messages::seen`]).
    pub seen: &'static str,
    /// Inserts the `failed` row of a first failure, unless a row is there ([`messages::record_failure`]).
    pub insert_failure: &'static str,
    /// Counts one more failure on a `failed` or `parked` row of the same content ([`messages::record_failure`]).
    pub update_failure: Returning,
    /// Sets when a failed message is due ([`messages::schedule_retry`]).
    pub schedule_retry: &'static str,
    /// Puts a failed message's retry off by as long as it has been since its failure was
    /// recorded, within bounds ([`messages::postpone_retry`]).
    pub postpone_retry: &'static str,
    /// How to tell that the transaction can still commit ([`messages::check_open`]); `None`
    /// where nothing a handler meets ends it under the guard (SQLite: a failed statement aborts
    /// only itself).
    pub check_open: Option<OpenProbe>,
    /// [`check_open`](Self::check_open) and `COMMIT` in one round trip, then a `BEGIN` of an
    /// empty transaction for the `Transaction` to roll back ([`messages::commit_checked`]); `None`
    /// where they are sent one by one.
    pub check_and_commit: Option<&'static str>,
    /// Marks a failed or parked message dead ([`messages::bury`]).
    pub bury: &'static str,
    /// Sets a row `processed` or `stale`, dropping its payload ([`messages::settle`]).
    pub settle: &'static str,
    /// Reads a row's status, payload and headers ([`messages::stored`]).
    pub stored: &'static str,
    /// An operator's replay of a dead or failed message ([`messages::resolve`]).
    pub replay: &'static str,
    /// An operator's discard of a dead or failed message ([`messages::resolve`]).
    pub discard: &'static str,
    /// Keeps a delivery that could not be handled; gives its number ([`messages::reject`]).
    pub reject: Returning,
}

/// The statements on stream rows and parked messages.
#[derive(Debug, Clone, Copy)]
pub struct StreamSql {
    /// Creates or advances the stream in one statement, writing a row only when the sequence is
    /// newer; `None` where the database cannot say which (MySQL): then the stream is locked,
    /// compared and set.
    pub advance: Option<&'static str>,
    /// Locks the stream row, creating it at the value of its last parameter; gives the last
    /// applied sequence ([`streams::lock`]).
    pub lock: Returning,
    /// Moves a locked stream ([`streams::set`]).
    pub set: &'static str,
    /// Parks a claimed message with its payload ([`streams::park`]).
    pub park: &'static str,
    /// A stream's lowest parked message up to a sequence ([`streams::next_parked`]).
    pub next_parked: &'static str,
    /// Whether a stream has parked messages ([`streams::has_parked`]).
    pub has_parked: &'static str,
    /// A handler's aggregates with a parked message that can apply ([`streams::releasable`]).
    pub releasable: &'static str,
    /// Parks again what a gap timeout buried ([`streams::skip_gap`]).
    pub revive_gap_dead: &'static str,
    /// Whether a stream's missing sequence is there, `failed` ([`streams::bury_gap`]).
    pub retrying_sequence: &'static str,
    /// A stream's lowest `failed` sequence past a given one ([`streams::skip_gap`]).
    pub first_retrying: &'static str,
    /// A stream's lowest parked sequence and parked count ([`streams::skip_gap`], [`streams::bury_gap`]).
    pub parked_range: &'static str,
    /// Marks a stream's parked messages dead by gap timeout ([`streams::bury_gap`]).
    pub bury_parked: &'static str,
    /// A handler's aggregates parked behind a gap for too long ([`streams::overdue_gaps`]).
    pub overdue_gaps: &'static str,
    /// How many of a stream's parked messages have waited longer than a timeout
    /// ([`streams::bury_gap`]).
    pub parked_overdue: &'static str,
}

/// The statements operators run.
#[derive(Debug, Clone, Copy)]
pub struct OperatorSql {
    /// A consumer's unresolved rejected deliveries ([`operators::rejected`]).
    pub rejected: &'static str,
    /// One unresolved rejected delivery ([`operators::rejected_one`]).
    pub rejected_one: &'static str,
    /// An operator's replay or discard of a rejected delivery ([`operators::resolve_rejected`]).
    pub resolve_rejected: &'static str,
    /// Unresolved rejected deliveries per consumer ([`operators::rejected_counts`]).
    pub rejected_counts: &'static str,
    /// A consumer's dead letters, filtered and paged ([`operators::dead_letters`]).
    pub dead_letters: &'static str,
    /// One dedup row as operators see it ([`operators::show`]).
    pub show: &'static str,
    /// A consumer's rows of one status ([`operators::list`]).
    pub list: &'static str,
    /// A handler's failed messages whose retry is due ([`operators::due_retries`]).
    pub due_retries: &'static str,
    /// Parked and dead messages per handler ([`operators::backlog`]).
    pub backlog: &'static str,
    /// Rows per status, per consumer and handler ([`operators::status`]).
    pub status: &'static str,
    /// The space the inbox takes ([`operators::storage_bytes`]).
    pub storage_bytes: &'static str,
}

/// The statements a batch runs once for all its messages ([`bulk`]). Each takes the consumer,
/// then a JSON array of rows.
#[derive(Debug, Clone, Copy)]
pub struct BatchSql {
    /// Inserts a `processed` row per claim unless one is there ([`bulk::claim`]).
    pub claim: BulkClaim,
    /// Reads the dedup rows there for a list of keys ([`bulk::seen`]).
    pub seen: &'static str,
    /// Creates or advances streams, moving only those whose sequence is newer
    /// ([`bulk::advance`]).
    pub advance: BulkAdvance,
    /// Reads the last applied sequence of a list of streams ([`bulk::last_sequences`]).
    pub last_sequences: &'static str,
    /// Sets a list of dedup rows `stale` ([`bulk::settle_stale`]).
    pub settle_stale: &'static str,
}

/// How a bulk claim tells the rows it inserted from those that were there.
#[derive(Debug, Clone, Copy)]
pub enum BulkClaim {
    /// One statement, `INSERT ... ON CONFLICT DO NOTHING RETURNING` the keys it inserted.
    Returning(&'static str),
    /// The rows there are read first ([`BatchSql::seen`]), then a plain `INSERT` writes the
    /// others: a row another transaction wrote in between is a unique violation, which refuses
    /// the batch (its messages then go one per transaction), never a row taken for new.
    ReadThenInsert(&'static str),
}

/// How a bulk advance tells the streams it moved from those whose message was stale.
#[derive(Debug, Clone, Copy)]
pub enum BulkAdvance {
    /// One upsert that writes only the newer sequences, `RETURNING` the keys it wrote.
    Returning(&'static str),
    /// `lock` creates the missing streams at 0 and locks them all, as
    /// [`StreamSql::lock`] does one; their last sequences are read
    /// ([`BatchSql::last_sequences`]) and `set` moves those behind their message's sequence.
    LockThenSet {
        /// Creates (just before its first sequence, so that it applies) or touches every
        /// stream, in key order.
        lock: &'static str,
        /// Moves each stream to its sequence.
        set: &'static str,
    },
}

/// A statement that tells whether a transaction can still commit ([`messages::check_open`]).
#[derive(Debug, Clone, Copy)]
pub enum OpenProbe {
    /// Fails on a transaction that can no longer commit (PostgreSQL aborts a transaction at its
    /// first failed statement).
    FailsOnceAborted(&'static str),
    /// Refused with SQLSTATE `25001` ("a transaction is active") while the transaction is open,
    /// and run once the server has rolled it back (MySQL rolls a whole transaction back for a
    /// deadlock it chose it for, and the statements after it would commit on their own). Run
    /// after every handler, in a batch too ([`messages::ends_whole`]).
    RefusedWhileOpen(&'static str),
}

/// The statements on the outbox ([`outbox`]).
#[derive(Debug, Clone, Copy)]
pub struct OutboxSql {
    /// Counts one more message of an aggregate, taking its row's lock until the transaction
    /// ends; gives the message's sequence in its aggregate ([`outbox::write`]).
    pub advance: Returning,
    /// Writes a message ([`outbox::write`]).
    pub insert: &'static str,
    /// Locks the due pending messages that are first of their aggregate, in the order they fell
    /// due, skipping those another relay holds ([`outbox::claim`]).
    pub claim: &'static str,
    /// Reserves a claimed message for its relay until a time ([`outbox::claim`]).
    pub lease: &'static str,
    /// Counts a claimed message's earlier unpublished ones, in a statement of its own, where the
    /// claim's order check may read an older snapshot than its locking read (MySQL: a locking
    /// read sees the latest rows, its subquery those at the statement's start); `None` where the
    /// claim reads one snapshot ([`outbox::claim`]).
    pub recheck: Option<&'static str>,
    /// Marks a message published unless it is already ([`outbox::mark_published`]).
    pub published: &'static str,
    /// Counts a failed publication and says when to try again, or that the relay gave up,
    /// while the claim it was made under still holds ([`outbox::mark_failed`]).
    pub failed: &'static str,
    /// Messages of two statuses, in the order they were written ([`outbox::list`]).
    pub list: &'static str,
    /// Makes one failed message pending again ([`outbox::retry`]).
    pub retry: &'static str,
    /// Makes every failed message pending again ([`outbox::retry`]).
    pub retry_all: &'static str,
    /// Pending and failed messages, and when the oldest was written ([`outbox::backlog`]).
    pub backlog: &'static str,
    /// Deletes one batch of messages published before a time, oldest first ([`outbox::purge`]).
    pub purge: &'static str,
}

/// The statements of the purge.
#[derive(Debug, Clone, Copy)]
pub struct PurgeSql {
    /// What a window would delete and keep ([`purge::preview`]).
    pub preview: &'static str,
    /// Deletes one batch of processed and stale rows, oldest first ([`purge::batch`]).
    pub batch: &'static str,
    /// Deletes one batch of what operators resolved before a time, oldest first: the discarded
    /// dead letters, the rejected deliveries replayed or discarded, the conflicts resolved, and
    /// the actions of operators whose row is gone (or, for a gap, older than the window), in the
    /// order of [`purge::Resolved::ALL`].
    pub resolved: [&'static str; 4],
    /// Takes the purge lock on a connection of its own, answering 1 if taken; `None` where
    /// writers take turns anyway (SQLite).
    pub lock: Option<&'static str>,
    /// Gives the purge lock back, before its connection closes: a server may release a closed
    /// connection's locks only some time after it closed. `None` where there is no lock.
    pub unlock: Option<&'static str>,
}

/// The name of the table that records which inbox migrations ran, kept apart from the
/// application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_inbox_migrations";

/// A dedup row's key, in the order of its placeholders.
pub(crate) fn key_params<'a>(key: &crate::keys::MessageKey<'a>) -> [Param<'a>; 3] {
    [
        Param::Text(key.consumer),
        Param::Text(key.handler),
        Param::Text(key.message_id),
    ]
}

/// A stream's key, in the order of its placeholders.
pub(crate) fn stream_params<'a>(stream: &crate::keys::Stream<'a>) -> [Param<'a>; 3] {
    [
        Param::Text(stream.consumer),
        Param::Text(stream.handler),
        Param::Text(stream.aggregate),
    ]
}

/// Runs a [`Returning`] statement.
pub(crate) async fn returning<DB: Backend, T: FromColumns>(
    conn: &mut DB::Connection,
    statement: Returning,
    write: &[Param<'_>],
    read: &[Param<'_>],
) -> Result<Option<T>, sqlx::Error> {
    match statement {
        Returning::Inline(sql) => sql::fetch_optional::<DB, T>(conn, sql, write).await,
        Returning::ThenRead {
            write: sql,
            read: then,
        } => {
            if sql::execute::<DB>(conn, sql, write).await? == 0 {
                return Ok(None);
            }
            sql::fetch_optional::<DB, T>(conn, then, read).await
        }
    }
}

/// Runs an insert that may find its row there already; `true` if it inserted.
pub(crate) async fn insert_unless_there<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<bool, sqlx::Error> {
    match sql::execute::<DB>(conn, sql, params).await {
        Ok(inserted) => Ok(inserted == 1),
        Err(sqlx::Error::Database(error)) if error.is_unique_violation() => Ok(false),
        Err(error) => Err(error),
    }
}
