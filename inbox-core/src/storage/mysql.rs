//! MySQL 8 and MariaDB 10.11 (InnoDB), behind the `mysql` feature.
//!
//! What it says differently from PostgreSQL:
//! - `?` placeholders (each statement takes its parameters once, in order, on every database);
//! - no `RETURNING` on `UPDATE` (nor on `INSERT` in MySQL): a write, then a read of the row the
//!   transaction now holds locked ([`Returning::ThenRead`]);
//! - no `ON CONFLICT DO NOTHING`: the claim is a plain `INSERT`, whose duplicate-key error is the
//!   answer "already there" (an error inside a MySQL transaction undoes only that statement);
//!   `INSERT IGNORE` would also turn a too-long value into a silently truncated one;
//! - the client reports rows *matched*, not changed, so an upsert cannot say whether it advanced
//!   a stream: the stream is locked, compared and set instead (`advance: None`);
//! - `READ COMMITTED`, pinned per transaction: under `REPEATABLE READ` the gap locks of two claims
//!   deadlock each other;
//! - no partial indexes: a generated column and composite indexes (see the migration);
//! - a failed statement aborts only itself, but a deadlock the server chose the transaction for
//!   rolls all of it back, and the statements after it commit on their own: after each handler
//!   (in a batch too) and before a batch commits, the transaction is checked with a statement
//!   refused only while one is active (`SET TRANSACTION`, SQLSTATE `25001`);
//! - a batch's rows come as a table from `JSON_TABLE`, joined to the inbox's tables in the order
//!   written (`STRAIGHT_JOIN`: each row one lookup of its key, whatever the statistics say); with
//!   no `RETURNING` to say which rows a statement wrote, its bulk claim reads the rows there
//!   first and inserts the others ([`BulkClaim::ReadThenInsert`]), and its bulk advance locks
//!   every stream, reads them and moves those behind ([`BulkAdvance::LockThenSet`]);
//! - `GET_LOCK` for the purge leader, `DATE_FORMAT` and `TIMESTAMPDIFF` for times.

use crate::context::{Context, DatabaseHandle};
use sqlx::MySql;
use sqlx::migrate::Migrator;

use super::operators::RecordSql;
use super::postgres::{
    first_of_aggregate, overdue_gaps, parked_overdue, parked_streams, releasable, select_actions,
    select_conflicts, select_kept_rejected, select_outbox, select_stored,
};
use super::schema;
use super::{
    Backend, BatchSql, BulkAdvance, BulkClaim, MessageSql, OpenProbe, OperatorSql, OutboxSql,
    PurgeSql, Returning, Statements, StreamSql,
};

/// The time in `$column` as RFC 3339 text, to the second (the session's time zone is UTC).
macro_rules! rfc3339 {
    ($column:literal) => {
        concat!("DATE_FORMAT(", $column, ", '%Y-%m-%dT%H:%i:%sZ')")
    };
}

/// `received_at` and `failed_at` in RFC 3339, UTC.
macro_rules! select_stored_utc {
    () => {
        select_stored!(concat!(
            rfc3339!("received_at"),
            ", ",
            rfc3339!("failed_at")
        ))
    };
}

/// A text column of a batch's rows: as long as any value sent (the column it goes to refuses
/// what is too long for it, where `JSON_TABLE` would cut it short). It has the character set's
/// default collation, so a comparison with a table's column takes that column's binary NO PAD
/// one (a `_bin` collation wins over a `_ci` one): byte for byte, and by the column's index.
macro_rules! text_column {
    ($name:literal) => {
        concat!(
            $name,
            " VARCHAR(2048) CHARACTER SET utf8mb4 PATH '$.",
            $name,
            "'"
        )
    };
}

