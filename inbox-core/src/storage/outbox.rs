//! Outbox rows: written in the application's transactions, claimed and marked by the relay,
//! listed and retried by operators.
//!
//! Order per aggregate rests on two rules. Writing a message of an aggregate counts it in the
//! aggregate's row of `inbox_outbox_streams`, whose lock the writing transaction holds until it
//! ends, so an aggregate's sequences follow the order its transactions commit in. And the relay
//! claims only messages that are first among their aggregate's unpublished ones: while one relay
//! holds an aggregate's first message, no other relay can claim any of that aggregate's. A claim
//! is a lease: the claimed messages are due again only when it ends, so the relay publishes them
//! outside any transaction (holding no lock, and on SQLite not the write lock, while it waits for
//! the broker), and a relay that died is replaced once its lease is over.

use sqlx::Pool;

use super::sql::{self, Columns, FromColumns, Param, named};
use super::{Backend, returning};
use crate::envelope::Envelope;
use crate::keys::{Headers, headers_to_json};
use crate::text::storable_text;

/// Where an outbox message is: waiting for the relay, published, or given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxStatus {
    /// Not published yet; the relay publishes it once it is due.
    Pending,
    /// Published and confirmed by the broker.
    Published,
    /// The relay gave up after its attempts (the broker kept refusing it): kept with its last
    /// error until an operator retries it. Later messages of its aggregate wait behind it.
    Failed,
}

impl OutboxStatus {
    /// The value stored in the column.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Pending => "pending",
            OutboxStatus::Published => "published",
            OutboxStatus::Failed => "failed",
        }
    }

    /// The status a column value names, if it names one.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::outbox::OutboxStatus;
    /// assert_eq!(OutboxStatus::parse("failed"), Some(OutboxStatus::Failed));
    /// assert_eq!(OutboxStatus::parse("lost"), None);
    /// ```
    pub fn parse(value: &str) -> Option<Self> {
        [Self::Pending, Self::Published, Self::Failed]
            .into_iter()
            .find(|status| status.as_str() == value)
    }
}

/// One message as the outbox holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Its place in the order messages were written in.
    pub position: i64,
    /// Its id (a UUIDv7), the envelope id it is published with.
    pub id: String,
    /// Its type tag.
    pub message_type: String,
    /// Where to publish it, if the writer said; else the relay's routing decides.
    pub destination: Option<String>,
    /// Its aggregate, if it has one: the unit of order and the partition key.
    pub aggregate_id: Option<String>,
    /// Its place among its aggregate's messages (1 for the first).
    pub aggregate_sequence: Option<i64>,
    /// The payload, exactly as written.
    pub payload: Vec<u8>,
    /// Its headers.
    pub headers: Headers,
    /// Why its stored headers could not be read, if they could not (a hand edit of the table):
    /// [`headers`](Self::headers) is then empty, and the relay refuses the message rather than
    /// publish it without them.
    pub unreadable_headers: Option<String>,
    /// Where it is.
    pub status: OutboxStatus,
    /// How many times the relay tried to publish it.
    pub attempts: i32,
    /// How many of those tries the broker refused it (the others found the broker out of
    /// reach); only refusals spend the relay's retry budget.
    pub refusals: i32,
    /// The last publication's error, if it failed.
    pub last_error: Option<String>,
    /// When the relay may try it next, in Unix epoch milliseconds.
    pub due_at_ms: i64,
    /// When it was written, in Unix epoch milliseconds.
    pub created_at_ms: i64,
    /// When it was published, in Unix epoch milliseconds.
    pub published_at_ms: Option<i64>,
}

impl OutboxMessage {
    /// The envelope it is published as: its id, type tag, payload and headers, plus its
    /// aggregate and sequence under [`AGGREGATE_ID`](crate::outbox::AGGREGATE_ID) and
    /// [`AGGREGATE_SEQUENCE`](crate::outbox::AGGREGATE_SEQUENCE).
    pub fn envelope(&self) -> Envelope {
        let mut envelope = Envelope::new(&self.message_type, &self.id, self.payload.clone());
        for (name, value) in &self.headers {
            envelope = envelope.with_header(name, value);
        }
        if let (Some(aggregate), Some(sequence)) = (&self.aggregate_id, self.aggregate_sequence) {
            envelope = envelope
                .with_header(crate::outbox::AGGREGATE_ID, aggregate)
                .with_header(crate::outbox::AGGREGATE_SEQUENCE, sequence.to_string());
        }
        envelope
    }
}

