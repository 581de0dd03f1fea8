//! The PostgreSQL queue: a table of the inbox schema (`inbox_queue`) that carries messages
//! between services sharing one PostgreSQL database, with no broker between them. Its functions
//! need the `postgres` feature.
//!
//! - `enqueue` writes a message in the caller's transaction: it is queued exactly when the
//!   transaction's other writes commit.
//! - `claim` takes the oldest visible rows of a queue for a while (the visibility timeout):
//!   `FOR UPDATE SKIP LOCKED`, so consumers in many processes never take the same row, and only a
//!   row with no older row of its aggregate left, so an aggregate's messages are handled one at a
//!   time, in the order they were enqueued.
//! - Settling deletes the row (`ack`); `show_again` makes it visible again later (a nack, or
//!   a claim kept for longer). A claim not settled in time lapses, and the row is claimed again.
//! - A claimed message's envelope carries its [`QueueReceipt`]: when the inbox lives in the same
//!   database, the guard deletes the row in its own transaction, so a message whose handling
//!   committed is never delivered again, even if the consumer dies before it acknowledges.
//!
//! Every consumer of a queue takes from the same rows (one group): a service that wants its own
//! copy of each message reads a queue of its own.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), inbox_core::Error> {
//! use inbox_core::{Envelope, outbox, queue};
//!
//! let mut tx = pool.begin().await?;
//! // ... the application's own writes ...
//! let envelope = Envelope::new("order.placed", "o-1-placed", br#"{"order_id":"o-1"}"#.to_vec())
//!     .with_header(outbox::AGGREGATE_ID, "o-1");
//! queue::enqueue(&mut *tx, "orders", &envelope).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

// Without PostgreSQL only the receipt type is used (the `Backend` trait names it).
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

#[cfg(feature = "postgres")]
use std::collections::BTreeMap;
#[cfg(feature = "postgres")]
use std::time::{Duration, UNIX_EPOCH};

#[cfg(feature = "postgres")]
use sqlx::{Acquire, PgConnection, PgPool, Postgres, Row};

use crate::envelope::Envelope;
use crate::error::Error;
use crate::identity::MAX_ID_LEN;
#[cfg(feature = "postgres")]
use crate::outbox::AGGREGATE_ID;

/// The channel the queue's trigger notifies when a transaction that enqueued commits, with the
/// queue's name as the payload.
pub const CHANNEL: &str = "inbox_queue";

/// The header a delivery from the queue names its queue in.
pub const DESTINATION: &str = "destination";

/// A listener on a connection of its own to `pool`'s database, outside the pool: a listener
/// holds its connection for as long as it listens, and one of the pool's would be missing from
/// the workers and claims it is sized for. It reconnects as a pooled listener does.
#[cfg(feature = "postgres")]
pub async fn listener(pool: &PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let own = sqlx::pool::PoolOptions::<Postgres>::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    sqlx::postgres::PgListener::connect_with(&own).await
}

const ENQUEUE: &str = "INSERT INTO inbox_queue \
     (queue, message_id, message_type, aggregate_id, payload, headers) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb) RETURNING id";

const CLAIM: &str = "WITH due AS ( \
         SELECT q.id FROM inbox_queue q \
         WHERE q.queue = $1 AND q.visible_at <= now() \
           AND (q.aggregate_id IS NULL OR NOT EXISTS ( \
               SELECT 1 FROM inbox_queue older \
               WHERE older.queue = q.queue AND older.aggregate_id = q.aggregate_id \
                 AND older.id < q.id)) \
         ORDER BY q.id LIMIT $2 \
         FOR UPDATE SKIP LOCKED) \
     UPDATE inbox_queue q \
     SET visible_at = now() + make_interval(secs => $3), deliveries = q.deliveries + 1, \
         claim_token = $4 \
     FROM due WHERE q.id = due.id \
     RETURNING q.id, q.message_type, q.message_id, q.payload, q.headers::text AS headers, \
         CASE WHEN isfinite(q.enqueued_at) \
             THEN (extract(epoch FROM q.enqueued_at) * 1000)::bigint END AS enqueued_at_ms, \
         q.deliveries";

const DELETE: &str = "DELETE FROM inbox_queue WHERE id = $1 AND claim_token = $2";

const SHOW_AGAIN: &str = "UPDATE inbox_queue SET visible_at = now() + make_interval(secs => $3) \
     WHERE id = $1 AND claim_token = $2";

/// One claim of one queued row: what settles it. A claim that lapsed and was taken by another
/// consumer settles nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueReceipt {
    id: i64,
    token: String,
}

impl QueueReceipt {
    /// The row's id in `inbox_queue`.
    pub fn id(&self) -> i64 {
        self.id
    }
}

/// A row taken by `claim`.
#[derive(Debug)]
pub struct Claimed {
    /// The message, carrying its [`QueueReceipt`] (see [`Envelope::queue_receipt`]).
    pub envelope: Envelope,
    /// How many times the row was claimed, this time included.
    pub deliveries: u32,
    /// Why the row cannot be read as a message (headers that are not an object of strings), if
    /// it cannot.
    pub unreadable: Option<String>,
}

/// Writes `envelope` to `queue` in the caller's transaction (or on its own, given a pool). Its
/// aggregate is the envelope's [`AGGREGATE_ID`] header, if it has one: the queue hands out an
/// aggregate's messages one at a time, in the order they were enqueued. Returns the row's id.
#[cfg(feature = "postgres")]
pub async fn enqueue<'c>(
    connection: impl Acquire<'c, Database = Postgres>,
    queue: &str,
    envelope: &Envelope,
) -> Result<i64, Error> {
    check_enqueued(queue, envelope)?;
    let headers = serde_json::to_string(envelope.headers())
        .map_err(|error| Error::Encode(error.to_string()))?;
    let mut connection = connection.acquire().await?;
    let id = sqlx::query_scalar(ENQUEUE)
        .bind(queue)
        .bind(envelope.id())
        .bind(envelope.message_type())
        .bind(envelope.headers().get(AGGREGATE_ID))
        .bind(envelope.payload())
        .bind(headers)
        .fetch_one(&mut *connection)
        .await?;
    Ok(id)
}