/// The rows of a batch's JSON document (the statement's second parameter) as table `r`, with
/// the columns given. The document goes through `JSON_EXTRACT`: MySQL takes a constant, a
/// column or a function call as `JSON_TABLE`'s source.
macro_rules! batch_rows {
    ($first:expr $(, $column:expr)*) => {
        concat!(
            "JSON_TABLE(JSON_EXTRACT(?, '$'), '$[*]' COLUMNS (",
            $first,
            $(", ", $column,)*
            ")) AS r"
        )
    };
}

/// The consumer (the statement's first parameter) as table `c`, then the rows of a batch's
/// document with the columns given, then `table`: the order in which `STRAIGHT_JOIN` reads them.
macro_rules! consumer_rows_then {
    ($table:literal, $($column:expr),+) => {
        concat!(
            "(SELECT CONVERT(? USING utf8mb4) AS consumer) AS c STRAIGHT_JOIN ",
            batch_rows!($($column),+),
            " STRAIGHT_JOIN ",
            $table
        )
    };
}

/// A batch's dedup rows, each found by its key.
macro_rules! batch_messages {
    () => {
        concat!(
            consumer_rows_then!(
                "inbox_messages AS m",
                text_column!("handler"),
                text_column!("message_id")
            ),
            " ON m.consumer = c.consumer AND m.handler = r.handler AND m.message_id = r.message_id"
        )
    };
}

/// A batch's streams, each found by its key, with the rows' further columns given.
macro_rules! batch_streams {
    ($($column:expr),*) => {
        concat!(
            consumer_rows_then!(
                "inbox_streams AS s",
                text_column!("handler"),
                text_column!("aggregate_id")
                $(, $column)*
            ),
            " ON s.consumer = c.consumer AND s.handler = r.handler AND s.aggregate_id = r.aggregate_id"
        )
    };
}

