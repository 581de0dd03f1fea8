//! SQLite: PostgreSQL's statements (it has `ON CONFLICT`, `RETURNING` and partial indexes too),
//! except for time arithmetic, the indexes it must be told to use (without statistics it would
//! rather walk the primary key of the consumer), bulk rows read with
//! `jsonb_each` (each row comes as binary JSON, so reading its fields does not parse its text
//! again for each one, as `json_each`'s text rows would: a third less time for a batch's claim),
//! no check that a transaction is still open (a failed statement aborts only itself), and the
//! file it lives in.
//! Transactions begin `IMMEDIATE`, taking the one write lock up front.

use crate::context::{Context, DatabaseHandle};
use sqlx::Sqlite;
use sqlx::migrate::Migrator;

use super::operators::RecordSql;
use super::postgres::{
    self, conflict_by_id, first_of_aggregate, kept_rejected, message_actions, open_conflicts,
    overdue_gaps, parked_overdue, parked_streams, rejected_actions, rejected_by_id, select_actions,
    select_conflicts, select_kept_rejected, select_outbox, select_stored,
};
use super::{
    Backend, BatchSql, BulkAdvance, BulkClaim, MessageSql, OperatorSql, OutboxSql, PurgeSql,
    Statements, StreamSql,
};

/// The time in `$column` as RFC 3339 text, to the second (SQLite keeps UTC text).
macro_rules! rfc3339 {
    ($column:literal) => {
        concat!("strftime('%Y-%m-%dT%H:%M:%SZ', ", $column, ")")
    };
}

/// `received_at` and `failed_at` in RFC 3339.
macro_rules! select_stored_utc {
    () => {
        select_stored!(concat!(
            rfc3339!("received_at"),
            ", ",
            rfc3339!("failed_at")
        ))
    };
}

