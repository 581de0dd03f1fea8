//! The queries that are not on a message's path: what operators list, show and resolve (dead
//! letters, rejected deliveries, counts by status) and the retention purge. One implementation per
//! database, sharing the same SQL, like [`Backend`](crate::Backend).

use std::future::Future;
use std::time::Duration;

use sqlx::{Pool, Postgres, Sqlite};

use crate::backend::{MessageKey, Resolution};
use crate::envelope::Envelope;
use crate::handler::Headers;

/// Which dead messages to list; every field narrows the list.
///
/// ```
/// use std::time::Duration;
/// use inbox_core::DeadLetterFilter;
///
/// let recent_billing = DeadLetterFilter::default()
///     .handler("mark_paid")
///     .message_type("order.paid")
///     .failed_within(Duration::from_secs(24 * 3600));
/// # let _ = recent_billing;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterFilter {
    handler: Option<String>,
    message_type: Option<String>,
    failed_within: Option<Duration>,
    limit: Option<i64>,
    offset: i64,
}

impl DeadLetterFilter {
    /// Only this handler's.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// Only messages of this type tag.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// Only messages whose last failure is at most this old (which leaves out parked messages
    /// whose gap timed out: they never failed).
    pub fn failed_within(mut self, age: Duration) -> Self {
        self.failed_within = Some(age);
        self
    }

    /// At most `count` messages: one page of the listing, which is in a stable order (handler,
    /// aggregate, sequence, id), so that pages do not load every dead letter with its payload.
    ///
    /// ```
    /// use inbox_core::DeadLetterFilter;
    ///
    /// let second_page = DeadLetterFilter::default().limit(100).offset(100);
    /// # let _ = second_page;
    /// ```
    pub fn limit(mut self, count: u32) -> Self {
        self.limit = Some(i64::from(count));
        self
    }

    /// Skips the first `count` messages of the listing (the pages before this one).
    pub fn offset(mut self, count: u32) -> Self {
        self.offset = i64::from(count);
        self
    }
}

/// A delivery that could not be handled at all, kept with its exact bytes.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RejectedDelivery {
    /// Its number, for operators.
    pub id: i64,
    /// The type tag it carried.
    pub message_type: String,
    /// The transport's id for the delivery.
    pub delivery_id: String,
    /// The payload, exactly as delivered.
    pub payload: Vec<u8>,
    /// The delivery's headers, as a JSON object.
    pub headers: String,
    /// What was wrong with it.
    pub reason: String,
}

impl RejectedDelivery {
    /// The delivery as it came, to dispatch it again.
    pub fn envelope(&self) -> Result<Envelope, serde_json::Error> {
        let headers: Headers = serde_json::from_str(&self.headers)?;
        let envelope = Envelope::new(&self.message_type, &self.delivery_id, self.payload.clone());
        Ok(headers
            .into_iter()
            .fold(envelope, |envelope, (name, value)| {
                envelope.with_header(name, value)
            }))
    }
}

/// A dedup row as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredMessage {
    /// The handler (dedup scope).
    pub handler: String,
    /// The dedup key.
    pub message_id: String,
    /// The type tag.
    pub message_type: String,
    /// The aggregate, if any.
    pub aggregate_id: Option<String>,
    /// The sequence, if any.
    pub sequence_number: Option<i64>,
    /// `processed`, `stale`, `parked`, `failed`, `dead` or `discarded`.
    pub status: String,
    /// The first error, for a message that failed.
    pub first_error: Option<String>,
    /// The last error, for a failed or dead message (or why a parked one is dead).
    pub error_text: Option<String>,
    /// How many attempts failed.
    pub attempt_count: i32,
    /// The canonical JSON encoding of the message, kept while it is parked, failed, dead or
    /// discarded.
    pub payload: Option<Vec<u8>>,
    /// What an operator did about it: `replayed` or `discarded`.
    pub resolution: Option<String>,
    /// Who did it.
    pub resolved_by: Option<String>,
    /// Why.
    pub resolved_reason: Option<String>,
    /// Why it is dead, if it is: `gap_timeout`, `gave_up` or `undecodable` (see
    /// [`crate::DeadReason`]).
    pub dead_reason: Option<String>,
    /// When it was first received, in UTC (`YYYY-MM-DD HH:MM:SS`).
    pub received_at: String,
    /// When its last attempt failed, in UTC (`YYYY-MM-DD HH:MM:SS`), if one did.
    pub failed_at: Option<String>,
}