/// MySQL's statements.
const SQL: Statements = Statements {
    messages: MessageSql {
        claim: "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
            VALUES (?, ?, ?, ?, ?, ?, 'processed', ?, CURRENT_TIMESTAMP(6))",
        claim_or_seen: None,
        claim_and_advance: None,
        retry_claim: Returning::ThenRead {
            write: "UPDATE inbox_messages \
                SET status = 'processed', payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP(6) \
                WHERE consumer = ? AND handler = ? AND message_id = ? AND status = 'failed' \
                AND payload_hash = ? AND retry_at_ms <= ?",
            read: "SELECT attempt_count FROM inbox_messages WHERE consumer = ? AND handler = ? AND message_id = ?",
        },
        seen: "SELECT payload_hash, status, retry_at_ms FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND message_id = ?",
        insert_failure: "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, \
             payload, headers, attempt_count, first_error, error_text, failed_at, retry_at_ms) \
            VALUES (?, ?, ?, ?, ?, ?, 'failed', ?, ?, ?, 1, ?, ?, CURRENT_TIMESTAMP(6), ?)",
        update_failure: Returning::ThenRead {
            write: "UPDATE inbox_messages SET status = 'failed', attempt_count = attempt_count + 1, \
                error_text = ?, first_error = COALESCE(first_error, ?), payload = ?, headers = ?, \
                processed_at = NULL, failed_at = CURRENT_TIMESTAMP(6), retry_at_ms = ? \
                WHERE consumer = ? AND handler = ? AND message_id = ? \
                AND status IN ('failed', 'parked') AND payload_hash = ?",
            read: "SELECT attempt_count FROM inbox_messages WHERE consumer = ? AND handler = ? AND message_id = ?",
        },
        schedule_retry: "UPDATE inbox_messages SET retry_at_ms = ? \
            WHERE consumer = ? AND handler = ? AND message_id = ?",
        postpone_retry: "UPDATE inbox_messages SET retry_at_ms = ? + LEAST(?, GREATEST(?, \
            COALESCE(TIMESTAMPDIFF(MICROSECOND, failed_at, CURRENT_TIMESTAMP(6)) DIV 1000, 0))) \
            WHERE consumer = ? AND handler = ? AND message_id = ? AND status = 'failed'",
        // Refused (25001) inside a transaction; outside one it sets what the next is, which
        // every transaction of the guard sets again when it begins.
        check_open: Some(OpenProbe::RefusedWhileOpen("SET TRANSACTION READ WRITE")),
        check_and_commit: None,
        bury: "UPDATE inbox_messages SET status = 'dead', error_text = COALESCE(?, error_text), dead_reason = ? \
            WHERE consumer = ? AND handler = ? AND message_id = ? AND status IN ('failed', 'parked')",
        settle: "UPDATE inbox_messages \
            SET status = ?, payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP(6) \
            WHERE consumer = ? AND handler = ? AND message_id = ?",
        stored: "SELECT status, payload, headers FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND message_id = ?",
        replay: "UPDATE inbox_messages SET status = 'failed', attempt_count = 0, retry_at_ms = 0, \
            resolution = 'replayed', resolved_by = ?, resolved_reason = ?, resolved_at = CURRENT_TIMESTAMP(6) \
            WHERE consumer = ? AND handler = ? AND message_id = ? AND status IN ('dead', 'failed')",
        discard: "UPDATE inbox_messages SET status = 'discarded', \
            resolution = 'discarded', resolved_by = ?, resolved_reason = ?, resolved_at = CURRENT_TIMESTAMP(6) \
            WHERE consumer = ? AND handler = ? AND message_id = ? AND status IN ('dead', 'failed')",
        reject: Returning::ThenRead {
            write: "INSERT INTO inbox_rejected (consumer, message_type, delivery_id, payload, headers, reason) \
                VALUES (?, ?, ?, ?, ?, ?)",
            read: "SELECT CAST(LAST_INSERT_ID() AS SIGNED)",
        },
    },
    streams: StreamSql {
        advance: None,
        lock: Returning::ThenRead {
            write: "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
                VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE updated_at = CURRENT_TIMESTAMP(6)",
            read: "SELECT last_sequence FROM inbox_streams WHERE consumer = ? AND handler = ? AND aggregate_id = ?",
        },
        set: "UPDATE inbox_streams SET last_sequence = ?, updated_at = CURRENT_TIMESTAMP(6) \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ?",
        park: "UPDATE inbox_messages SET status = 'parked', payload = ?, headers = ?, processed_at = NULL \
            WHERE consumer = ? AND handler = ? AND message_id = ?",
        next_parked: "SELECT message_id, sequence_number, payload, headers FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'parked' \
            AND sequence_number <= ? ORDER BY sequence_number LIMIT 1",
        has_parked: "SELECT COUNT(*) FROM (SELECT 1 FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'parked' LIMIT 1) AS parked",
        releasable: releasable!("?", "?"),
        revive_gap_dead: "UPDATE inbox_messages SET status = 'parked', error_text = NULL, dead_reason = NULL \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'dead' \
            AND dead_reason = 'gap_timeout'",
        retrying_sequence: "SELECT COUNT(*) FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND sequence_number = ? AND status = 'failed'",
        first_retrying: "SELECT MIN(sequence_number) FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'failed' \
            AND sequence_number > ?",
        parked_range: "SELECT MIN(sequence_number), COUNT(*) FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'parked'",
        bury_parked: "UPDATE inbox_messages SET status = 'dead', error_text = ?, dead_reason = 'gap_timeout' \
            WHERE consumer = ? AND handler = ? AND aggregate_id = ? AND status = 'parked'",
        overdue_gaps: overdue_gaps!(
            "?",
            "?",
            "NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND"
        ),
        parked_overdue: parked_overdue!(
            "?",
            "?",
            "?",
            "NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND"
        ),
    },
    operators: OperatorSql {
        rejected: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
            WHERE consumer = ? AND resolution IS NULL ORDER BY id",
        rejected_one: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
            WHERE consumer = ? AND id = ? AND (resolution IS NULL OR resolution = 'replay_requested')",
        resolve_rejected: "UPDATE inbox_rejected \
            SET resolution = ?, resolved_by = ?, resolved_reason = ?, resolved_at = CURRENT_TIMESTAMP(6) \
            WHERE consumer = ? AND id = ? AND (resolution IS NULL OR resolution = 'replay_requested')",
        rejected_counts: "SELECT consumer, COUNT(*) FROM inbox_rejected \
            WHERE resolution IS NULL OR resolution = 'replay_requested' GROUP BY consumer ORDER BY consumer",
        dead_letters: concat!(
            select_stored_utc!(),
            "WHERE consumer = ? AND status = 'dead' AND handler = COALESCE(?, handler) \
             AND message_type = COALESCE(?, message_type) \
             AND (? OR failed_at >= NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND) \
             ORDER BY handler, aggregate_id, sequence_number, message_id LIMIT ? OFFSET ?"
        ),
        show: concat!(
            select_stored_utc!(),
            "WHERE consumer = ? AND handler = ? AND message_id = ?"
        ),
        list: concat!(
            select_stored_utc!(),
            "WHERE consumer = ? AND status = ? ORDER BY handler, aggregate_id, sequence_number, message_id"
        ),
        due_retries: "SELECT message_id FROM inbox_messages \
            WHERE consumer = ? AND handler = ? AND status = 'failed' AND retry_at_ms <= ? \
            ORDER BY retry_at_ms LIMIT ?",
        backlog: "SELECT handler, 'parked' AS status, COUNT(*) FROM inbox_messages \
            WHERE consumer = ? AND status = 'parked' GROUP BY handler \
            UNION ALL SELECT handler, 'dead' AS status, COUNT(*) FROM inbox_messages \
            WHERE consumer = ? AND status = 'dead' GROUP BY handler",
        status: "SELECT consumer, handler, \
            CAST(SUM(CASE WHEN status = 'processed' THEN 1 ELSE 0 END) AS SIGNED), \
            CAST(SUM(CASE WHEN status = 'stale' THEN 1 ELSE 0 END) AS SIGNED), \
            CAST(SUM(CASE WHEN status = 'parked' THEN 1 ELSE 0 END) AS SIGNED), \
            CAST(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS SIGNED), \
            CAST(SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END) AS SIGNED), \
            CAST(SUM(CASE WHEN status = 'discarded' THEN 1 ELSE 0 END) AS SIGNED), \
            MAX(CASE WHEN status = 'parked' THEN TIMESTAMPDIFF(MICROSECOND, received_at, NOW(6)) / 1e6 END) \
            FROM inbox_messages GROUP BY consumer, handler ORDER BY consumer, handler",
        storage_bytes: "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) \
            FROM information_schema.tables WHERE table_schema = DATABASE() \
            AND table_name IN ('inbox_messages', 'inbox_streams', 'inbox_rejected', 'inbox_actions', \
            'inbox_conflicts')",
    },
    purge: PurgeSql {
        preview: "SELECT \
            (SELECT COUNT(*) FROM inbox_messages \
             WHERE purge_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'parked' \
             AND received_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'dead' \
             AND COALESCE(failed_at, received_at) < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'discarded' \
             AND resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND) \
            + (SELECT COUNT(*) FROM inbox_rejected WHERE resolution IN ('replayed', 'discarded') \
             AND resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND) \
            + (SELECT COUNT(*) FROM inbox_conflicts \
             WHERE resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND), \
            (SELECT COUNT(*) FROM inbox_rejected \
             WHERE (resolution IS NULL OR resolution = 'replay_requested') \
             AND received_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND)",
        batch: "DELETE FROM inbox_messages \
            WHERE purge_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND \
            ORDER BY purge_at LIMIT ?",
        // A rejected delivery whose replay was asked for, or refused again, waits still.
        resolved: [
            "DELETE FROM inbox_messages WHERE status = 'discarded' \
            AND resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND \
            ORDER BY resolved_at LIMIT ?",
            "DELETE FROM inbox_rejected WHERE resolution IN ('replayed', 'discarded') \
            AND resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND \
            ORDER BY resolved_at LIMIT ?",
            "DELETE FROM inbox_conflicts \
            WHERE resolved_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND \
            ORDER BY resolved_at LIMIT ?",
            // An action whose message or rejected delivery is gone (a gap's has neither).
            "DELETE FROM inbox_actions \
            WHERE performed_at < NOW(6) - INTERVAL CAST(? * 1000000 AS SIGNED) MICROSECOND \
            AND NOT EXISTS (SELECT 1 FROM inbox_messages m WHERE m.consumer = inbox_actions.consumer \
            AND m.handler = inbox_actions.handler AND m.message_id = inbox_actions.message_id) \
            AND NOT EXISTS (SELECT 1 FROM inbox_rejected r WHERE r.id = inbox_actions.rejected_id) \
            ORDER BY performed_at LIMIT ?",
        ],
        // Named after the database, so that inboxes in other databases of a server do not contend;
        // by its hash, as MySQL refuses lock names over 64 characters (a database name takes 64).
        lock: Some(
            "SELECT CAST(COALESCE(GET_LOCK(CONCAT('inbox_purge.', SHA1(DATABASE())), 0), 0) AS SIGNED)",
        ),
        unlock: Some("SELECT RELEASE_LOCK(CONCAT('inbox_purge.', SHA1(DATABASE())))"),
    },
    batch: BatchSql {
        claim: BulkClaim::ReadThenInsert(concat!(
            "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
            SELECT ?, r.handler, r.message_id, r.message_type, r.aggregate_id, r.sequence_number, 'processed', \
            UNHEX(r.payload_hash), CURRENT_TIMESTAMP(6) FROM ",
            batch_rows!(
                text_column!("handler"),
                text_column!("message_id"),
                text_column!("message_type"),
                text_column!("aggregate_id"),
                "sequence_number BIGINT PATH '$.sequence_number'",
                text_column!("payload_hash")
            ),
            " ORDER BY r.handler, r.message_id"
        )),
        seen: concat!(
            "SELECT STRAIGHT_JOIN m.payload_hash, m.status, m.retry_at_ms, m.handler, m.message_id FROM ",
            batch_messages!()
        ),
        advance: BulkAdvance::LockThenSet {
            lock: concat!(
                "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
                SELECT ?, r.handler, r.aggregate_id, r.sequence_number - 1 FROM ",
                batch_rows!(
                    text_column!("handler"),
                    text_column!("aggregate_id"),
                    "sequence_number BIGINT PATH '$.sequence_number'"
                ),
                " ORDER BY r.handler, r.aggregate_id \
                ON DUPLICATE KEY UPDATE updated_at = CURRENT_TIMESTAMP(6)"
            ),
            set: concat!(
                "UPDATE ",
                batch_streams!("sequence_number BIGINT PATH '$.sequence_number'"),
                " SET s.last_sequence = r.sequence_number, s.updated_at = CURRENT_TIMESTAMP(6)"
            ),
        },
        last_sequences: concat!(
            "SELECT STRAIGHT_JOIN s.handler, s.aggregate_id, s.last_sequence FROM ",
            batch_streams!()
        ),
        settle_stale: concat!(
            "UPDATE ",
            batch_messages!(),
            " SET m.status = 'stale', m.payload = NULL, m.headers = NULL, \
            m.processed_at = CURRENT_TIMESTAMP(6)"
        ),
    },
    // A locking read locks no rows of its subqueries, so the order check sees the rows another
    // relay holds. A purge deletes in order with a `LIMIT` of its own: MySQL takes none in a
    // subquery of the table it deletes from.
    outbox: OutboxSql {
        advance: Returning::ThenRead {
            write: "INSERT INTO inbox_outbox_streams (aggregate_id, last_sequence) VALUES (?, 1) \
                ON DUPLICATE KEY UPDATE last_sequence = last_sequence + 1",
            read: "SELECT last_sequence FROM inbox_outbox_streams WHERE aggregate_id = ?",
        },
        insert: "INSERT INTO inbox_outbox (id, message_type, destination, aggregate_id, aggregate_sequence, \
            payload, headers, created_at_ms, due_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        claim: concat!(
            select_outbox!(),
            "WHERE status = 'pending' AND due_at_ms <= ? AND ",
            first_of_aggregate!(),
            " ORDER BY due_at_ms, position LIMIT ? FOR UPDATE SKIP LOCKED"
        ),
        published: "UPDATE inbox_outbox SET status = 'published', published_at_ms = ?, \
            attempts = attempts + 1, last_error = NULL WHERE position = ? AND status <> 'published'",
        failed: "UPDATE inbox_outbox SET attempts = attempts + 1, refusals = refusals + ?, \
            last_error = ?, due_at_ms = ?, status = ? \
            WHERE position = ? AND status = 'pending' AND due_at_ms = ?",
        lease: "UPDATE inbox_outbox SET due_at_ms = ? WHERE position = ?",
        recheck: Some(
            "SELECT COUNT(*) FROM inbox_outbox WHERE aggregate_id = ? AND status <> 'published' \
             AND aggregate_sequence < ?",
        ),
        list: concat!(
            select_outbox!(),
            "WHERE status IN (?, ?) ORDER BY position LIMIT ?"
        ),
        retry: "UPDATE inbox_outbox SET status = 'pending', attempts = 0, refusals = 0, \
            due_at_ms = 0 WHERE id = ? AND status = 'failed'",
        retry_all: "UPDATE inbox_outbox SET status = 'pending', attempts = 0, refusals = 0, \
            due_at_ms = 0 WHERE status = 'failed'",
        backlog: "SELECT COUNT(CASE WHEN status = 'pending' THEN 1 END), \
            COUNT(CASE WHEN status = 'failed' THEN 1 END), MIN(created_at_ms) \
            FROM inbox_outbox WHERE status <> 'published'",
        purge: "DELETE FROM inbox_outbox WHERE status = 'published' AND published_at_ms < ? \
            ORDER BY published_at_ms LIMIT ?",
    },
    records: RECORDS,
    check_schema: schema::CHECK_SCHEMA,
    // A key on a prefix of a column (`sub_part`) takes two ids that share the prefix for one,
    // and an expression (no column name) matches no key: neither is the inbox's key.
    unique_keys: "SELECT CAST(index_name AS CHAR), \
        CAST(CASE WHEN sub_part IS NULL THEN COALESCE(column_name, '') ELSE '' END AS CHAR) \
        FROM information_schema.statistics \
        WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0",
};

