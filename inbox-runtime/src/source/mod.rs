//! Where deliveries come from: a [`Source`] yields [`Delivery`]s, each acknowledged only after its
//! handlers committed, or handed back for redelivery.

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(any(feature = "postgres-queue", feature = "redis"))]
mod in_flight;
#[cfg(feature = "kafka")]
pub mod kafka;
mod memory;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "postgres-queue")]
pub mod postgres_queue;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use inbox_core::Envelope;

pub use memory::{MemoryBroker, MemorySource};

/// An error of the transport.
pub type SourceError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A stream of deliveries from a broker.
///
/// The runtime asks for the next delivery while it has room for it (so a source bounds what it
/// prefetches by what the runtime takes), and settles each one with its [`Acknowledge`] once the
/// handlers' transactions are committed, never before. An error from [`Source::next`] is taken
/// as transient: the run logs it and asks again after a growing delay; it never ends the run. A
/// source that loses its connection reconnects on the next call, or returns errors until it can.
pub trait Source: Send + 'static {
    /// The next delivery; `Ok(None)` when the source has ended.
    ///
    /// The run drops this future unfinished when it shuts down, so it must be cancel-safe: a
    /// delivery it has taken from the broker is either returned or left for the broker to
    /// deliver again (a source that must await something after taking one keeps it for the next
    /// call).
    fn next(&mut self) -> impl Future<Output = Result<Option<Delivery>, SourceError>> + Send;

    /// How often the runtime tells the broker that a delivery it holds unsettled is still being
    /// worked on ([`Acknowledge::in_progress`]), so that a long handler, or a delivery queued
    /// behind its aggregate, is not redelivered to another consumer meanwhile. `None` (the
    /// default) for a broker that never takes a delivery back on its own.
    fn keep_alive(&self) -> Option<Duration> {
        None
    }

    /// Called once when the run stops pulling: hands back at once what the source has fetched
    /// from the broker but not yielded yet, rather than letting the broker wait for its timeout.
    fn drain(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Settles one delivery with its broker.
///
/// Dropping an acknowledger without settling is what a crash does: the broker redelivers the
/// message, to this consumer or another, once its own timeout says the consumer is gone (a
/// JetStream consumer's `ack_wait`, a RabbitMQ channel's close, a Redis entry's idle time).
/// The runtime settles every delivery it pulled, on every path, except when it is itself killed.
pub trait Acknowledge: Send + 'static {
    /// The delivery was handled and committed: the broker may forget it.
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>>;
    /// The delivery was not handled: the broker should deliver it again, not before `delay` where
    /// it can (brokers without delayed redelivery redeliver when they redeliver).
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>>;
    /// Handling the delivery failed, and the inbox recorded the failure with the message: it
    /// retries the message from its own store once `delay` has passed, whether or not the broker
    /// delivers it again. By default a nack with the delay, for brokers where a handed-back
    /// message holds nothing meanwhile (Redis, the PostgreSQL queue). A broker that bounds what
    /// is unsettled (RabbitMQ's prefetch, JetStream's `max_ack_pending`) acknowledges it at once,
    /// so that failing messages never stop the consumer; one that cannot hand back one message
    /// (Kafka, whose consumers commit offsets) takes the delivery as settled.
    fn retry_later(
        self: Box<Self>,
        delay: Duration,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        self.nack(delay)
    }
    /// The inbox has kept the message itself (dead, or rejected with its bytes), so the broker
    /// must never deliver it again (JetStream `TERM`); an operator replays it from the inbox.
    /// By default, an ack.
    fn terminate(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        self.ack()
    }
    /// The delivery is still being worked on: the broker should not hand it to another consumer
    /// yet (JetStream `+WPI`, a Redis entry's idle time reset). By default, nothing to do.
    fn in_progress(&self) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The headers a broker adapter reads a message's type tag and id from, and its publisher writes
/// them to. By default CloudEvents' names in binary mode, `ce-type` and `ce-id`, so that other
/// CloudEvents producers and consumers understand them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// The header holding the message's type tag (`#[message(name = "...")]`).
    pub message_type: String,
    /// The header holding the message's id.
    pub message_id: String,
}

