//! The storage side of the guard: one implementation per database, sharing the same SQL.
//!
//! The statements use `$n` placeholders and `CURRENT_TIMESTAMP`, which PostgreSQL and SQLite both
//! understand; what differs between the backends is how a guarded transaction begins, how a
//! time window is written, and where the schema comes from.

use std::future::Future;

use sqlx::migrate::Migrator;
use sqlx::{Pool, Postgres, Sqlite, Transaction};

use crate::envelope::Envelope;
use crate::store::Store;
use crate::text::storable_text;

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
    /// The SHA-256 of the message's payload, as delivered.
    pub payload_hash: &'a [u8],
    /// Now, in Unix epoch milliseconds: a failed message is retried only once its retry is due.
    pub now_ms: i64,
}

impl<'a> Claim<'a> {
    /// The dedup row this claim inserts.
    pub fn key(&self) -> MessageKey<'a> {
        MessageKey {
            consumer: self.consumer,
            handler: self.handler,
            message_id: self.message_id,
        }
    }

    /// The ordering stream of the message, if it names an aggregate.
    pub fn stream(&self) -> Option<Stream<'a>> {
        Some(Stream {
            consumer: self.consumer,
            handler: self.handler,
            aggregate: self.aggregate?,
        })
    }
}

/// The primary key of a dedup row.
#[derive(Debug, Clone, Copy)]
pub struct MessageKey<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The dedup key.
    pub message_id: &'a str,
}

/// The primary key of an ordering stream: one aggregate, for one handler of one consumer.
#[derive(Debug, Clone, Copy)]
pub struct Stream<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The aggregate.
    pub aggregate: &'a str,
}

/// The answer to a [`Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// First time: the dedup row is now held by this transaction.
    New,
    /// Failed before, with the same content: this is attempt `attempt`, and the row is held by
    /// this transaction.
    Retry {
        /// 2 for the first retry.
        attempt: u32,
    },
    /// Seen before, with this payload hash and status.
    Seen(Seen),
}

/// A dedup row already there, as a claim finds it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Seen {
    /// The hash stored when the message was first recorded.
    pub payload_hash: Vec<u8>,
    /// `processed`, `stale`, `parked`, `failed`, `dead` or `discarded`.
    pub status: String,
    /// When a `failed` message's next attempt is due, in Unix epoch milliseconds.
    pub retry_at_ms: Option<i64>,
}

/// Why a message is dead, kept in its own column (`dead_reason`) so that code acts on it rather
/// than on the error's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// Its strict ordering gap never filled; skipping the gap brings it back.
    GapTimeout,
    /// Its attempts ran out, or its error was permanent.
    GaveUp,
    /// Its stored payload no longer decodes.
    Undecodable,
}

impl DeadReason {
    /// The value stored in the column.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::GapTimeout => "gap_timeout",
            DeadReason::GaveUp => "gave_up",
            DeadReason::Undecodable => "undecodable",
        }
    }
}

/// A failed attempt, as recorded.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The canonical JSON encoding of the message, kept for the retry and for operators.
    pub payload: &'a [u8],
    /// The delivery's headers, as a JSON object.
    pub headers: &'a str,
    /// What went wrong.
    pub error: &'a str,
}

/// A message parked by strict ordering, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ParkedMessage {
    /// The dedup key.
    pub message_id: String,
    /// Its place in the aggregate's stream.
    pub sequence_number: i64,
    /// The canonical JSON encoding of the message.
    pub payload: Vec<u8>,
    /// The delivery's headers, as a JSON object.
    pub headers: Option<String>,
}

/// The stored content of a message, for a replay.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredPayload {
    /// The row's status.
    pub status: String,
    /// The canonical JSON encoding of the message, while it is kept.
    pub payload: Option<Vec<u8>>,
    /// The delivery's headers, as a JSON object.
    pub headers: Option<String>,
}

/// What an operator does about a dead message, by whom and why.
#[derive(Debug, Clone, Copy)]
pub struct Resolution<'a> {
    /// Replay it (`true`) or discard it (`false`).
    pub replay: bool,
    /// Who decided.
    pub by: &'a str,
    /// Why.
    pub reason: &'a str,
}