/// MySQL's statements on what is kept for operators.
pub(super) const RECORDS: RecordSql = RecordSql {
    next_consumer: "SELECT MIN(consumer) FROM inbox_messages WHERE consumer > ?",
    record_action: "INSERT INTO inbox_actions (consumer, handler, message_id, aggregate_id, rejected_id, \
        action, performed_by, reason, outcome, outcome_at) \
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, CASE WHEN ? THEN CURRENT_TIMESTAMP(6) END)",
    message_actions: concat!(
        select_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
        "WHERE consumer = ? AND handler = ? AND (message_id = ? OR aggregate_id = ?) ORDER BY id"
    ),
    rejected_actions: concat!(
        select_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
        "WHERE rejected_id = ? ORDER BY id"
    ),
    keep_conflict: "INSERT INTO inbox_conflicts (consumer, handler, message_id, message_type, \
        payload_hash, stored_payload_hash, payload, headers) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
        ON DUPLICATE KEY UPDATE deliveries = deliveries + 1, last_seen_at = CURRENT_TIMESTAMP(6)",
    conflicts: concat!(
        select_conflicts!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
        "WHERE (? OR consumer = ?) AND resolution IS NULL ORDER BY id"
    ),
    conflict: concat!(
        select_conflicts!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
        "WHERE id = ?"
    ),
    conflict_counts: "SELECT consumer, handler, COUNT(*) FROM inbox_conflicts WHERE resolution IS NULL \
        GROUP BY consumer, handler ORDER BY consumer, handler",
    discard_conflict: "UPDATE inbox_conflicts SET resolution = 'discarded', resolved_by = ?, \
        resolved_reason = ?, resolved_at = CURRENT_TIMESTAMP(6) WHERE id = ? AND resolution IS NULL",
    settle_message_actions: "UPDATE inbox_actions SET outcome = ?, outcome_at = CURRENT_TIMESTAMP(6) \
        WHERE consumer = ? AND handler = ? AND message_id = ? AND outcome IS NULL",
    settle_rejected_actions: "UPDATE inbox_actions SET outcome = ?, outcome_at = CURRENT_TIMESTAMP(6) \
        WHERE rejected_id = ? AND outcome IS NULL",
    kept_rejected: concat!(
        select_kept_rejected!(rfc3339!("received_at")),
        "WHERE (? OR consumer = ?) AND (resolution IS NULL OR resolution = 'replay_requested') \
         ORDER BY id"
    ),
    rejected_by_id: concat!(
        select_kept_rejected!(rfc3339!("received_at")),
        "WHERE id = ?"
    ),
    request_rejected_replay: "UPDATE inbox_rejected SET resolution = 'replay_requested', \
        resolved_by = ?, resolved_reason = ?, resolved_at = CURRENT_TIMESTAMP(6) \
        WHERE consumer = ? AND id = ? AND resolution IS NULL",
    rejected_replays: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
        WHERE consumer = ? AND resolution = 'replay_requested' ORDER BY id",
    replayed: "UPDATE inbox_rejected SET resolution = 'replayed', resolved_at = CURRENT_TIMESTAMP(6) \
        WHERE consumer = ? AND id = ? AND resolution = 'replay_requested'",
    refused_again: "UPDATE inbox_rejected SET resolution = NULL, reason = ? \
        WHERE consumer = ? AND id = ? AND resolution = 'replay_requested'",
};