impl HeaderNames {
    /// The headers `envelope` is published with: its own, then its type tag and id under these
    /// names. An own header of one of these names (an envelope forwarded as it came, with the
    /// id it had upstream) is left out: the envelope's id and type are the ones sent.
    ///
    /// ```
    /// use inbox_core::Envelope;
    /// use inbox_runtime::HeaderNames;
    ///
    /// let forwarded = Envelope::new("order.paid", "outbox-7", b"{}").with_header("ce-id", "upstream-1");
    /// let names = HeaderNames::default();
    /// let headers: Vec<_> = names.of(&forwarded).collect();
    /// assert_eq!(headers, [("ce-type", "order.paid"), ("ce-id", "outbox-7")]);
    /// ```
    pub fn of<'a>(&'a self, envelope: &'a Envelope) -> impl Iterator<Item = (&'a str, &'a str)> {
        let tagged = [
            (self.message_type.as_str(), envelope.message_type()),
            (self.message_id.as_str(), envelope.id()),
        ];
        let own = envelope.headers().iter();
        own.map(|(name, value)| (name.as_str(), value.as_str()))
            .filter(move |(name, _)| tagged.iter().all(|(tag, _)| name != tag))
            .chain(tagged)
    }
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            message_type: "ce-type".to_owned(),
            message_id: "ce-id".to_owned(),
        }
    }
}

/// Sends envelopes to a broker, each confirmed by the broker before `publish` returns: what the
/// outbox relay publishes through, next to the [`Source`] the inbox consumes from.
pub trait Sink: Send + Sync + 'static {
    /// Publishes `envelope` to `destination` (a subject, routing key or stream, as the broker
    /// names it), with its type tag, id and headers; returns once the broker has confirmed it.
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}

/// Why a [`Sink`] did not publish a message.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The broker refused this message (no stream or queue for its destination, a wrong type of
    /// key): publishing it again as it is will not help.
    #[error("the broker refused the message: {0}")]
    Refused(String),
    /// The broker could not be reached, did not confirm, or could not take the message for now
    /// (RabbitMQ's nack of a full queue): publishing it again may work.
    #[error("the broker did not confirm the message: {0}")]
    Unavailable(SourceError),
}

impl SinkError {
    /// The broker did not confirm, for `error`.
    pub fn unavailable(error: impl Into<SourceError>) -> Self {
        SinkError::Unavailable(error.into())
    }
}

/// One message handed over by a source, with the means to settle it.
pub struct Delivery {
    envelope: Envelope,
    attempt: u32,
    acker: Box<dyn Acknowledge>,
    unreadable: Option<String>,
}

impl Delivery {
    /// A delivery of `envelope`, the `attempt`-th time (1 for the first), settled by `acker`.
    pub fn new(envelope: Envelope, attempt: u32, acker: Box<dyn Acknowledge>) -> Self {
        Self {
            envelope,
            attempt,
            acker,
            unreadable: None,
        }
    }

    /// A delivery the source could not read as a message (no type tag, say), for `reason`: the
    /// runtime keeps it as rejected, with its bytes in `envelope`, and terminates it.
    pub fn unreadable(
        envelope: Envelope,
        attempt: u32,
        acker: Box<dyn Acknowledge>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            unreadable: Some(reason.into()),
            ..Self::new(envelope, attempt, acker)
        }
    }

    /// Why the source could not read this delivery as a message, if it could not.
    pub fn unreadable_reason(&self) -> Option<&str> {
        self.unreadable.as_deref()
    }

    /// The delivered message.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// How many times the broker has delivered this message, this time included.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The delivery, counted as at least its `attempt`-th.
    pub(crate) fn counted_at_least(self, attempt: u32) -> Self {
        Self {
            attempt: self.attempt.max(attempt),
            ..self
        }
    }

    /// The envelope, the delivery count and the means to settle, apart.
    pub(crate) fn into_parts(self) -> (Envelope, u32, Box<dyn Acknowledge>) {
        (self.envelope, self.attempt, self.acker)
    }

    /// Acknowledges the delivery.
    pub async fn ack(self) -> Result<(), SourceError> {
        self.acker.ack().await
    }

    /// Hands the delivery back for redelivery, not before `delay`.
    pub async fn nack(self, delay: Duration) -> Result<(), SourceError> {
        self.acker.nack(delay).await
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("envelope", &self.envelope)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}