/// The dedup rows of one handler of one consumer, by status.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct HandlerStatus {
    /// The consumer group.
    pub consumer: String,
    /// The handler (dedup scope).
    pub handler: String,
    /// Handled.
    pub processed: i64,
    /// Skipped as older than their aggregate's last applied sequence.
    pub stale: i64,
    /// Waiting for a predecessor (strict ordering).
    pub parked: i64,
    /// Failed, to be retried.
    pub failed: i64,
    /// Given up on: dead letters.
    pub dead: i64,
    /// Dead letters an operator discarded.
    pub discarded: i64,
    /// How long the oldest parked message has waited, in seconds.
    pub oldest_parked_secs: Option<f64>,
}

/// What a purge with a given window would do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct PurgePreview {
    /// Processed and stale rows older than the window: the ones a purge deletes.
    pub purgeable: i64,
    /// Parked messages older than the window, which a purge keeps.
    pub parked: i64,
    /// Dead letters older than the window, which a purge keeps.
    pub dead: i64,
}

/// The right to purge, held by one instance at a time (see [`Store::lead_purge`]).
///
/// On PostgreSQL it holds the connection that owns the advisory lock; the lock goes when
/// [`PurgeLeader::step_down`] closes it, or when the connection drops.
pub struct PurgeLeader<DB: sqlx::Database> {
    lock: Option<DB::Connection>,
}

impl<DB: sqlx::Database> PurgeLeader<DB> {
    /// Gives the right to purge back.
    pub async fn step_down(self) -> Result<(), sqlx::Error> {
        use sqlx::Connection;
        match self.lock {
            Some(lock) => lock.close().await,
            None => Ok(()),
        }
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for PurgeLeader<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurgeLeader")
            .field("locked", &self.lock.is_some())
            .finish()
    }
}

/// The operator's and the housekeeping's side of an inbox database; every [`Backend`](crate::Backend)
/// is one. Implemented for [`sqlx::Postgres`] and [`sqlx::Sqlite`].
pub trait Store: sqlx::Database {
    /// The rejected deliveries of `consumer` that no operator has resolved, oldest first.
    fn rejected(
        pool: &Pool<Self>,
        consumer: &str,
    ) -> impl Future<Output = Result<Vec<RejectedDelivery>, sqlx::Error>> + Send;

    /// Rejected delivery `id` of `consumer`, if no operator has resolved it.
    fn rejected_one(
        pool: &Pool<Self>,
        consumer: &str,
        id: i64,
    ) -> impl Future<Output = Result<Option<RejectedDelivery>, sqlx::Error>> + Send;