/// A handler may take the guarded transaction as a plain `&mut sqlx::MySqlConnection`.
impl<'t> DatabaseHandle<'t, MySql> for sqlx::MySqlConnection {
    fn from_context<'c>(ctx: &'c mut Context<'t, MySql>) -> &'c mut Self {
        ctx
    }
}

impl Backend for MySql {
    const DEFAULT_WORKERS: usize = 4;
    const SQL: Statements = SQL;

    const BEGIN: &'static str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

    const HEALTH_BACKLOG: &'static str = super::health::MYSQL_BACKLOG;

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn migrations() -> Migrator {
        sqlx::migrate!("./migrations/mysql")
    }

    fn schema_sql() -> &'static str {
        concat!(
            include_str!("../../migrations/mysql/0001_inbox.sql"),
            include_str!("../../migrations/mysql/0002_outbox.sql"),
            include_str!("../../migrations/mysql/0003_actions.sql"),
            include_str!("../../migrations/mysql/0004_conflicts.sql"),
            include_str!("../../migrations/mysql/0005_retention.sql"),
            include_str!("../../migrations/mysql/0006_no_pad.sql"),
            include_str!("../../migrations/mysql/0007_no_pad_on_mariadb.sql"),
            include_str!("../../migrations/mysql/0008_outbox_refusals.sql"),
            include_str!("../../migrations/mysql/0009_outbox_due_order.sql"),
        )
    }
}