/// SQLite's statements.
const SQL: Statements = Statements {
    messages: MessageSql {
        postpone_retry: "UPDATE inbox_messages SET retry_at_ms = $1 + min($2, max($3, \
            COALESCE(CAST((julianday('now') - julianday(failed_at)) * 86400000 AS INTEGER), 0))) \
            WHERE consumer = $4 AND handler = $5 AND message_id = $6 AND status = 'failed'",
        check_open: None,
        check_and_commit: None,
        claim_or_seen: None,
        claim_and_advance: None,
        ..postgres::SQL.messages
    },
    streams: StreamSql {
        overdue_gaps: overdue_gaps!("$1", "$2", "datetime('now', '-' || $3 || ' seconds')"),
        parked_overdue: parked_overdue!(
            "$1",
            "$2",
            "$3",
            "datetime('now', '-' || $4 || ' seconds')"
        ),
        ..postgres::SQL.streams
    },
    operators: OperatorSql {
        dead_letters: concat!(
            select_stored_utc!(),
            "WHERE consumer = $1 AND status = 'dead' AND handler = COALESCE($2, handler) \
             AND message_type = COALESCE($3, message_type) \
             AND ($4 OR failed_at >= datetime('now', '-' || $5 || ' seconds')) \
             ORDER BY handler, aggregate_id, sequence_number, message_id LIMIT $6 OFFSET $7"
        ),
        show: concat!(
            select_stored_utc!(),
            "WHERE consumer = $1 AND handler = $2 AND message_id = $3"
        ),
        list: concat!(
            select_stored_utc!(),
            "WHERE consumer = $1 AND status = $2 ORDER BY handler, aggregate_id, sequence_number, message_id"
        ),
        due_retries: "SELECT message_id FROM inbox_messages INDEXED BY inbox_messages_retry_due \
            WHERE consumer = $1 AND handler = $2 AND status = 'failed' AND retry_at_ms <= $3 \
            ORDER BY retry_at_ms LIMIT $4",
        backlog: "SELECT handler, 'parked' AS status, COUNT(*) FROM inbox_messages INDEXED BY inbox_messages_parked \
            WHERE consumer = $1 AND status = 'parked' GROUP BY handler \
            UNION ALL SELECT handler, 'dead' AS status, COUNT(*) FROM inbox_messages \
            WHERE consumer = $2 AND status = 'dead' GROUP BY handler",
        status: "SELECT consumer, handler, \
            SUM(CASE WHEN status = 'processed' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN status = 'stale' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN status = 'parked' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END), \
            SUM(CASE WHEN status = 'discarded' THEN 1 ELSE 0 END), \
            MAX(CASE WHEN status = 'parked' THEN (julianday('now') - julianday(received_at)) * 86400.0 END) \
            FROM inbox_messages GROUP BY consumer, handler ORDER BY consumer, handler",
        storage_bytes: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        ..postgres::SQL.operators
    },
    purge: PurgeSql {
        preview: "SELECT \
            (SELECT COUNT(*) FROM inbox_messages WHERE status IN ('processed', 'stale') \
             AND processed_at < datetime('now', '-' || $1 || ' seconds')), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'parked' \
             AND received_at < datetime('now', '-' || $2 || ' seconds')), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'dead' \
             AND COALESCE(failed_at, received_at) < datetime('now', '-' || $3 || ' seconds')), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'discarded' \
             AND resolved_at < datetime('now', '-' || $4 || ' seconds')) \
            + (SELECT COUNT(*) FROM inbox_rejected WHERE resolution IN ('replayed', 'discarded') \
             AND resolved_at < datetime('now', '-' || $5 || ' seconds')) \
            + (SELECT COUNT(*) FROM inbox_conflicts WHERE resolution IS NOT NULL \
             AND resolved_at < datetime('now', '-' || $6 || ' seconds')), \
            (SELECT COUNT(*) FROM inbox_rejected \
             WHERE (resolution IS NULL OR resolution = 'replay_requested') \
             AND received_at < datetime('now', '-' || $7 || ' seconds'))",
        batch: "DELETE FROM inbox_messages WHERE (consumer, handler, message_id) IN \
            (SELECT consumer, handler, message_id FROM inbox_messages \
            WHERE status IN ('processed', 'stale') AND processed_at < datetime('now', '-' || $1 || ' seconds') \
            ORDER BY processed_at LIMIT $2)",
        resolved: [
            "DELETE FROM inbox_messages WHERE rowid IN (SELECT rowid FROM inbox_messages \
            WHERE status = 'discarded' AND resolved_at < datetime('now', '-' || $1 || ' seconds') \
            ORDER BY resolved_at LIMIT $2)",
            "DELETE FROM inbox_rejected WHERE id IN (SELECT id FROM inbox_rejected \
            WHERE resolution IN ('replayed', 'discarded') AND resolved_at < datetime('now', '-' || $1 || ' seconds') \
            ORDER BY resolved_at LIMIT $2)",
            "DELETE FROM inbox_conflicts WHERE id IN (SELECT id FROM inbox_conflicts \
            WHERE resolution IS NOT NULL AND resolved_at < datetime('now', '-' || $1 || ' seconds') \
            ORDER BY resolved_at LIMIT $2)",
            // An action whose message or rejected delivery is gone (a gap's has neither).
            "DELETE FROM inbox_actions WHERE id IN (SELECT a.id FROM inbox_actions a \
            WHERE a.performed_at < datetime('now', '-' || $1 || ' seconds') \
            AND NOT EXISTS (SELECT 1 FROM inbox_messages m WHERE m.consumer = a.consumer \
            AND m.handler = a.handler AND m.message_id = a.message_id) \
            AND NOT EXISTS (SELECT 1 FROM inbox_rejected r WHERE r.id = a.rejected_id) \
            ORDER BY a.performed_at LIMIT $2)",
        ],
        lock: None,
        unlock: None,
    },
    // One writer at a time: no lock order to keep. `WHERE true` tells the upsert from a join.
    batch: BatchSql {
        claim: BulkClaim::Returning(
            "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
            SELECT $1, r.value ->> 'handler', r.value ->> 'message_id', r.value ->> 'message_type', \
            r.value ->> 'aggregate_id', r.value ->> 'sequence_number', 'processed', \
            unhex(r.value ->> 'payload_hash'), CURRENT_TIMESTAMP FROM jsonb_each($2) AS r WHERE true \
            ON CONFLICT (consumer, handler, message_id) DO NOTHING RETURNING handler, message_id",
        ),
        seen: "SELECT m.payload_hash, m.status, m.retry_at_ms, m.handler, m.message_id \
            FROM jsonb_each($2) AS r CROSS JOIN inbox_messages m \
            WHERE m.consumer = $1 AND m.handler = r.value ->> 'handler' \
            AND m.message_id = r.value ->> 'message_id'",
        advance: BulkAdvance::Returning(
            "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
            SELECT $1, r.value ->> 'handler', r.value ->> 'aggregate_id', r.value ->> 'sequence_number' \
            FROM jsonb_each($2) AS r WHERE true \
            ON CONFLICT (consumer, handler, aggregate_id) \
            DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
            WHERE inbox_streams.last_sequence < excluded.last_sequence RETURNING handler, aggregate_id",
        ),
        last_sequences: "SELECT s.handler, s.aggregate_id, s.last_sequence \
            FROM jsonb_each($2) AS r CROSS JOIN inbox_streams s \
            WHERE s.consumer = $1 AND s.handler = r.value ->> 'handler' \
            AND s.aggregate_id = r.value ->> 'aggregate_id'",
        settle_stale: "UPDATE inbox_messages \
            SET status = 'stale', payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
            WHERE rowid IN (SELECT m.rowid FROM jsonb_each($2) AS r CROSS JOIN inbox_messages m \
            WHERE m.consumer = $1 AND m.handler = r.value ->> 'handler' \
            AND m.message_id = r.value ->> 'message_id')",
    },
    // No row locks: the relay's transaction holds the one write lock instead.
    outbox: OutboxSql {
        claim: concat!(
            select_outbox!(),
            "INDEXED BY inbox_outbox_due WHERE status = 'pending' AND due_at_ms <= $1 AND ",
            first_of_aggregate!(),
            " ORDER BY due_at_ms, position LIMIT $2"
        ),
        ..postgres::SQL.outbox
    },
    records: RECORDS,
    // Whole-table unique indexes only, the primary key's among them (an expression has no
    // column name: it matches no key).
    unique_keys: "SELECT l.name, COALESCE(i.name, '') \
        FROM pragma_index_list($1) AS l, pragma_index_info(l.name) AS i \
        WHERE l.\"unique\" = 1 AND l.partial = 0",
    ..postgres::SQL
};