impl FromColumns for OutboxMessage {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        let (headers, unreadable_headers) = match serde_json::from_str(&row.text(7)?) {
            Ok(headers) => (headers, None),
            Err(error) => {
                let reason = format!("its stored headers are not an object of strings: {error}");
                (Headers::new(), Some(reason))
            }
        };
        Ok(Self {
            position: row.int(0)?,
            id: row.text(1)?,
            message_type: row.text(2)?,
            destination: row.maybe_text(3)?,
            aggregate_id: row.maybe_text(4)?,
            aggregate_sequence: row.maybe_int(5)?,
            payload: row.maybe_bytes(6)?.unwrap_or_default(),
            headers,
            unreadable_headers,
            status: named(row, 8, OutboxStatus::parse)?,
            attempts: row.int32(9)?,
            refusals: row.int32(14)?,
            last_error: row.maybe_text(10)?,
            due_at_ms: row.int(11)?,
            created_at_ms: row.int(12)?,
            published_at_ms: row.maybe_int(13)?,
        })
    }
}

/// A message to write to the outbox.
#[derive(Debug, Clone, Copy)]
pub struct NewOutboxMessage<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its type tag.
    pub message_type: &'a str,
    /// Where to publish it, if not where the relay routes its type.
    pub destination: Option<&'a str>,
    /// Its aggregate.
    pub aggregate_id: Option<&'a str>,
    /// Its payload.
    pub payload: &'a [u8],
    /// Its headers.
    pub headers: &'a Headers,
    /// Now, in Unix epoch milliseconds.
    pub now_ms: i64,
}

/// Writes `message` on `conn`, counting it in its aggregate's sequence first; gives that
/// sequence.
pub async fn write<DB: Backend>(
    conn: &mut DB::Connection,
    message: &NewOutboxMessage<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    let statements = DB::SQL.outbox;
    let sequence = match message.aggregate_id {
        Some(aggregate) => {
            let key = [Param::Text(aggregate)];
            let next = returning::<DB, i64>(conn, statements.advance, &key, &key).await?;
            Some(next.ok_or(sqlx::Error::RowNotFound)?)
        }
        None => None,
    };
    let headers = headers_to_json(message.headers);
    let params = [
        Param::Text(message.id),
        Param::Text(message.message_type),
        Param::MaybeText(message.destination),
        Param::MaybeText(message.aggregate_id),
        Param::MaybeInt(sequence),
        Param::Bytes(message.payload),
        Param::Text(&headers),
        Param::Int(message.now_ms),
        // Due at once: claims take due messages in the order they fell due.
        Param::Int(message.now_ms),
    ];
    sql::execute::<DB>(conn, statements.insert, &params).await?;
    Ok(sequence)
}

/// Claims up to `limit` pending messages due at `now_ms` that are each the first unpublished
/// message of their aggregate (so no two share an aggregate), in the order they fell due, then
/// as written (a message tried again waits behind those due before it, so a destination that
/// keeps failing does not hold back the messages written after its own),
/// skipping those another relay is claiming; each is leased until `lease_until_ms` (due again
/// only then, and so given with that as its [`due_at_ms`](OutboxMessage::due_at_ms), the lease
/// [`mark_failed`] checks), once `conn`'s transaction commits.
pub async fn claim<DB: Backend>(
    conn: &mut DB::Connection,
    now_ms: i64,
    lease_until_ms: i64,
    limit: u32,
) -> Result<Vec<OutboxMessage>, sqlx::Error> {
    let params = [Param::Int(now_ms), Param::Int(i64::from(limit))];
    let found = sql::fetch_all::<DB, OutboxMessage>(conn, DB::SQL.outbox.claim, &params).await?;
    let mut claimed = Vec::with_capacity(found.len());
    for mut message in found {
        if !first_of_aggregate::<DB>(conn, &message).await? {
            continue;
        }
        let params = [Param::Int(lease_until_ms), Param::Int(message.position)];
        sql::execute::<DB>(conn, DB::SQL.outbox.lease, &params).await?;
        message.due_at_ms = lease_until_ms;
        claimed.push(message);
    }
    Ok(claimed)
}

/// Whether no earlier message of `message`'s aggregate is unpublished, as a statement of its own
/// sees it, where the claim's own check may have read an older snapshot.
async fn first_of_aggregate<DB: Backend>(
    conn: &mut DB::Connection,
    message: &OutboxMessage,
) -> Result<bool, sqlx::Error> {
    let (Some(recheck), Some(aggregate), Some(sequence)) = (
        DB::SQL.outbox.recheck,
        message.aggregate_id.as_deref(),
        message.aggregate_sequence,
    ) else {
        return Ok(true);
    };
    let params = [Param::Text(aggregate), Param::Int(sequence)];
    Ok(sql::fetch_one::<DB, i64>(conn, recheck, &params).await? == 0)
}

