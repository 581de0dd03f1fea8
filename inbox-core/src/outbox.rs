//! The outbox: what a transaction publishes commits with it.
//!
//! [`publish`] writes a message to the outbox table in the caller's transaction (a handler's
//! [`Context::publish`](crate::Context::publish) does the same in the guarded one), so it exists
//! exactly when the transaction's other writes do: a rollback publishes nothing, a commit
//! publishes it at least once. A relay (`inbox::outbox::Relay`) then publishes the committed
//! messages to a broker, in order per aggregate, under their outbox id as the envelope id, so
//! that the inbox on the other side drops what the relay may publish twice.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), inbox_core::Error> {
//! use inbox_core::{Message, outbox};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct OrderPlaced { order_id: String }
//! impl Message for OrderPlaced { const TYPE: &'static str = "order.placed"; }
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! inbox_core::migrate(&pool).await?;
//!
//! let mut tx = pool.begin().await?;
//! // ... the application's own writes ...
//! let placed = OrderPlaced { order_id: "o-1".into() };
//! outbox::publish(&mut *tx, outbox::Outgoing::encode(&placed)?.aggregate("o-1")).await?;
//! tx.rollback().await?; // nothing was published
//!
//! let mut tx = pool.begin().await?;
//! let id = outbox::publish(&mut *tx, &placed).await?;
//! tx.commit().await?; // the relay publishes it, under `id`
//! let pending = outbox::list(&pool, None, 10).await?;
//! assert_eq!((pending.len(), pending[0].id.as_str()), (1, id.as_str()));
//! # Ok(()) }
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use sqlx::{Acquire, Connection};

use crate::envelope::Envelope;
use crate::error::Error;
use crate::identity::MAX_ID_LEN;
use crate::keys::Headers;
use crate::message::Message;
use crate::storage::{self, Backend};

pub use crate::storage::outbox::{OutboxBacklog, OutboxMessage, OutboxStatus};

/// The header holding the id of the conversation a message belongs to: a handler's publications
/// carry the correlation id of the message it handles, or that message's id if it had none.
pub const CORRELATION_ID: &str = "correlation-id";

/// The header holding the id of the message whose handling published this one.
pub const CAUSATION_ID: &str = "causation-id";

/// The header a relay publishes a message's aggregate under (the broker's partition key where
/// it has one).
pub const AGGREGATE_ID: &str = "aggregate-id";

/// The header a relay publishes a message's place in its aggregate under (1, 2, 3, ...), which a
/// receiving handler can take as its `sequence`.
pub const AGGREGATE_SEQUENCE: &str = "aggregate-sequence";

/// A message on its way to the outbox: its type tag, payload, headers, and optionally its
/// aggregate (messages of one aggregate are published in the order they were written) and
/// destination (where the relay publishes it, instead of where it routes the type).
///
/// ```
/// # use inbox_core as inbox;
/// use inbox::outbox::Outgoing;
///
/// let raw = Outgoing::new("order.placed", br#"{"order_id":"o-1"}"#.to_vec())
///     .aggregate("o-1")
///     .destination("orders")
///     .with_header("tenant", "acme");
/// assert_eq!(raw.aggregate_id(), Some("o-1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    message_type: String,
    payload: Vec<u8>,
    headers: Headers,
    aggregate: Option<String>,
    destination: Option<String>,
}

impl Outgoing {
    /// A message of type tag `message_type` with a payload already encoded.
    pub fn new(message_type: impl Into<String>, payload: Vec<u8>) -> Self {
        Self {
            message_type: message_type.into(),
            payload,
            headers: Headers::new(),
            aggregate: None,
            destination: None,
        }
    }

    /// A typed message, encoded as JSON under its type tag, in its own aggregate if its type
    /// names one (`#[message(aggregate = "field")]`).
    pub fn encode<M: Message>(message: &M) -> Result<Self, Error> {
        let envelope = Envelope::encode("", message)?;
        let outgoing = Self::new(M::TYPE, envelope.payload().to_vec());
        Ok(match message.aggregate() {
            Some(aggregate) => outgoing.aggregate(aggregate),
            None => outgoing,
        })
    }

    /// Puts the message in `aggregate`'s stream: published after the aggregate's earlier
    /// messages, and partitioned by it.
    pub fn aggregate(mut self, aggregate: impl Into<String>) -> Self {
        self.aggregate = Some(aggregate.into());
        self
    }

    /// Publishes the message to `destination` (a subject, routing key or stream) rather than
    /// where the relay routes its type.
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The aggregate the message is published in order within, if any.
    pub fn aggregate_id(&self) -> Option<&str> {
        self.aggregate.as_deref()
    }

    /// Sets the headers a handler's publication carries from the message it handles, where the
    /// writer did not set them.
    pub(crate) fn caused_by(mut self, message_id: &str, headers: &Headers) -> Self {
        let correlation = crate::envelope::correlation_id(headers).unwrap_or(message_id);
        for (name, value) in [(CORRELATION_ID, correlation), (CAUSATION_ID, message_id)] {
            // An id from a broker may hold a line break, which no header carries: escaped.
            let carried_value = match carried(name, value) {
                true => value.to_owned(),
                false => value.escape_debug().to_string(),
            };
            self.headers.entry(name.to_owned()).or_insert(carried_value);
        }
        self
    }