    /// Records that an operator replayed or discarded a rejected delivery. Returns `false` if it
    /// does not exist or was resolved already.
    fn resolve_rejected(
        pool: &Pool<Self>,
        consumer: &str,
        id: i64,
        resolution: &Resolution<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The dead messages of `consumer` that match `filter`, by handler, aggregate and sequence.
    fn dead_letters(
        pool: &Pool<Self>,
        consumer: &str,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, sqlx::Error>> + Send;

    /// One dedup row, as operators see it.
    fn show(
        pool: &Pool<Self>,
        key: &MessageKey<'_>,
    ) -> impl Future<Output = Result<Option<StoredMessage>, sqlx::Error>> + Send;

    /// The dedup rows of `consumer` in `status`, by handler, aggregate and sequence.
    fn list(
        pool: &Pool<Self>,
        consumer: &str,
        status: &str,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, sqlx::Error>> + Send;

    /// The `failed` messages of `handler` whose next attempt is due at `now_ms` (Unix epoch
    /// milliseconds), soonest first; at most `limit`. Replays an operator requested are due at
    /// once.
    fn due_retries(
        pool: &Pool<Self>,
        consumer: &str,
        handler: &str,
        now_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send;

    /// `(handler, status, count)` of the parked and dead messages of `consumer`.
    fn backlog(
        pool: &Pool<Self>,
        consumer: &str,
    ) -> impl Future<Output = Result<Vec<(String, String, i64)>, sqlx::Error>> + Send;

    /// The dedup rows of every consumer and handler, by status.
    fn status(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<HandlerStatus>, sqlx::Error>> + Send;

    /// `(consumer, deliveries)` of the rejected deliveries no operator resolved yet.
    fn rejected_counts(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, sqlx::Error>> + Send;

    /// The space the inbox takes, in bytes (PostgreSQL: its tables with their indexes; SQLite:
    /// the whole database file).
    fn storage_bytes(pool: &Pool<Self>) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// What a purge of rows older than `older_than_secs` would delete, and what it keeps.
    fn purge_preview(
        pool: &Pool<Self>,
        older_than_secs: f64,
    ) -> impl Future<Output = Result<PurgePreview, sqlx::Error>> + Send;

    /// Deletes at most `limit` processed or stale rows older than `older_than_secs`, oldest
    /// first, through the index on `processed_at`, in one short transaction. Returns how many.
    fn purge_batch(
        pool: &Pool<Self>,
        older_than_secs: f64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Takes the right to purge if no other instance holds it: an advisory lock on PostgreSQL
    /// (per inbox table, so schemas sharing a database do not contend); on SQLite, whose writers
    /// take turns anyway, always granted.
    fn lead_purge(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Option<PurgeLeader<Self>>, sqlx::Error>> + Send;
}

const REJECTED: &str = "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
    WHERE consumer = $1 AND resolution IS NULL ORDER BY id";

const REJECTED_ONE: &str = "SELECT id, message_type, delivery_id, payload, headers, reason FROM inbox_rejected \
    WHERE consumer = $1 AND id = $2 AND resolution IS NULL";

const RESOLVE_REJECTED: &str = "UPDATE inbox_rejected \
    SET resolution = $3, resolved_by = $4, resolved_reason = $5, resolved_at = CURRENT_TIMESTAMP \
    WHERE consumer = $1 AND id = $2 AND resolution IS NULL";

const REJECTED_COUNTS: &str = "SELECT consumer, COUNT(*) FROM inbox_rejected \
    WHERE resolution IS NULL GROUP BY consumer ORDER BY consumer";

/// The columns of a [`StoredMessage`], for `concat!`, with the backend's `received_at` and
/// `failed_at` as UTC text.
macro_rules! stored_message {
    ($times:literal) => {
        concat!(
            "SELECT handler, message_id, message_type, aggregate_id, sequence_number, status, \
             first_error, error_text, attempt_count, payload, resolution, resolved_by, \
             resolved_reason, dead_reason, ",
            $times,
            " FROM inbox_messages "
        )
    };
}

macro_rules! sql_store {
    (
        $db:ty,
        since: $since:literal,
        age: ($age_head:literal, $age_tail:literal),
        retry_index: $retry_index:literal,
        parked_index: $parked_index:literal,
        times: $times:literal,
        older: $older:literal,
        purge_rows: ($purge_head:literal, $purge_tail:literal),
        storage: $storage:literal,
        lead: |$lead_pool:ident| $lead:expr,
    ) => {
        impl Store for $db {
            async fn rejected(pool: &Pool<Self>, consumer: &str) -> Result<Vec<RejectedDelivery>, sqlx::Error> {
                sqlx::query_as(REJECTED).bind(consumer).fetch_all(pool).await
            }

            async fn rejected_one(pool: &Pool<Self>, consumer: &str, id: i64) -> Result<Option<RejectedDelivery>, sqlx::Error> {
                sqlx::query_as(REJECTED_ONE).bind(consumer).bind(id).fetch_optional(pool).await
            }

            async fn resolve_rejected(
                pool: &Pool<Self>,
                consumer: &str,
                id: i64,
                resolution: &Resolution<'_>,
            ) -> Result<bool, sqlx::Error> {
                let action = if resolution.replay { "replayed" } else { "discarded" };
                let resolved = sqlx::query(RESOLVE_REJECTED)
                    .bind(consumer)
                    .bind(id)
                    .bind(action)
                    .bind(resolution.by)
                    .bind(resolution.reason)
                    .execute(pool)
                    .await?
                    .rows_affected();
                Ok(resolved == 1)
            }

            async fn dead_letters(
                pool: &Pool<Self>,
                consumer: &str,
                filter: &DeadLetterFilter,
            ) -> Result<Vec<StoredMessage>, sqlx::Error> {
                const DEAD_LETTERS: &str = concat!(
                    stored_message!($times),
                    "WHERE consumer = $1 AND status = 'dead' \
                     AND ($2 IS NULL OR handler = $2) AND ($3 IS NULL OR message_type = $3) \
                     AND ($4 IS NULL OR failed_at ",
                    $since,
                    ") ORDER BY handler, aggregate_id, sequence_number, message_id LIMIT $5 OFFSET $6"
                );
                sqlx::query_as(DEAD_LETTERS)
                    .bind(consumer)
                    .bind(filter.handler.as_deref())
                    .bind(filter.message_type.as_deref())
                    .bind(filter.failed_within.map(|age| age.as_secs_f64()))
                    .bind(filter.limit.unwrap_or(i64::MAX))
                    .bind(filter.offset)
                    .fetch_all(pool)
                    .await
            }

            async fn show(pool: &Pool<Self>, key: &MessageKey<'_>) -> Result<Option<StoredMessage>, sqlx::Error> {
                const SHOW: &str = concat!(
                    stored_message!($times),
                    "WHERE consumer = $1 AND handler = $2 AND message_id = $3"
                );
                sqlx::query_as(SHOW)
                    .bind(key.consumer)
                    .bind(key.handler)
                    .bind(key.message_id)
                    .fetch_optional(pool)
                    .await
            }

            async fn list(pool: &Pool<Self>, consumer: &str, status: &str) -> Result<Vec<StoredMessage>, sqlx::Error> {
                const LIST: &str = concat!(
                    stored_message!($times),
                    "WHERE consumer = $1 AND status = $2 ORDER BY handler, aggregate_id, sequence_number, message_id"
                );
                sqlx::query_as(LIST).bind(consumer).bind(status).fetch_all(pool).await
            }

            async fn due_retries(
                pool: &Pool<Self>,
                consumer: &str,
                handler: &str,
                now_ms: i64,
                limit: i64,
            ) -> Result<Vec<String>, sqlx::Error> {
                const DUE_RETRIES: &str = concat!(
                    "SELECT message_id FROM inbox_messages",
                    $retry_index,
                    " WHERE consumer = $1 AND handler = $2 AND status = 'failed' AND retry_at_ms <= $3 \
                     ORDER BY retry_at_ms LIMIT $4"
                );
                sqlx::query_scalar(DUE_RETRIES).bind(consumer).bind(handler).bind(now_ms).bind(limit).fetch_all(pool).await
            }

            async fn backlog(pool: &Pool<Self>, consumer: &str) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
                /// One query per status, so each runs on its partial index: this runs on every sweep.
                const BACKLOG: &str = concat!(
                    "SELECT handler, 'parked' AS status, COUNT(*) FROM inbox_messages",
                    $parked_index,
                    " WHERE consumer = $1 AND status = 'parked' GROUP BY handler \
                     UNION ALL SELECT handler, 'dead' AS status, COUNT(*) FROM inbox_messages \
                     WHERE consumer = $1 AND status = 'dead' GROUP BY handler"
                );
                sqlx::query_as(BACKLOG).bind(consumer).fetch_all(pool).await
            }

            async fn status(pool: &Pool<Self>) -> Result<Vec<HandlerStatus>, sqlx::Error> {
                const STATUS: &str = concat!(
                    "SELECT consumer, handler, \
                     SUM(CASE WHEN status = 'processed' THEN 1 ELSE 0 END) AS processed, \
                     SUM(CASE WHEN status = 'stale' THEN 1 ELSE 0 END) AS stale, \
                     SUM(CASE WHEN status = 'parked' THEN 1 ELSE 0 END) AS parked, \
                     SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed, \
                     SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END) AS dead, \
                     SUM(CASE WHEN status = 'discarded' THEN 1 ELSE 0 END) AS discarded, \
                     MAX(CASE WHEN status = 'parked' THEN ",
                    $age_head,
                    "received_at",
                    $age_tail,
                    " END) AS oldest_parked_secs \
                     FROM inbox_messages GROUP BY consumer, handler ORDER BY consumer, handler"
                );
                sqlx::query_as(STATUS).fetch_all(pool).await
            }

            async fn rejected_counts(pool: &Pool<Self>) -> Result<Vec<(String, i64)>, sqlx::Error> {
                sqlx::query_as(REJECTED_COUNTS).fetch_all(pool).await
            }

            async fn storage_bytes(pool: &Pool<Self>) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar($storage).fetch_one(pool).await
            }

            async fn purge_preview(pool: &Pool<Self>, older_than_secs: f64) -> Result<PurgePreview, sqlx::Error> {
                const PREVIEW: &str = concat!(
                    "SELECT \
                     (SELECT COUNT(*) FROM inbox_messages WHERE status IN ('processed', 'stale') AND processed_at ",
                    $older,
                    ") AS purgeable, (SELECT COUNT(*) FROM inbox_messages WHERE status = 'parked' AND received_at ",
                    $older,
                    ") AS parked, (SELECT COUNT(*) FROM inbox_messages WHERE status = 'dead' \
                     AND COALESCE(failed_at, received_at) ",
                    $older,
                    ") AS dead"
                );
                sqlx::query_as(PREVIEW).bind(older_than_secs).fetch_one(pool).await
            }

            async fn purge_batch(pool: &Pool<Self>, older_than_secs: f64, limit: i64) -> Result<u64, sqlx::Error> {
                const PURGE_BATCH: &str = concat!(
                    $purge_head,
                    " FROM inbox_messages WHERE status IN ('processed', 'stale') AND processed_at ",
                    $older,
                    " ORDER BY processed_at LIMIT $2",
                    $purge_tail
                );
                let purged = sqlx::query(PURGE_BATCH).bind(older_than_secs).bind(limit).execute(pool).await?;
                Ok(purged.rows_affected())
            }

            async fn lead_purge($lead_pool: &Pool<Self>) -> Result<Option<PurgeLeader<Self>>, sqlx::Error> {
                $lead
            }
        }
    };
}

sql_store!(
    Postgres,
    since: ">= now() - make_interval(secs => $4)",
    age: ("EXTRACT(EPOCH FROM now() - ", ")::float8"),
    retry_index: "",
    parked_index: "",
    times: "to_char(received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS received_at, \
            to_char(failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS failed_at",
    older: "< now() - make_interval(secs => $1)",
    // By physical row id: a join on the key would scan the table once per batch.
    purge_rows: (
        "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid",
        " FOR UPDATE SKIP LOCKED))"
    ),
    storage: "SELECT (pg_total_relation_size('inbox_messages') + pg_total_relation_size('inbox_streams') \
              + pg_total_relation_size('inbox_rejected'))::int8",
    lead: |pool| lead_with_advisory_lock(pool).await,
);
sql_store!(
    Sqlite,
    since: ">= datetime('now', '-' || $4 || ' seconds')",
    age: ("(julianday('now') - julianday(", ")) * 86400.0"),
    // Without statistics, SQLite would rather walk the primary key of the consumer.
    retry_index: " INDEXED BY inbox_messages_retry_due",
    parked_index: " INDEXED BY inbox_messages_parked",
    times: "received_at, failed_at",
    older: "< datetime('now', '-' || $1 || ' seconds')",
    purge_rows: (
        "DELETE FROM inbox_messages WHERE (consumer, handler, message_id) IN (SELECT consumer, handler, message_id",
        ")"
    ),
    storage: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
    lead: |_pool| Ok(Some(PurgeLeader { lock: None })),
);

/// Takes the PostgreSQL advisory lock that elects the purging instance, on a connection of its
/// own that leaves the pool, so the lock lives exactly as long as that connection.
async fn lead_with_advisory_lock(
    pool: &Pool<Postgres>,
) -> Result<Option<PurgeLeader<Postgres>>, sqlx::Error> {
    /// The lock's first key, "inbx"; the second is the inbox table's oid.
    const PURGE_LOCK_CLASS: i32 = 0x696e_6278;
    let mut lock = pool.acquire().await?.detach();
    let led: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_lock($1, 'inbox_messages'::regclass::oid::int4)",
    )
    .bind(PURGE_LOCK_CLASS)
    .fetch_one(&mut lock)
    .await?;
    if led {
        return Ok(Some(PurgeLeader { lock: Some(lock) }));
    }
    sqlx::Connection::close(lock).await?;
    Ok(None)
}