/// SQLite's statements on what is kept for operators: PostgreSQL's, but for times.
pub(super) const RECORDS: RecordSql = RecordSql {
    kept_rejected: kept_rejected!(rfc3339!("received_at")),
    rejected_by_id: rejected_by_id!(rfc3339!("received_at")),
    message_actions: message_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
    rejected_actions: rejected_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
    conflicts: open_conflicts!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
    conflict: conflict_by_id!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
    ..postgres::RECORDS
};

/// A handler may take the guarded transaction as a plain `&mut sqlx::SqliteConnection`.
impl<'t> DatabaseHandle<'t, Sqlite> for sqlx::SqliteConnection {
    fn from_context<'c>(ctx: &'c mut Context<'t, Sqlite>) -> &'c mut Self {
        ctx
    }
}

impl Backend for Sqlite {
    const DEFAULT_WORKERS: usize = 1;
    const ONE_WRITER: bool = true;
    const DATABASE_SETTING: Option<&'static str> = Some("PRAGMA journal_mode = WAL");
    const SQL: Statements = SQL;

    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    const HEALTH_BACKLOG: &'static str = super::health::SQLITE_BACKLOG;

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn migrations() -> Migrator {
        sqlx::migrate!("./migrations/sqlite")
    }

    fn schema_sql() -> &'static str {
        concat!(
            include_str!("../../migrations/sqlite/0001_inbox.sql"),
            include_str!("../../migrations/sqlite/0002_strict_ordering.sql"),
            include_str!("../../migrations/sqlite/0003_failures.sql"),
            include_str!("../../migrations/sqlite/0004_operations.sql"),
            include_str!("../../migrations/sqlite/0005_retries.sql"),
            include_str!("../../migrations/sqlite/0006_outbox.sql"),
            include_str!("../../migrations/sqlite/0007_actions.sql"),
            include_str!("../../migrations/sqlite/0008_conflicts.sql"),
            include_str!("../../migrations/sqlite/0009_messages_rowid.sql"),
            include_str!("../../migrations/sqlite/0010_retention.sql"),
            include_str!("../../migrations/sqlite/0011_rejected_open.sql"),
            include_str!("../../migrations/sqlite/0012_outbox_refusals.sql"),
            include_str!("../../migrations/sqlite/0013_outbox_due_order.sql"),
        )
    }
}

/// Connection options for an embedded SQLite database as the inbox wants it: write-ahead log,
/// `synchronous = FULL` (a commit is on disk before the delivery is acknowledged), a busy timeout
/// so concurrent writers wait instead of failing, a page cache of up to 64 MiB per connection
/// (SQLite's default is 2 MiB; message ids are random, so a claim touches the dedup index at
/// random places, and every page missing from the cache is a read), temporary files in memory
/// (a batch's bulk claim changes more pages than SQLite keeps of a statement's journal in memory
/// by default, 64 KiB, and the rest went to a temporary file, written and deleted for every
/// batch: its claim took a third longer), and the file created if missing. Another cache size is
/// one more `.pragma("cache_size", ..)` on what this returns.
///
/// ```
/// # use inbox_core as inbox;
/// # async fn demo() -> Result<(), sqlx::Error> {
/// let pool = sqlx::SqlitePool::connect_with(inbox::sqlite_options("sqlite://app.db")?).await?;
/// # Ok(()) }
/// ```
pub fn sqlite_options(url: &str) -> Result<sqlx::sqlite::SqliteConnectOptions, sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use std::str::FromStr;

    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(std::time::Duration::from_secs(30))
        // In KiB when negative.
        .pragma("cache_size", "-65536")
        .pragma("temp_store", "memory"))
}