    /// This message, with the current trace context added (feature `opentelemetry`), if its
    /// aggregate and headers are ones the outbox can keep and brokers carry, and no text of it
    /// holds a NUL byte (checked before any statement: a refused one would abort the caller's
    /// transaction).
    pub(crate) fn checked(mut self) -> Result<Self, Error> {
        crate::trace_context::inject_current(&mut self.headers);
        let texts = [
            ("type tag", Some(self.message_type.as_str())),
            ("destination", self.destination.as_deref()),
            ("aggregate id", self.aggregate.as_deref()),
        ];
        if let Some((what, _)) = texts
            .iter()
            .find(|(_, text)| text.is_some_and(|text| text.contains('\0')))
        {
            return Err(Error::InvalidIdentity {
                what,
                reason: format!("an outbox {what} cannot hold a NUL byte"),
            });
        }
        if let Some((name, _)) = self
            .headers
            .iter()
            .find(|(name, value)| !carried(name, value))
        {
            return Err(Error::InvalidIdentity {
                what: "header",
                reason: format!(
                    "header `{}` cannot be carried: names are printable ASCII without `:` or spaces, values have no line breaks or NUL bytes",
                    name.escape_debug()
                ),
            });
        }
        match &self.aggregate {
            Some(aggregate) if aggregate.is_empty() || aggregate.len() > MAX_ID_LEN => {
                Err(Error::InvalidIdentity {
                    what: "aggregate id",
                    reason: format!(
                        "an outbox aggregate must be 1 to {MAX_ID_LEN} bytes, not {}",
                        aggregate.len()
                    ),
                })
            }
            _ => Ok(self),
        }
    }
}

/// Whether every broker carries a header of this name and value (HTTP's token rules, as NATS
/// enforces them).
fn carried(name: &str, value: &str) -> bool {
    let name_ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    name_ok && !value.contains(['\r', '\n', '\0'])
}

impl From<Envelope> for Outgoing {
    /// A raw envelope's type tag, payload and headers (the outbox gives it an id of its own), in
    /// the aggregate its [`AGGREGATE_ID`] header names, if any (as [`Envelope::encode`] writes it):
    /// a forwarded message keeps its place in its aggregate's order.
    fn from(envelope: Envelope) -> Self {
        Outgoing::from(&envelope)
    }
}

impl From<&Envelope> for Outgoing {
    /// A borrowed raw envelope, copied as an owned one is taken.
    fn from(envelope: &Envelope) -> Self {
        let mut outgoing = Outgoing::new(envelope.message_type(), envelope.payload().to_vec());
        outgoing.headers = envelope.headers().clone();
        let aggregate = envelope.headers().get(AGGREGATE_ID);
        outgoing.aggregate = aggregate.filter(|aggregate| !aggregate.is_empty()).cloned();
        outgoing
    }
}

/// What [`publish`] takes: a typed message (`&M`), an [`Outgoing`], or a raw [`Envelope`] (each
/// of the last two by value or by reference).
pub trait IntoOutgoing {
    /// The message as it goes to the outbox.
    fn into_outgoing(self) -> Result<Outgoing, Error>;
}

impl<M: Message> IntoOutgoing for &M {
    fn into_outgoing(self) -> Result<Outgoing, Error> {
        Outgoing::encode(self)
    }
}

impl IntoOutgoing for Outgoing {
    fn into_outgoing(self) -> Result<Outgoing, Error> {
        Ok(self)
    }
}

impl IntoOutgoing for Envelope {
    fn into_outgoing(self) -> Result<Outgoing, Error> {
        Ok(Outgoing::from(self))
    }
}

/// A borrowed [`Outgoing`], cloned.
impl IntoOutgoing for &Outgoing {
    fn into_outgoing(self) -> Result<Outgoing, Error> {
        Ok(self.clone())
    }
}

/// A borrowed [`Envelope`]: its type tag, payload and headers, copied.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), inbox_core::Error> {
/// use inbox_core::{Backend, Context, Envelope, outbox};
/// use inbox_core::outbox::{IntoOutgoing, Outgoing};
///
/// let envelope = Envelope::new("order.placed", "d-1", b"{}".to_vec()).with_header("trace", "t");
/// let outgoing = (&envelope).into_outgoing()?;
/// assert_eq!(outgoing, Outgoing::from(envelope.clone()));
/// assert_eq!((&outgoing).into_outgoing()?, outgoing);
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// inbox_core::migrate(&pool).await?;
/// let mut tx = pool.begin().await?;
/// outbox::publish(&mut *tx, &envelope).await?;
/// outbox::publish(&mut *tx, &outgoing).await?;
/// tx.commit().await?;
/// assert_eq!(outbox::list(&pool, None, 10).await?.len(), 2);
///
/// // A handler forwarding what it received, by reference:
/// async fn forward<DB: Backend>(ctx: &mut Context<'_, DB>, received: &Envelope) -> Result<String, inbox_core::Error> {
///     ctx.publish(received).await
/// }
/// # Ok(()) }
/// ```
impl IntoOutgoing for &Envelope {
    fn into_outgoing(self) -> Result<Outgoing, Error> {
        Ok(Outgoing::from(self))
    }
}