/// Refuses, before any statement (a refused statement would abort the caller's transaction),
/// what the queue could not store or hand out as a message: a queue name, id or aggregate id
/// that is empty or past [`MAX_ID_LEN`], no type tag, or a NUL byte anywhere PostgreSQL keeps
/// text (the names, the type tag, the headers).
fn check_enqueued(queue: &str, envelope: &Envelope) -> Result<(), Error> {
    let unusable = |text: &str| text.is_empty() || text.len() > MAX_ID_LEN;
    let headers = envelope.headers().iter();
    let mut texts = [queue, envelope.message_type(), envelope.id()]
        .into_iter()
        .chain(headers.flat_map(|(name, value)| [name.as_str(), value.as_str()]));
    let refused = if unusable(queue) {
        "the queue's name is empty or too long"
    } else if envelope.message_type().is_empty() {
        "the message has no type tag"
    } else if unusable(envelope.id()) {
        "the message's id is empty or too long"
    } else if envelope
        .headers()
        .get(crate::outbox::AGGREGATE_ID)
        .is_some_and(|id| unusable(id))
    {
        "the message's aggregate id is empty or too long"
    } else if texts.any(|text| text.contains('\0')) {
        "a name, the type tag or a header holds a NUL byte, which PostgreSQL cannot store"
    } else {
        return Ok(());
    };
    let queue = crate::storable_text(queue);
    let queue: String = queue.chars().take(64).collect();
    Err(Error::Encode(format!(
        "cannot enqueue to `{queue}`: {refused}"
    )))
}

/// Claims up to `limit` visible rows of `queue` for `visibility`, oldest first, each the oldest
/// of its aggregate still queued.
#[cfg(feature = "postgres")]
pub async fn claim(
    pool: &PgPool,
    queue: &str,
    limit: usize,
    visibility: Duration,
) -> Result<Vec<Claimed>, Error> {
    let token = uuid::Uuid::new_v4().to_string();
    let rows = sqlx::query(CLAIM)
        .bind(queue)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(visibility.as_secs_f64())
        .bind(&token)
        .fetch_all(pool)
        .await?;
    let mut claimed = rows
        .iter()
        .map(|row| claimed(row, queue, &token))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    claimed.sort_by_key(|c| c.envelope.queue_receipt().map(QueueReceipt::id));
    Ok(claimed)
}

/// A claimed row as a message.
#[cfg(feature = "postgres")]
fn claimed(row: &sqlx::postgres::PgRow, queue: &str, token: &str) -> Result<Claimed, sqlx::Error> {
    let receipt = QueueReceipt {
        id: row.try_get("id")?,
        token: token.to_owned(),
    };
    let payload: Vec<u8> = row.try_get("payload")?;
    let message_type: String = row.try_get("message_type")?;
    let message_id: String = row.try_get("message_id")?;
    // None for a row a producer's own SQL wrote at `infinity`: no time, and no claim that fails.
    let enqueued_at_ms: Option<i64> = row.try_get("enqueued_at_ms")?;
    let deliveries: i32 = row.try_get("deliveries")?;
    let headers: String = row.try_get("headers")?;
    let (headers, unreadable) = match serde_json::from_str::<BTreeMap<String, String>>(&headers) {
        Ok(headers) => (headers, None),
        Err(error) => {
            let reason = format!("its headers are not an object of strings: {error}");
            (BTreeMap::new(), Some(reason))
        }
    };
    let mut envelope = Envelope::new(message_type, message_id, payload).with_receipt(receipt);
    if let Some(ms) = enqueued_at_ms {
        let produced_at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        envelope = envelope.with_produced_at(produced_at);
    }
    for (name, value) in headers {
        envelope = envelope.with_header(name, value);
    }
    Ok(Claimed {
        envelope: envelope.with_header(DESTINATION, queue),
        deliveries: u32::try_from(deliveries).unwrap_or(1).max(1),
        unreadable,
    })
}

/// Deletes the claimed row: it was handled, or the inbox kept it.
#[cfg(feature = "postgres")]
pub async fn ack(pool: &PgPool, receipt: &QueueReceipt) -> Result<(), Error> {
    dequeue(&mut *pool.acquire().await?, receipt).await?;
    Ok(())
}

/// Deletes the claimed row on `connection`: in the guard's transaction, with the handler's
/// writes. Deletes nothing in a database where the claim was not made.
#[cfg(feature = "postgres")]
pub(crate) async fn dequeue(
    connection: &mut PgConnection,
    receipt: &QueueReceipt,
) -> Result<(), sqlx::Error> {
    sqlx::query(DELETE)
        .bind(receipt.id)
        .bind(&receipt.token)
        .execute(connection)
        .await?;
    Ok(())
}

/// Makes the claimed row visible again after `delay`: zero hands it back at once (a nack), a
/// visibility timeout keeps the claim that much longer (a handler still at work).
#[cfg(feature = "postgres")]
pub async fn show_again(
    pool: &PgPool,
    receipt: &QueueReceipt,
    delay: Duration,
) -> Result<(), Error> {
    sqlx::query(SHOW_AGAIN)
        .bind(receipt.id)
        .bind(&receipt.token)
        .bind(delay.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(())
}