/// Marks the message at `position` published at `now_ms`, unless it is published already (by a
/// relay that took it over when this one's lease ran out). A publication the broker confirmed
/// counts even when the lease it was made under ran out meanwhile: the message is out, whatever
/// another relay's try of it said since.
pub async fn mark_published<DB: Backend>(
    conn: &mut DB::Connection,
    position: i64,
    now_ms: i64,
) -> Result<(), sqlx::Error> {
    let params = [Param::Int(now_ms), Param::Int(position)];
    sql::execute::<DB>(conn, DB::SQL.outbox.published, &params).await?;
    Ok(())
}

/// Counts a failed publication of `claimed` (a message as [`claim`] gave it), with its `error`
/// (and as a refusal if the broker `refused` it): it is tried again at `due_at_ms`, or, with
/// `None`, the relay gives up on it ([`OutboxStatus::Failed`]). Only while its claim holds: once
/// the lease ran out and another relay claimed the message again, or published it, that relay's
/// word stands, so a late failure neither cuts the new lease short nor gives up on a message
/// being published. NUL characters in `error` are stored escaped ([`storable_text`]).
pub async fn mark_failed<DB: Backend>(
    conn: &mut DB::Connection,
    claimed: &OutboxMessage,
    error: &str,
    refused: bool,
    due_at_ms: Option<i64>,
) -> Result<(), sqlx::Error> {
    let status = match due_at_ms {
        Some(_) => OutboxStatus::Pending,
        None => OutboxStatus::Failed,
    };
    let error = storable_text(error);
    let params = [
        Param::Int(i64::from(refused)),
        Param::Text(&error),
        Param::Int(due_at_ms.unwrap_or(0)),
        Param::Text(status.as_str()),
        Param::Int(claimed.position),
        Param::Int(claimed.due_at_ms),
    ];
    sql::execute::<DB>(conn, DB::SQL.outbox.failed, &params).await?;
    Ok(())
}

/// Up to `limit` messages of `status` (or, with `None`, every message not published yet), in the
/// order they were written.
pub async fn list<DB: Backend>(
    pool: &Pool<DB>,
    status: Option<OutboxStatus>,
    limit: u32,
) -> Result<Vec<OutboxMessage>, sqlx::Error> {
    let (first, second) = match status {
        Some(status) => (status, status),
        None => (OutboxStatus::Pending, OutboxStatus::Failed),
    };
    let params = [
        Param::Text(first.as_str()),
        Param::Text(second.as_str()),
        Param::Int(i64::from(limit)),
    ];
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, OutboxMessage>(&mut conn, DB::SQL.outbox.list, &params).await
}

/// Makes the failed message `id` (or, with `None`, every failed message) pending again, with
/// its attempts counted from zero; gives how many it made pending.
pub async fn retry<DB: Backend>(pool: &Pool<DB>, id: Option<&str>) -> Result<u64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    match id {
        Some(id) => sql::execute::<DB>(&mut conn, DB::SQL.outbox.retry, &[Param::Text(id)]).await,
        None => sql::execute::<DB>(&mut conn, DB::SQL.outbox.retry_all, &[]).await,
    }
}

/// What the outbox has not published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxBacklog {
    /// Messages waiting for the relay.
    pub pending: i64,
    /// Messages the relay gave up on.
    pub failed: i64,
    /// When the oldest of them was written, in Unix epoch milliseconds.
    pub oldest_created_at_ms: Option<i64>,
}

impl FromColumns for OutboxBacklog {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(Self {
            pending: row.int(0)?,
            failed: row.int(1)?,
            oldest_created_at_ms: row.maybe_int(2)?,
        })
    }
}

/// What the outbox has not published.
pub async fn backlog<DB: Backend>(pool: &Pool<DB>) -> Result<OutboxBacklog, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_one::<DB, OutboxBacklog>(&mut conn, DB::SQL.outbox.backlog, &[]).await
}

/// Deletes up to `limit` messages published before `before_ms`, oldest first; gives how many.
pub async fn purge<DB: Backend>(
    pool: &Pool<DB>,
    before_ms: i64,
    limit: u32,
) -> Result<u64, sqlx::Error> {
    let params = [Param::Int(before_ms), Param::Int(i64::from(limit))];
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, DB::SQL.outbox.purge, &params).await
}
