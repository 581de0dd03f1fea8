//! PostgreSQL: `READ COMMITTED`, upserts with `ON CONFLICT`, `RETURNING`, partial indexes, and
//! an advisory lock for the purge leader. SQLite speaks most of this dialect too (see
//! `sqlite.rs`, which names only what it says differently).

#[cfg(feature = "postgres")]
use crate::context::{Context, DatabaseHandle};
#[cfg(feature = "postgres")]
use sqlx::Postgres;
#[cfg(feature = "postgres")]
use sqlx::migrate::Migrator;

#[cfg(feature = "postgres")]
use super::Backend;
use super::operators::RecordSql;
use super::schema;
use super::{
    BatchSql, BulkAdvance, BulkClaim, MessageSql, OpenProbe, OperatorSql, OutboxSql, PurgeSql,
    Returning, Statements, StreamSql,
};

/// The columns of an `OutboxMessage`.
macro_rules! select_outbox {
    () => {
        "SELECT position, id, message_type, destination, aggregate_id, aggregate_sequence, \
         payload, headers, status, attempts, last_error, due_at_ms, created_at_ms, \
         published_at_ms, refusals FROM inbox_outbox "
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use select_outbox;

/// Inserts a claim's dedup row unless one is there (`claimed` holds a row if it inserted).
macro_rules! claimed {
    () => {
        "WITH claimed AS (INSERT INTO inbox_messages \
        (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
        VALUES ($1, $2, $3, $4, $5, $6, 'processed', $7, CURRENT_TIMESTAMP) \
        ON CONFLICT (consumer, handler, message_id) DO NOTHING RETURNING 1) "
    };
}

/// After the row `claimed` gives when it inserted: the row that was there, when it did not.
macro_rules! seen_unless_claimed {
    () => {
        "UNION ALL SELECT payload_hash, status, retry_at_ms, NULL FROM inbox_messages \
        WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND NOT EXISTS (SELECT 1 FROM claimed)"
    };
}

/// The claim's order check: no message of the row's aggregate written before it is unpublished.
macro_rules! first_of_aggregate {
    () => {
        "(aggregate_id IS NULL OR NOT EXISTS (SELECT 1 FROM inbox_outbox e \
         WHERE e.aggregate_id = inbox_outbox.aggregate_id AND e.status <> 'published' \
         AND e.aggregate_sequence < inbox_outbox.aggregate_sequence))"
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use first_of_aggregate;

/// The columns of a `StoredMessage`, with `received_at` and `failed_at` as RFC 3339 text.
macro_rules! select_stored {
    ($times:expr) => {
        concat!(
            "SELECT handler, message_id, message_type, aggregate_id, sequence_number, status, \
             first_error, error_text, attempt_count, payload, resolution, resolved_by, \
             resolved_reason, dead_reason, ",
            $times,
            ", headers FROM inbox_messages "
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use select_stored;

/// The time in `$column` as RFC 3339 text, in UTC, to the second.
macro_rules! rfc3339 {
    ($column:literal) => {
        concat!(
            "to_char(",
            $column,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        )
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

/// The columns of a `KeptRejected`, with `received_at` as given (RFC 3339 text).
macro_rules! select_kept_rejected {
    ($received_at:expr) => {
        concat!(
            "SELECT id, message_type, delivery_id, payload, headers, reason, consumer, ",
            $received_at,
            ", resolution FROM inbox_rejected "
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use select_kept_rejected;

/// The rejected deliveries no operator has resolved, of every consumer (`$1`) or of one (`$2`),
/// with `received_at` as given.
macro_rules! kept_rejected {
    ($received_at:expr) => {
        concat!(
            select_kept_rejected!($received_at),
            "WHERE ($1 OR consumer = $2) AND (resolution IS NULL OR resolution = 'replay_requested') \
             ORDER BY id"
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use kept_rejected;

/// The columns of an `ActionRecord`, with its times as given.
macro_rules! select_actions {
    ($performed_at:expr, $outcome_at:expr) => {
        concat!(
            "SELECT action, performed_by, reason, ",
            $performed_at,
            ", outcome, ",
            $outcome_at,
            " FROM inbox_actions "
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use select_actions;

/// The actions on a message (`$1` to `$3`) and on the gaps of its aggregate (`$4`), oldest
/// first, with their times as given.
macro_rules! message_actions {
    ($performed_at:expr, $outcome_at:expr) => {
        concat!(
            select_actions!($performed_at, $outcome_at),
            "WHERE consumer = $1 AND handler = $2 AND (message_id = $3 OR aggregate_id = $4) \
             ORDER BY id"
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use message_actions;

/// The actions on a rejected delivery (`$1`), oldest first, with their times as given.
macro_rules! rejected_actions {
    ($performed_at:expr, $outcome_at:expr) => {
        concat!(
            select_actions!($performed_at, $outcome_at),
            "WHERE rejected_id = $1 ORDER BY id"
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use rejected_actions;

/// The columns of a `Conflict`, with its times as given.
macro_rules! select_conflicts {
    ($first_seen_at:expr, $last_seen_at:expr) => {
        concat!(
            "SELECT id, consumer, handler, message_id, message_type, payload_hash, \
             stored_payload_hash, payload, headers, deliveries, ",
            $first_seen_at,
            ", ",
            $last_seen_at,
            ", resolution, resolved_by, resolved_reason FROM inbox_conflicts "
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use select_conflicts;

/// The conflicts waiting for an operator, of every consumer (`$1`) or of one (`$2`), with their
/// times as given.
macro_rules! open_conflicts {
    ($first_seen_at:expr, $last_seen_at:expr) => {
        concat!(
            select_conflicts!($first_seen_at, $last_seen_at),
            "WHERE ($1 OR consumer = $2) AND resolution IS NULL ORDER BY id"
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use open_conflicts;

/// One conflict (`$1`), with its times as given.
macro_rules! conflict_by_id {
    ($first_seen_at:expr, $last_seen_at:expr) => {
        concat!(
            select_conflicts!($first_seen_at, $last_seen_at),
            "WHERE id = $1"
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use conflict_by_id;

/// One rejected delivery (`$1`), with `received_at` as given.
macro_rules! rejected_by_id {
    ($received_at:expr) => {
        concat!(select_kept_rejected!($received_at), "WHERE id = $1")
    };
}
#[cfg(feature = "sqlite")]
pub(super) use rejected_by_id;

/// Each parked aggregate of one handler, with its first parked sequence, since when it waits, and
/// its stream's last applied sequence. The parked rows are read through their index, and each
/// aggregate finds its stream by a lookup of the stream's key in a correlated subquery: no
/// planner turns that into a scan of every stream per parked row, whatever its statistics say
/// (a join did, on a table without statistics: seconds for a few thousand streams).
macro_rules! parked_streams {
    ($consumer:literal, $handler:literal) => {
        concat!(
            "SELECT p.consumer, p.handler, p.aggregate_id, p.first_parked, p.parked_since, \
             (SELECT s.last_sequence FROM inbox_streams s WHERE s.consumer = p.consumer \
             AND s.handler = p.handler AND s.aggregate_id = p.aggregate_id) AS last_applied \
             FROM (SELECT consumer, handler, aggregate_id, MIN(sequence_number) AS first_parked, \
             MIN(received_at) AS parked_since FROM inbox_messages WHERE consumer = ",
            $consumer,
            " AND handler = ",
            $handler,
            " AND status = 'parked' GROUP BY consumer, handler, aggregate_id) p"
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use parked_streams;

/// The aggregates whose parked messages can apply now: the first one is next.
macro_rules! releasable {
    ($consumer:literal, $handler:literal) => {
        concat!(
            "SELECT g.aggregate_id FROM (",
            parked_streams!($consumer, $handler),
            ") g WHERE g.first_parked <= g.last_applied + 1"
        )
    };
}
#[cfg(feature = "mysql")]
pub(super) use releasable;

/// The aggregates whose gap in front of their parked messages is older than `$older_than`, and
/// whose missing message is not waiting for a retry.
macro_rules! overdue_gaps {
    ($consumer:literal, $handler:literal, $older_than:literal) => {
        concat!(
            "SELECT g.aggregate_id FROM (",
            parked_streams!($consumer, $handler),
            ") g WHERE g.first_parked > g.last_applied + 1 AND g.parked_since < ",
            $older_than,
            " AND NOT EXISTS (SELECT 1 FROM inbox_messages f WHERE f.consumer = g.consumer \
             AND f.handler = g.handler AND f.aggregate_id = g.aggregate_id \
             AND f.sequence_number = g.last_applied + 1 AND f.status = 'failed') \
             ORDER BY g.aggregate_id"
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use overdue_gaps;

/// How many of a stream's parked messages arrived at `$older_than` (of the fourth parameter) or before.
macro_rules! parked_overdue {
    ($consumer:literal, $handler:literal, $aggregate:literal, $older_than:literal) => {
        concat!(
            "SELECT COUNT(*) FROM inbox_messages WHERE consumer = ",
            $consumer,
            " AND handler = ",
            $handler,
            " AND aggregate_id = ",
            $aggregate,
            " AND status = 'parked' AND received_at <= ",
            $older_than
        )
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) use parked_overdue;

/// PostgreSQL's statements.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(super) const SQL: Statements = Statements {
    messages: MessageSql {
        claim: "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
            VALUES ($1, $2, $3, $4, $5, $6, 'processed', $7, CURRENT_TIMESTAMP) \
            ON CONFLICT (consumer, handler, message_id) DO NOTHING",
        claim_or_seen: Some(concat!(
            claimed!(),
            "SELECT NULL::bytea, NULL::text, NULL::bigint, NULL::bigint FROM claimed ",
            seen_unless_claimed!()
        )),
        // The stream is locked after the dedup row, as when they are two statements.
        claim_and_advance: Some(concat!(
            claimed!(),
            ", advanced AS (INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
            SELECT $1, $2, $5, $6 FROM claimed ON CONFLICT (consumer, handler, aggregate_id) \
            DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
            WHERE inbox_streams.last_sequence < excluded.last_sequence RETURNING 1) ",
            "SELECT NULL::bytea, NULL::text, NULL::bigint, (SELECT COUNT(*) FROM advanced) FROM claimed ",
            seen_unless_claimed!()
        )),
        retry_claim: Returning::Inline(
            "UPDATE inbox_messages \
            SET status = 'processed', payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
            WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND status = 'failed' \
            AND payload_hash = $4 AND retry_at_ms <= $5 RETURNING attempt_count",
        ),
        seen: "SELECT payload_hash, status, retry_at_ms FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND message_id = $3",
        insert_failure: "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, \
             payload, headers, attempt_count, first_error, error_text, failed_at, retry_at_ms) \
            VALUES ($1, $2, $3, $4, $5, $6, 'failed', $7, $8, $9, 1, $10, $11, CURRENT_TIMESTAMP, $12) \
            ON CONFLICT (consumer, handler, message_id) DO NOTHING",
        update_failure: Returning::Inline(
            "UPDATE inbox_messages SET status = 'failed', attempt_count = attempt_count + 1, \
            error_text = $1, first_error = COALESCE(first_error, $2), payload = $3, headers = $4, \
            processed_at = NULL, failed_at = CURRENT_TIMESTAMP, retry_at_ms = $5 \
            WHERE consumer = $6 AND handler = $7 AND message_id = $8 \
            AND status IN ('failed', 'parked') AND payload_hash = $9 RETURNING attempt_count",
        ),
        schedule_retry: "UPDATE inbox_messages SET retry_at_ms = $1 \
            WHERE consumer = $2 AND handler = $3 AND message_id = $4",
        postpone_retry: "UPDATE inbox_messages SET retry_at_ms = $1 + LEAST($2, GREATEST($3, \
            COALESCE((extract(epoch FROM now() - failed_at) * 1000)::bigint, 0))) \
            WHERE consumer = $4 AND handler = $5 AND message_id = $6 AND status = 'failed'",
        check_open: Some(OpenProbe::FailsOnceAborted("SELECT 1")),
        check_and_commit: Some("SELECT 1; COMMIT; BEGIN"),
        bury: "UPDATE inbox_messages SET status = 'dead', error_text = COALESCE($1, error_text), dead_reason = $2 \
            WHERE consumer = $3 AND handler = $4 AND message_id = $5 AND status IN ('failed', 'parked')",
        settle: "UPDATE inbox_messages \
            SET status = $1, payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
            WHERE consumer = $2 AND handler = $3 AND message_id = $4",
        stored: "SELECT status, payload, headers FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND message_id = $3",
        replay: "UPDATE inbox_messages SET status = 'failed', attempt_count = 0, retry_at_ms = 0, \
            resolution = 'replayed', resolved_by = $1, resolved_reason = $2, resolved_at = CURRENT_TIMESTAMP \
            WHERE consumer = $3 AND handler = $4 AND message_id = $5 AND status IN ('dead', 'failed')",
        discard: "UPDATE inbox_messages SET status = 'discarded', \
            resolution = 'discarded', resolved_by = $1, resolved_reason = $2, resolved_at = CURRENT_TIMESTAMP \
            WHERE consumer = $3 AND handler = $4 AND message_id = $5 AND status IN ('dead', 'failed')",
        reject: Returning::Inline(
            "INSERT INTO inbox_rejected (consumer, message_type, delivery_id, payload, headers, reason) \
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        ),
    },
    streams: StreamSql {
        advance: Some(
            "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
            VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, handler, aggregate_id) \
            DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
            WHERE inbox_streams.last_sequence < excluded.last_sequence",
        ),
        lock: Returning::Inline(
            "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
            VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, handler, aggregate_id) \
            DO UPDATE SET updated_at = CURRENT_TIMESTAMP RETURNING last_sequence",
        ),
        set: "UPDATE inbox_streams SET last_sequence = $1, updated_at = CURRENT_TIMESTAMP \
            WHERE consumer = $2 AND handler = $3 AND aggregate_id = $4",
        park: "UPDATE inbox_messages SET status = 'parked', payload = $1, headers = $2, processed_at = NULL \
            WHERE consumer = $3 AND handler = $4 AND message_id = $5",
        next_parked: "SELECT message_id, sequence_number, payload, headers FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked' \
            AND sequence_number <= $4 ORDER BY sequence_number LIMIT 1",
        has_parked: "SELECT COUNT(*) FROM (SELECT 1 FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked' LIMIT 1) AS parked",
        releasable: releasable!("$1", "$2"),
        revive_gap_dead: "UPDATE inbox_messages SET status = 'parked', error_text = NULL, dead_reason = NULL \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'dead' \
            AND dead_reason = 'gap_timeout'",
        retrying_sequence: "SELECT COUNT(*) FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND sequence_number = $4 AND status = 'failed'",
        first_retrying: "SELECT MIN(sequence_number) FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'failed' \
            AND sequence_number > $4",
        parked_range: "SELECT MIN(sequence_number), COUNT(*) FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked'",
        bury_parked: "UPDATE inbox_messages SET status = 'dead', error_text = $1, dead_reason = 'gap_timeout' \
            WHERE consumer = $2 AND handler = $3 AND aggregate_id = $4 AND status = 'parked'",
        overdue_gaps: overdue_gaps!("$1", "$2", "now() - make_interval(secs => $3)"),
        parked_overdue: parked_overdue!("$1", "$2", "$3", "now() - make_interval(secs => $4)"),
    },
    operators: OperatorSql {
        rejected: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
            WHERE consumer = $1 AND resolution IS NULL ORDER BY id",
        rejected_one: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
            WHERE consumer = $1 AND id = $2 AND (resolution IS NULL OR resolution = 'replay_requested')",
        resolve_rejected: "UPDATE inbox_rejected \
            SET resolution = $1, resolved_by = $2, resolved_reason = $3, resolved_at = CURRENT_TIMESTAMP \
            WHERE consumer = $4 AND id = $5 AND (resolution IS NULL OR resolution = 'replay_requested')",
        rejected_counts: "SELECT consumer, COUNT(*) FROM inbox_rejected \
            WHERE resolution IS NULL OR resolution = 'replay_requested' GROUP BY consumer ORDER BY consumer",
        dead_letters: concat!(
            select_stored_utc!(),
            "WHERE consumer = $1 AND status = 'dead' AND handler = COALESCE($2, handler) \
             AND message_type = COALESCE($3, message_type) \
             AND ($4 OR failed_at >= now() - make_interval(secs => $5)) \
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
        due_retries: "SELECT message_id FROM inbox_messages \
            WHERE consumer = $1 AND handler = $2 AND status = 'failed' AND retry_at_ms <= $3 \
            ORDER BY retry_at_ms LIMIT $4",
        // One query per status, so each runs on its partial index: this runs on every sweep.
        backlog: "SELECT handler, 'parked' AS status, COUNT(*) FROM inbox_messages \
            WHERE consumer = $1 AND status = 'parked' GROUP BY handler \
            UNION ALL SELECT handler, 'dead' AS status, COUNT(*) FROM inbox_messages \
            WHERE consumer = $2 AND status = 'dead' GROUP BY handler",
        status: "SELECT consumer, handler, \
            SUM(CASE WHEN status = 'processed' THEN 1 ELSE 0 END)::int8, \
            SUM(CASE WHEN status = 'stale' THEN 1 ELSE 0 END)::int8, \
            SUM(CASE WHEN status = 'parked' THEN 1 ELSE 0 END)::int8, \
            SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END)::int8, \
            SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END)::int8, \
            SUM(CASE WHEN status = 'discarded' THEN 1 ELSE 0 END)::int8, \
            MAX(CASE WHEN status = 'parked' THEN EXTRACT(EPOCH FROM now() - received_at)::float8 END) \
            FROM inbox_messages GROUP BY consumer, handler ORDER BY consumer, handler",
        storage_bytes: "SELECT (pg_total_relation_size('inbox_messages') + pg_total_relation_size('inbox_streams') \
            + pg_total_relation_size('inbox_rejected') + pg_total_relation_size('inbox_actions') \
            + pg_total_relation_size('inbox_conflicts'))::int8",
    },
    purge: PurgeSql {
        preview: "SELECT \
            (SELECT COUNT(*) FROM inbox_messages WHERE status IN ('processed', 'stale') \
             AND processed_at < now() - make_interval(secs => $1)), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'parked' \
             AND received_at < now() - make_interval(secs => $2)), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'dead' \
             AND COALESCE(failed_at, received_at) < now() - make_interval(secs => $3)), \
            (SELECT COUNT(*) FROM inbox_messages WHERE status = 'discarded' \
             AND resolved_at < now() - make_interval(secs => $4)) \
            + (SELECT COUNT(*) FROM inbox_rejected WHERE resolution IN ('replayed', 'discarded') \
             AND resolved_at < now() - make_interval(secs => $5)) \
            + (SELECT COUNT(*) FROM inbox_conflicts WHERE resolution IS NOT NULL \
             AND resolved_at < now() - make_interval(secs => $6)), \
            (SELECT COUNT(*) FROM inbox_rejected \
             WHERE (resolution IS NULL OR resolution = 'replay_requested') \
             AND received_at < now() - make_interval(secs => $7))",
        // By physical row id (here and in `resolved`): a join on the key would scan the table
        // once per batch.
        batch: "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
            WHERE status IN ('processed', 'stale') AND processed_at < now() - make_interval(secs => $1) \
            ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
        resolved: [
            "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
            WHERE status = 'discarded' AND resolved_at < now() - make_interval(secs => $1) \
            ORDER BY resolved_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            "DELETE FROM inbox_rejected WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_rejected \
            WHERE resolution IN ('replayed', 'discarded') AND resolved_at < now() - make_interval(secs => $1) \
            ORDER BY resolved_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            "DELETE FROM inbox_conflicts WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_conflicts \
            WHERE resolution IS NOT NULL AND resolved_at < now() - make_interval(secs => $1) \
            ORDER BY resolved_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            // An action whose message or rejected delivery is gone (a gap's has neither).
            "DELETE FROM inbox_actions WHERE ctid = ANY(ARRAY(SELECT a.ctid FROM inbox_actions a \
            WHERE a.performed_at < now() - make_interval(secs => $1) \
            AND NOT EXISTS (SELECT 1 FROM inbox_messages m WHERE m.consumer = a.consumer \
            AND m.handler = a.handler AND m.message_id = a.message_id) \
            AND NOT EXISTS (SELECT 1 FROM inbox_rejected r WHERE r.id = a.rejected_id) \
            ORDER BY a.performed_at LIMIT $2 FOR UPDATE OF a SKIP LOCKED))",
        ],
        // The lock's first key is "inbx"; the second, the inbox table's oid, so that schemas
        // sharing a database do not contend.
        lock: Some(
            "SELECT (CASE WHEN pg_try_advisory_lock(1768841848, 'inbox_messages'::regclass::oid::int4) \
            THEN 1 ELSE 0 END)::int8",
        ),
        unlock: Some(
            "SELECT pg_advisory_unlock(1768841848, 'inbox_messages'::regclass::oid::int4)",
        ),
    },
    // Rows are written in key order, so that two batches never wait for each other's rows in
    // opposite orders; each row found is one lookup of its key, whatever the statistics say
    // (the `LIMIT` keeps the planner from folding the lookup into a join that reads every row of
    // the consumer).
    batch: BatchSql {
        claim: BulkClaim::Returning(
            "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, processed_at) \
            SELECT $1, r.handler, r.message_id, r.message_type, r.aggregate_id, r.sequence_number, 'processed', \
            decode(r.payload_hash, 'hex'), CURRENT_TIMESTAMP \
            FROM jsonb_to_recordset($2::jsonb) AS r(handler text, message_id text, message_type text, \
            aggregate_id text, sequence_number int8, payload_hash text) \
            ORDER BY r.handler, r.message_id \
            ON CONFLICT (consumer, handler, message_id) DO NOTHING RETURNING handler, message_id",
        ),
        seen: "SELECT m.payload_hash, m.status, m.retry_at_ms, m.handler, m.message_id \
            FROM jsonb_to_recordset($2::jsonb) AS r(handler text, message_id text), \
            LATERAL (SELECT * FROM inbox_messages WHERE consumer = $1 AND handler = r.handler \
            AND message_id = r.message_id LIMIT 1) m",
        advance: BulkAdvance::Returning(
            "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
            SELECT $1, r.handler, r.aggregate_id, r.sequence_number \
            FROM jsonb_to_recordset($2::jsonb) AS r(handler text, aggregate_id text, sequence_number int8) \
            ORDER BY r.handler, r.aggregate_id \
            ON CONFLICT (consumer, handler, aggregate_id) \
            DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
            WHERE inbox_streams.last_sequence < excluded.last_sequence RETURNING handler, aggregate_id",
        ),
        last_sequences: "SELECT r.handler, r.aggregate_id, s.last_sequence \
            FROM jsonb_to_recordset($2::jsonb) AS r(handler text, aggregate_id text), \
            LATERAL (SELECT last_sequence FROM inbox_streams WHERE consumer = $1 \
            AND handler = r.handler AND aggregate_id = r.aggregate_id LIMIT 1) s",
        // Each row by its key, whatever the planner's statistics: the rows' addresses, looked up one by one.
        settle_stale: "UPDATE inbox_messages \
            SET status = 'stale', payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
            WHERE ctid = ANY (ARRAY(SELECT m.ctid \
            FROM jsonb_to_recordset($2::jsonb) AS r(handler text, message_id text), \
            LATERAL (SELECT ctid FROM inbox_messages WHERE consumer = $1 AND handler = r.handler \
            AND message_id = r.message_id LIMIT 1) m))",
    },
    outbox: OutboxSql {
        advance: Returning::Inline(
            "INSERT INTO inbox_outbox_streams (aggregate_id, last_sequence) VALUES ($1, 1) \
             ON CONFLICT (aggregate_id) DO UPDATE SET last_sequence = inbox_outbox_streams.last_sequence + 1 \
             RETURNING last_sequence",
        ),
        insert: "INSERT INTO inbox_outbox (id, message_type, destination, aggregate_id, aggregate_sequence, \
            payload, headers, created_at_ms, due_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        claim: concat!(
            select_outbox!(),
            "WHERE status = 'pending' AND due_at_ms <= $1 AND ",
            first_of_aggregate!(),
            " ORDER BY due_at_ms, position LIMIT $2 FOR UPDATE SKIP LOCKED"
        ),
        published: "UPDATE inbox_outbox SET status = 'published', published_at_ms = $1, \
            attempts = attempts + 1, last_error = NULL WHERE position = $2 AND status <> 'published'",
        failed: "UPDATE inbox_outbox SET attempts = attempts + 1, refusals = refusals + $1, \
            last_error = $2, due_at_ms = $3, status = $4 \
            WHERE position = $5 AND status = 'pending' AND due_at_ms = $6",
        lease: "UPDATE inbox_outbox SET due_at_ms = $1 WHERE position = $2",
        recheck: None,
        list: concat!(
            select_outbox!(),
            "WHERE status IN ($1, $2) ORDER BY position LIMIT $3"
        ),
        retry: "UPDATE inbox_outbox SET status = 'pending', attempts = 0, refusals = 0, \
            due_at_ms = 0 WHERE id = $1 AND status = 'failed'",
        retry_all: "UPDATE inbox_outbox SET status = 'pending', attempts = 0, refusals = 0, \
            due_at_ms = 0 WHERE status = 'failed'",
        backlog: "SELECT COUNT(CASE WHEN status = 'pending' THEN 1 END), \
            COUNT(CASE WHEN status = 'failed' THEN 1 END), MIN(created_at_ms) \
            FROM inbox_outbox WHERE status <> 'published'",
        purge: "DELETE FROM inbox_outbox WHERE position IN (SELECT position FROM inbox_outbox \
            WHERE status = 'published' AND published_at_ms < $1 ORDER BY published_at_ms LIMIT $2)",
    },
    records: RECORDS,
    check_schema: schema::CHECK_SCHEMA,
    // The indexes `ON CONFLICT` can use: unique, valid, checked at once, on whole columns of
    // every row (not partial, no expression); their key columns only, not the `INCLUDE`d ones.
    unique_keys: "SELECT i.indexrelid::regclass::text, a.attname::text FROM pg_index i \
        JOIN pg_attribute a ON a.attrelid = i.indrelid \
        AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1]) \
        WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid \
        AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL",
};

/// PostgreSQL's statements on what is kept for operators.
pub(super) const RECORDS: RecordSql = RecordSql {
    next_consumer: "SELECT MIN(consumer) FROM inbox_messages WHERE consumer > $1",
    record_action: "INSERT INTO inbox_actions (consumer, handler, message_id, aggregate_id, rejected_id, \
        action, performed_by, reason, outcome, outcome_at) \
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $10 THEN CURRENT_TIMESTAMP END)",
    message_actions: message_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
    rejected_actions: rejected_actions!(rfc3339!("performed_at"), rfc3339!("outcome_at")),
    keep_conflict: "INSERT INTO inbox_conflicts (consumer, handler, message_id, message_type, \
        payload_hash, stored_payload_hash, payload, headers) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
        ON CONFLICT (consumer, handler, message_id, payload_hash) \
        DO UPDATE SET deliveries = inbox_conflicts.deliveries + 1, last_seen_at = CURRENT_TIMESTAMP",
    conflicts: open_conflicts!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
    conflict: conflict_by_id!(rfc3339!("first_seen_at"), rfc3339!("last_seen_at")),
    conflict_counts: "SELECT consumer, handler, COUNT(*) FROM inbox_conflicts WHERE resolution IS NULL \
        GROUP BY consumer, handler ORDER BY consumer, handler",
    discard_conflict: "UPDATE inbox_conflicts SET resolution = 'discarded', resolved_by = $1, \
        resolved_reason = $2, resolved_at = CURRENT_TIMESTAMP WHERE id = $3 AND resolution IS NULL",
    settle_message_actions: "UPDATE inbox_actions SET outcome = $1, outcome_at = CURRENT_TIMESTAMP \
        WHERE consumer = $2 AND handler = $3 AND message_id = $4 AND outcome IS NULL",
    settle_rejected_actions: "UPDATE inbox_actions SET outcome = $1, outcome_at = CURRENT_TIMESTAMP \
        WHERE rejected_id = $2 AND outcome IS NULL",
    kept_rejected: kept_rejected!(rfc3339!("received_at")),
    rejected_by_id: rejected_by_id!(rfc3339!("received_at")),
    request_rejected_replay: "UPDATE inbox_rejected SET resolution = 'replay_requested', \
        resolved_by = $1, resolved_reason = $2, resolved_at = CURRENT_TIMESTAMP \
        WHERE consumer = $3 AND id = $4 AND resolution IS NULL",
    rejected_replays: "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
        WHERE consumer = $1 AND resolution = 'replay_requested' ORDER BY id",
    replayed: "UPDATE inbox_rejected SET resolution = 'replayed', resolved_at = CURRENT_TIMESTAMP \
        WHERE consumer = $1 AND id = $2 AND resolution = 'replay_requested'",
    refused_again: "UPDATE inbox_rejected SET resolution = NULL, reason = $1 \
        WHERE consumer = $2 AND id = $3 AND resolution = 'replay_requested'",
};

/// A handler may take the guarded transaction as a plain `&mut sqlx::PgConnection`.
#[cfg(feature = "postgres")]
impl<'t> DatabaseHandle<'t, Postgres> for sqlx::PgConnection {
    fn from_context<'c>(ctx: &'c mut Context<'t, Postgres>) -> &'c mut Self {
        ctx
    }
}

#[cfg(feature = "postgres")]
impl Backend for Postgres {
    const DEFAULT_WORKERS: usize = 4;
    const SQL: Statements = SQL;

    const BEGIN: &'static str = "BEGIN ISOLATION LEVEL READ COMMITTED";

    /// `BEGIN`, then `SET LOCAL statement_timeout` to `timeout` (in whole milliseconds, at least
    /// one: zero would turn the bound off), as one simple query.
    fn begin_within(timeout: std::time::Duration) -> sqlx::SqlStr {
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
        let statement = format!("{}; SET LOCAL statement_timeout = {ms}", Self::BEGIN);
        sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(statement))
    }

    fn rows_affected(result: &Self::QueryResult) -> u64 {
        result.rows_affected()
    }

    fn migrations() -> Migrator {
        sqlx::migrate!("./migrations/postgres")
    }

    async fn dequeue(
        connection: &mut sqlx::PgConnection,
        receipt: &crate::queue::QueueReceipt,
    ) -> Result<(), sqlx::Error> {
        crate::queue::dequeue(connection, receipt).await
    }

    /// `LISTEN inbox_outbox`, on a connection of its own, outside `pool` (which may hold a
    /// single connection, for the relay's batches: see [`crate::queue::listener`]); a lost
    /// connection ends the stream, and the relay polls from then on.
    async fn outbox_wakeups(
        pool: &sqlx::Pool<Self>,
    ) -> Option<futures::stream::BoxStream<'static, ()>> {
        use futures::StreamExt;

        let mut listener = crate::queue::listener(pool).await.ok()?;
        listener.listen("inbox_outbox").await.ok()?;
        let notifications = listener.into_stream();
        Some(
            notifications
                .take_while(|notification| std::future::ready(notification.is_ok()))
                .map(drop)
                .boxed(),
        )
    }

    fn schema_sql() -> &'static str {
        concat!(
            include_str!("../../migrations/postgres/0001_inbox.sql"),
            include_str!("../../migrations/postgres/0002_strict_ordering.sql"),
            include_str!("../../migrations/postgres/0003_failures.sql"),
            include_str!("../../migrations/postgres/0004_operations.sql"),
            include_str!("../../migrations/postgres/0005_retries.sql"),
            include_str!("../../migrations/postgres/0006_outbox.sql"),
            include_str!("../../migrations/postgres/0007_queue.sql"),
            include_str!("../../migrations/postgres/0008_actions.sql"),
            include_str!("../../migrations/postgres/0009_conflicts.sql"),
            include_str!("../../migrations/postgres/0010_retention.sql"),
            include_str!("../../migrations/postgres/0011_rejected_open.sql"),
            include_str!("../../migrations/postgres/0012_outbox_refusals.sql"),
            include_str!("../../migrations/postgres/0013_outbox_due_order.sql"),
        )
    }
}