/// A database the inbox can guard messages in.
///
/// Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database the inbox supports",
    note = "the inbox runs on `sqlx::Postgres` and `sqlx::Sqlite`"
)]
pub trait Backend: Store {
    /// How many messages a runtime handles at once by default: SQLite has one writer at a time,
    /// so more workers there only wait for each other.
    const DEFAULT_WORKERS: usize;

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

    /// Records a failed attempt of a claimed (or released) message, after its transaction rolled
    /// back: the row becomes (or stays) `failed` with the payload, and its attempt count goes up.
    /// Returns the number of failed attempts, or `None` if the row holds another state (handled
    /// meanwhile) or another content (see [`Backend::seen`]).
    fn record_failure(
        conn: &mut Self::Connection,
        claim: &Claim<'_>,
        failure: &Failure<'_>,
    ) -> impl Future<Output = Result<Option<u32>, sqlx::Error>> + Send;

    /// The dedup row of `key`, if there is one.
    fn seen(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
    ) -> impl Future<Output = Result<Option<Seen>, sqlx::Error>> + Send;

    /// Sets when a `failed` message's next attempt is due, in Unix epoch milliseconds.
    fn schedule_retry(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
        retry_at_ms: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Fails if the transaction can no longer commit: PostgreSQL aborts a transaction at its first
    /// failed statement, and then turns `COMMIT` into a silent rollback.
    fn check_open(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Marks a `failed` (or `parked`) message dead, keeping its payload for an operator; `reason`, if
    /// given, replaces its last error and says it is [`DeadReason::Undecodable`], else it
    /// [`DeadReason::GaveUp`].
    fn bury(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
        reason: Option<&str>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Sets the status of a dedup row (`processed`, `stale`), dropping any parked payload.
    fn settle(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
        status: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Locks the stream row, creating it if missing, and moves it to `sequence` if that is newer
    /// than the last applied one. Returns `false` when it is not newer (stale).
    ///
    /// Creation is an upsert on the primary key, so two first messages of a new aggregate serialize
    /// on the key instead of both seeing "no row".
    fn advance_stream(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
        sequence: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Locks the stream row (creating it at 0 if missing, race-free like
    /// [`advance_stream`](Backend::advance_stream)) and returns the last applied sequence.
    fn lock_stream(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Moves a locked stream row to `sequence`.
    fn set_stream(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
        sequence: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Marks a claimed message parked, keeping its payload and headers.
    fn park(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
        payload: &[u8],
        headers: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The parked message of the stream with the lowest sequence, if that sequence is at most
    /// `up_to`.
    fn next_parked(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
        up_to: i64,
    ) -> impl Future<Output = Result<Option<ParkedMessage>, sqlx::Error>> + Send;

    /// Whether the stream has parked messages (a read that takes no lock).
    fn has_parked(
        pool: &Pool<Self>,
        stream: &Stream<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The aggregates of `handler` whose lowest parked message can be released now.
    fn releasable(
        pool: &Pool<Self>,
        consumer: &str,
        handler: &str,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;

    /// For an operator skipping a gap that will not fill, on a locked stream at `last`: brings the
    /// messages that a gap timeout marked dead back to parked, and moves the stream to just before
    /// its lowest parked message if that is ahead of `last + 1`. Never moves the stream backwards.
    fn skip_gap(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
        last: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The aggregates of `handler` whose oldest parked message has waited longer than
    /// `timeout_secs` behind a real gap: its lowest parked sequence is not the next one, and the
    /// next one is absent (not `failed`, waiting for its retry). A read without locks:
    /// [`Backend::bury_gap`] checks again under the stream lock.
    fn overdue_gaps(
        pool: &Pool<Self>,
        consumer: &str,
        handler: &str,
        timeout_secs: f64,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;

    /// On a locked stream at `last`: if its lowest parked message is still behind a gap (and the
    /// missing message is not `failed`, waiting for its retry), marks all
    /// its parked messages dead with the reason "gap timeout at sequence n" (n = `last + 1`, the
    /// missing one). Returns `(n, messages)`, or `None` if the gap has filled meanwhile.
    fn bury_gap(
        conn: &mut Self::Connection,
        stream: &Stream<'_>,
        last: i64,
    ) -> impl Future<Output = Result<Option<(i64, i64)>, sqlx::Error>> + Send;

    /// The status, payload and headers of a dedup row.
    fn stored(
        pool: &Pool<Self>,
        key: &MessageKey<'_>,
    ) -> impl Future<Output = Result<Option<StoredPayload>, sqlx::Error>> + Send;

    /// Records what an operator did about a `dead` or `failed` message: `Replay` makes it
    /// `failed` with no attempts, to be handled again; `Discard` makes it `discarded`. Who and why
    /// are kept with the message, and its payload too. Returns `false` if it was neither dead nor
    /// failed.
    fn resolve(
        conn: &mut Self::Connection,
        key: &MessageKey<'_>,
        resolution: &Resolution<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Keeps a delivery that could not be handled at all, with its exact bytes and the reason.
    fn reject(
        pool: &Pool<Self>,
        consumer: &str,
        envelope: &Envelope,
        reason: &str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

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

const RETRY_CLAIM: &str = "UPDATE inbox_messages \
    SET status = 'processed', payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND status = 'failed' AND payload_hash = $4 \
    AND retry_at_ms <= $5 \
    RETURNING attempt_count";

const SELECT_CLAIM: &str = "SELECT payload_hash, status, retry_at_ms FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const RECORD_FAILURE: &str = "INSERT INTO inbox_messages \
    (consumer, handler, message_id, message_type, aggregate_id, sequence_number, status, payload_hash, \
     payload, headers, attempt_count, first_error, error_text, failed_at, retry_at_ms) \
    VALUES ($1, $2, $3, $4, $5, $6, 'failed', $7, $8, $9, 1, $10, $10, CURRENT_TIMESTAMP, $11) \
    ON CONFLICT (consumer, handler, message_id) DO UPDATE \
    SET status = 'failed', attempt_count = inbox_messages.attempt_count + 1, error_text = excluded.error_text, \
        first_error = COALESCE(inbox_messages.first_error, excluded.first_error), \
        payload = excluded.payload, headers = excluded.headers, processed_at = NULL, \
        failed_at = CURRENT_TIMESTAMP, retry_at_ms = excluded.retry_at_ms \
    WHERE inbox_messages.status IN ('failed', 'parked') AND inbox_messages.payload_hash = excluded.payload_hash \
    RETURNING attempt_count";

const SCHEDULE_RETRY: &str = "UPDATE inbox_messages SET retry_at_ms = $4 \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const SETTLE: &str = "UPDATE inbox_messages \
    SET status = $4, payload = NULL, headers = NULL, processed_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const BURY: &str = "UPDATE inbox_messages SET status = 'dead', error_text = COALESCE($4, error_text), dead_reason = $5 \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND status IN ('failed', 'parked')";

const PARK: &str = "UPDATE inbox_messages \
    SET status = 'parked', payload = $4, headers = $5, processed_at = NULL \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const ADVANCE_STREAM: &str = "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
    VALUES ($1, $2, $3, $4) \
    ON CONFLICT (consumer, handler, aggregate_id) \
    DO UPDATE SET last_sequence = excluded.last_sequence, updated_at = CURRENT_TIMESTAMP \
    WHERE inbox_streams.last_sequence < excluded.last_sequence";

const LOCK_STREAM: &str = "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
    VALUES ($1, $2, $3, 0) \
    ON CONFLICT (consumer, handler, aggregate_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP \
    RETURNING last_sequence";

const SET_STREAM: &str = "UPDATE inbox_streams SET last_sequence = $4, updated_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3";

const NEXT_PARKED: &str = "SELECT message_id, sequence_number, payload, headers FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked' \
    AND sequence_number <= $4 ORDER BY sequence_number LIMIT 1";

const HAS_PARKED: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked' LIMIT 1) AS parked";

const RELEASABLE: &str = "SELECT DISTINCT m.aggregate_id FROM inbox_messages m \
    JOIN inbox_streams s ON s.consumer = m.consumer AND s.handler = m.handler AND s.aggregate_id = m.aggregate_id \
    WHERE m.consumer = $1 AND m.handler = $2 AND m.status = 'parked' \
    AND m.sequence_number <= s.last_sequence + 1";

const REVIVE_GAP_DEAD: &str = "UPDATE inbox_messages SET status = 'parked', error_text = NULL, dead_reason = NULL \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'dead' \
    AND dead_reason = 'gap_timeout'";

/// Whether the missing sequence `$4` of a strict stream is there, failed and waiting for its retry.
const RETRYING_SEQUENCE: &str = "SELECT COUNT(*) FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND sequence_number = $4 AND status = 'failed'";

const PARKED_RANGE: &str = "SELECT MIN(sequence_number), COUNT(*) FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked'";

const BURY_PARKED: &str = "UPDATE inbox_messages SET status = 'dead', error_text = $4, dead_reason = 'gap_timeout' \
    WHERE consumer = $1 AND handler = $2 AND aggregate_id = $3 AND status = 'parked'";

const STORED: &str = "SELECT status, payload, headers FROM inbox_messages \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3";

const REPLAY: &str = "UPDATE inbox_messages SET status = 'failed', attempt_count = 0, retry_at_ms = 0, \
    resolution = 'replayed', resolved_by = $4, resolved_reason = $5, resolved_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND status IN ('dead', 'failed')";

const DISCARD: &str = "UPDATE inbox_messages SET status = 'discarded', \
    resolution = 'discarded', resolved_by = $4, resolved_reason = $5, resolved_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND handler = $2 AND message_id = $3 AND status IN ('dead', 'failed')";

const REJECT: &str = "INSERT INTO inbox_rejected (consumer, message_type, delivery_id, payload, headers, reason) \
    VALUES ($1, $2, $3, $4, $5, $6) RETURNING id";

const CHECK_SCHEMA: &str = "SELECT m.payload, m.headers, m.error_text, m.attempt_count, m.resolution, \
    s.last_sequence, r.reason FROM inbox_messages m, inbox_streams s, inbox_rejected r WHERE 1 = 0";

/// The name of the table that records which inbox migrations ran, kept apart from the
/// application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_inbox_migrations";

macro_rules! sql_backend {
    (
        $db:ty,
        workers: $workers:literal,
        begin: |$pool:ident| $begin:expr,
        overdue: $overdue:literal,
        migrations: $migrations:literal,
        ddl: [$($ddl:literal),*]
    ) => {
        const _: () = {
        /// `(lowest parked sequence, parked messages)` of a stream.
        async fn parked_range(
            conn: &mut <$db as sqlx::Database>::Connection,
            stream: &Stream<'_>,
        ) -> Result<(Option<i64>, i64), sqlx::Error> {
            sqlx::query_as(PARKED_RANGE)
                .bind(stream.consumer)
                .bind(stream.handler)
                .bind(stream.aggregate)
                .fetch_one(&mut *conn)
                .await
        }

        /// Inserts the dedup row or reads the one there; `None` if that one vanished meanwhile.
        async fn try_claim(
            conn: &mut <$db as sqlx::Database>::Connection,
            claim: &Claim<'_>,
        ) -> Result<Option<Claimed>, sqlx::Error> {
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
                return Ok(Some(Claimed::New));
            }
            let failed_attempts: Option<i32> = sqlx::query_scalar(RETRY_CLAIM)
                .bind(claim.consumer)
                .bind(claim.handler)
                .bind(claim.message_id)
                .bind(claim.payload_hash)
                .bind(claim.now_ms)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(failed) = failed_attempts {
                return Ok(Some(Claimed::Retry { attempt: u32::try_from(failed).unwrap_or(0) + 1 }));
            }
            Ok(<$db as Backend>::seen(conn, &claim.key()).await?.map(Claimed::Seen))
        }

        impl Backend for $db {
            const DEFAULT_WORKERS: usize = $workers;

            async fn begin($pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
                $begin.await
            }

            async fn claim(conn: &mut Self::Connection, claim: &Claim<'_>) -> Result<Claimed, sqlx::Error> {
                // A row that conflicts and is then gone was purged in between: claim it again.
                for _ in 0..3 {
                    if let Some(claimed) = try_claim(conn, claim).await? {
                        return Ok(claimed);
                    }
                }
                Err(sqlx::Error::RowNotFound)
            }

            async fn record_failure(
                conn: &mut Self::Connection,
                claim: &Claim<'_>,
                failure: &Failure<'_>,
            ) -> Result<Option<u32>, sqlx::Error> {
                let failed: Option<i32> = sqlx::query_scalar(RECORD_FAILURE)
                    .bind(claim.consumer)
                    .bind(claim.handler)
                    .bind(claim.message_id)
                    .bind(claim.message_type)
                    .bind(claim.aggregate)
                    .bind(claim.sequence)
                    .bind(claim.payload_hash)
                    .bind(failure.payload)
                    .bind(failure.headers)
                    .bind(storable_text(failure.error))
                    .bind(claim.now_ms)
                    .fetch_optional(&mut *conn)
                    .await?;
                Ok(failed.map(|failed| u32::try_from(failed).unwrap_or(0)))
            }

            async fn seen(conn: &mut Self::Connection, key: &MessageKey<'_>) -> Result<Option<Seen>, sqlx::Error> {
                sqlx::query_as(SELECT_CLAIM)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .fetch_optional(&mut *conn)
                    .await
            }

            async fn schedule_retry(
                conn: &mut Self::Connection,
                key: &MessageKey<'_>,
                retry_at_ms: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(SCHEDULE_RETRY)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .bind(retry_at_ms)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn check_open(conn: &mut Self::Connection) -> Result<(), sqlx::Error> {
                sqlx::query("SELECT 1").execute(&mut *conn).await?;
                Ok(())
            }

            async fn bury(
                conn: &mut Self::Connection,
                key: &MessageKey<'_>,
                reason: Option<&str>,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(BURY)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .bind(reason.map(storable_text))
                    .bind(match reason {
                        Some(_) => DeadReason::Undecodable,
                        None => DeadReason::GaveUp,
                    }.as_str())
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn settle(
                conn: &mut Self::Connection,
                key: &MessageKey<'_>,
                status: &'static str,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(SETTLE)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .bind(status)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn advance_stream(
                conn: &mut Self::Connection,
                stream: &Stream<'_>,
                sequence: i64,
            ) -> Result<bool, sqlx::Error> {
                let advanced = sqlx::query(ADVANCE_STREAM)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .bind(sequence)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                Ok(advanced == 1)
            }

            async fn lock_stream(conn: &mut Self::Connection, stream: &Stream<'_>) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(LOCK_STREAM)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .fetch_one(&mut *conn)
                    .await
            }

            async fn set_stream(
                conn: &mut Self::Connection,
                stream: &Stream<'_>,
                sequence: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(SET_STREAM)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .bind(sequence)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn park(
                conn: &mut Self::Connection,
                key: &MessageKey<'_>,
                payload: &[u8],
                headers: &str,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(PARK)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .bind(payload)
                    .bind(headers)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            async fn next_parked(
                conn: &mut Self::Connection,
                stream: &Stream<'_>,
                up_to: i64,
            ) -> Result<Option<ParkedMessage>, sqlx::Error> {
                sqlx::query_as(NEXT_PARKED)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .bind(up_to)
                    .fetch_optional(&mut *conn)
                    .await
            }

            async fn has_parked(pool: &Pool<Self>, stream: &Stream<'_>) -> Result<bool, sqlx::Error> {
                let parked: i64 = sqlx::query_scalar(HAS_PARKED)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .fetch_one(pool)
                    .await?;
                Ok(parked > 0)
            }

            async fn releasable(pool: &Pool<Self>, consumer: &str, handler: &str) -> Result<Vec<String>, sqlx::Error> {
                sqlx::query_scalar(RELEASABLE).bind(consumer).bind(handler).fetch_all(pool).await
            }

            async fn skip_gap(conn: &mut Self::Connection, stream: &Stream<'_>, last: i64) -> Result<(), sqlx::Error> {
                sqlx::query(REVIVE_GAP_DEAD)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .execute(&mut *conn)
                    .await?;
                let (first, _): (Option<i64>, i64) = parked_range(conn, stream).await?;
                match first {
                    Some(first) if first - 1 > last => Self::set_stream(conn, stream, first - 1).await,
                    _ => Ok(()),
                }
            }

            async fn overdue_gaps(
                pool: &Pool<Self>,
                consumer: &str,
                handler: &str,
                timeout_secs: f64,
            ) -> Result<Vec<String>, sqlx::Error> {
                const OVERDUE: &str = concat!(
                    "SELECT m.aggregate_id FROM inbox_messages m \
                     JOIN inbox_streams s ON s.consumer = m.consumer AND s.handler = m.handler AND s.aggregate_id = m.aggregate_id \
                     WHERE m.consumer = $1 AND m.handler = $2 AND m.status = 'parked' \
                     AND NOT EXISTS (SELECT 1 FROM inbox_messages p WHERE p.consumer = m.consumer \
                         AND p.handler = m.handler AND p.aggregate_id = m.aggregate_id \
                         AND p.sequence_number = s.last_sequence + 1 AND p.status = 'failed') \
                     GROUP BY m.aggregate_id, s.last_sequence \
                     HAVING MIN(m.sequence_number) > s.last_sequence + 1 AND MIN(m.received_at) ",
                    $overdue,
                    " ORDER BY m.aggregate_id"
                );
                sqlx::query_scalar(OVERDUE)
                    .bind(consumer)
                    .bind(handler)
                    .bind(timeout_secs)
                    .fetch_all(pool)
                    .await
            }

            async fn bury_gap(
                conn: &mut Self::Connection,
                stream: &Stream<'_>,
                last: i64,
            ) -> Result<Option<(i64, i64)>, sqlx::Error> {
                let (first, parked): (Option<i64>, i64) = parked_range(conn, stream).await?;
                let missing = last.saturating_add(1);
                if !first.is_some_and(|first| first > missing) {
                    return Ok(None);
                }
                let retrying: i64 = sqlx::query_scalar(RETRYING_SEQUENCE)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .bind(missing)
                    .fetch_one(&mut *conn)
                    .await?;
                if retrying > 0 {
                    return Ok(None);
                }
                sqlx::query(BURY_PARKED)
                    .bind(stream.consumer)
                    .bind(stream.handler)
                    .bind(stream.aggregate)
                    .bind(format!("gap timeout at sequence {missing}"))
                    .execute(&mut *conn)
                    .await?;
                Ok(Some((missing, parked)))
            }

            async fn stored(pool: &Pool<Self>, key: &MessageKey<'_>) -> Result<Option<StoredPayload>, sqlx::Error> {
                sqlx::query_as(STORED)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .fetch_optional(pool)
                    .await
            }

            async fn resolve(
                conn: &mut Self::Connection,
                key: &MessageKey<'_>,
                resolution: &Resolution<'_>,
            ) -> Result<bool, sqlx::Error> {
                let sql = if resolution.replay { REPLAY } else { DISCARD };
                let resolved = sqlx::query(sql)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .bind(storable_text(resolution.by))
                    .bind(storable_text(resolution.reason))
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                Ok(resolved == 1)
            }

            async fn reject(
                pool: &Pool<Self>,
                consumer: &str,
                envelope: &Envelope,
                reason: &str,
            ) -> Result<i64, sqlx::Error> {
                let headers = crate::handler::headers_to_json(envelope.headers());
                sqlx::query_scalar(REJECT)
                    .bind(consumer)
                    .bind(storable_text(envelope.message_type()))
                    .bind(storable_text(envelope.id()))
                    .bind(envelope.payload())
                    .bind(headers)
                    .bind(storable_text(reason))
                    .fetch_one(pool)
                    .await
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
                concat!($(include_str!($ddl)),*)
            }
        }
        };
    };
}

sql_backend!(
    Postgres,
    workers: 4,
    begin: |pool| pool.begin_with("BEGIN ISOLATION LEVEL READ COMMITTED"),
    overdue: "< now() - make_interval(secs => $3)",
    migrations: "./migrations/postgres",
    ddl: [
        "../migrations/postgres/0001_inbox.sql",
        "../migrations/postgres/0002_strict_ordering.sql",
        "../migrations/postgres/0003_failures.sql",
        "../migrations/postgres/0004_operations.sql",
        "../migrations/postgres/0005_retries.sql"
    ]
);
sql_backend!(
    Sqlite,
    workers: 1,
    begin: |pool| pool.begin_with("BEGIN IMMEDIATE"),
    overdue: "< datetime('now', '-' || $3 || ' seconds')",
    migrations: "./migrations/sqlite",
    ddl: [
        "../migrations/sqlite/0001_inbox.sql",
        "../migrations/sqlite/0002_strict_ordering.sql",
        "../migrations/sqlite/0003_failures.sql",
        "../migrations/sqlite/0004_operations.sql",
        "../migrations/sqlite/0005_retries.sql"
    ]
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