/// Writes `message` to the outbox on `conn` (a transaction's connection, `&mut *tx`), where it
/// commits or rolls back with the transaction's other writes; gives the id it is published
/// under. A message of an aggregate holds the aggregate's outbox lock until the transaction
/// ends, so that concurrent writers of one aggregate are published in the order they commit.
///
/// On a connection outside a transaction (a pool, a plain connection) the message is written in
/// a transaction of its own: counted in its aggregate and stored at once, so no later message of
/// the aggregate can be published before it is stored.
pub fn publish<'c, A>(conn: A, message: impl IntoOutgoing) -> BoxFuture<'c, Result<String, Error>>
where
    A: Acquire<'c, Database: Backend> + Send + 'c,
{
    let outgoing = message.into_outgoing().and_then(Outgoing::checked);
    Box::pin(async move {
        let outgoing = outgoing?;
        let mut conn = conn.acquire().await?;
        if conn.is_in_transaction() {
            return write::<A::Database>(&mut conn, &outgoing).await;
        }
        let mut tx = A::Database::begin_on(&mut conn).await?;
        let id = write::<A::Database>(&mut tx, &outgoing).await?;
        tx.commit().await?;
        Ok(id)
    })
}

/// Writes `outgoing` on `conn`; gives its id.
pub(crate) async fn write<DB: Backend>(
    conn: &mut DB::Connection,
    outgoing: &Outgoing,
) -> Result<String, Error> {
    let id = uuid::Uuid::now_v7().hyphenated().to_string();
    let row = storage::outbox::NewOutboxMessage {
        id: &id,
        message_type: &outgoing.message_type,
        destination: outgoing.destination.as_deref(),
        aggregate_id: outgoing.aggregate.as_deref(),
        payload: &outgoing.payload,
        headers: &outgoing.headers,
        now_ms: now_ms(),
    };
    storage::outbox::write::<DB>(conn, &row).await?;
    Ok(id)
}

/// Up to `limit` outbox messages of `status` (or, with `None`, every one not published yet), in
/// the order they were written.
pub async fn list<DB: Backend>(
    pool: &sqlx::Pool<DB>,
    status: Option<OutboxStatus>,
    limit: u32,
) -> Result<Vec<OutboxMessage>, Error> {
    Ok(storage::outbox::list(pool, status, limit).await?)
}

/// Makes the failed outbox message `id` (or, with `None`, every failed one) pending again, its
/// attempts counted from zero; gives how many.
pub async fn retry<DB: Backend>(pool: &sqlx::Pool<DB>, id: Option<&str>) -> Result<u64, Error> {
    Ok(storage::outbox::retry(pool, id).await?)
}

/// What the outbox has not published: pending and failed messages, and the oldest one's age.
pub async fn backlog<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<OutboxBacklog, Error> {
    Ok(storage::outbox::backlog(pool).await?)
}

/// Now, in Unix epoch milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_envelope_keeps_the_aggregate_its_header_names() {
        let envelope = Envelope::new("order.placed", "d-1", b"{}".to_vec());
        assert_eq!(Outgoing::from(&envelope).aggregate_id(), None);
        let envelope = envelope.with_header(AGGREGATE_ID, "o-1");
        assert_eq!(Outgoing::from(&envelope).aggregate_id(), Some("o-1"));
        assert_eq!(Outgoing::from(envelope).aggregate_id(), Some("o-1"));
    }

    #[test]
    fn a_nul_byte_is_refused_before_any_statement() {
        let sound = || Outgoing::new("order.placed", b"{}".to_vec());
        let refused = [
            Outgoing::new("order\0placed", b"{}".to_vec()),
            sound().destination("orders\0"),
            sound().aggregate("o\0-1"),
            sound().with_header("note", "a\0b"),
        ];
        for outgoing in refused {
            let error = outgoing.clone().checked().unwrap_err();
            assert!(error.to_string().contains("NUL"), "{outgoing:?}: {error}");
        }
        assert!(sound().checked().is_ok());
    }

    #[test]
    fn a_cause_whose_id_holds_a_line_break_is_carried_escaped() {
        let outgoing = Outgoing::new("order.placed", b"{}".to_vec());
        let caused = outgoing.caused_by("m\n1", &Headers::new());
        assert_eq!(caused.headers[CAUSATION_ID], "m\\n1");
        assert_eq!(caused.headers[CORRELATION_ID], "m\\n1");
        assert!(caused.checked().is_ok());
    }
}
