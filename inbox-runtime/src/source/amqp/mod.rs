//! RabbitMQ (feature `amqp`): a queue consumed with manual acks as a [`Source`], and a publisher
//! with publisher confirms.
//!
//! - **Ack after commit**: `basic.ack` once the handlers committed.
//! - **Nack with delay**: the delivery is held for the delay, then `basic.nack` with requeue.
//!   Holding it needs no topology of the user's (a retry queue with a TTL and a dead-letter
//!   exchange would); it keeps its prefetch slot meanwhile, and a crash during the delay requeues
//!   it at once, which is only early. Only deliveries that could not be handled at all are
//!   handed back so (at shutdown; the run itself tries again a message the database could not
//!   take): a failure the inbox recorded is acknowledged at once and retried from the database,
//!   so that failing messages never hold the prefetch.
//! - **A crash** (a delivery never settled): the channel closes with the process (or when the
//!   source is dropped), and RabbitMQ requeues what it had not acknowledged.
//! - **Long handlers** need nothing: RabbitMQ takes nothing back from a live channel (mind the
//!   broker's `consumer_timeout`, 30 minutes by default).
//! - **Dead or rejected**: acknowledged, since the inbox has kept it (a `reject` would route it to
//!   the queue's dead-letter exchange, a second copy).
//! - **Attempt**: `x-delivery-count` + 1 on quorum queues; elsewhere 2 for a redelivered message,
//!   or more where the run handed it back more often itself (it counts its own hand-backs), so
//!   that the delays of a delivery the database cannot take grow on classic queues too.
//! - **Backpressure**: `basic.qos` prefetch ([`AmqpSourceBuilder::prefetch`], 64 by default).
//! - **Reconnect**: the source and the publisher share an [`AmqpConnection`], which dials the
//!   server again when the connection is lost (lapin's own recovery stays off: its I/O loop can
//!   wait for ever after a reset socket). While the server is away, each call to the source
//!   fails at once and the run asks again after a growing delay; once it is back, the source
//!   consumes again on a new channel. What was unacknowledged when the connection dropped is
//!   requeued by the broker. A consumer the server cancelled (its queue deleted) or whose channel
//!   it closed while the connection stayed up is started again on a new channel, each time the
//!   run asks, until the queue takes it.
//! - **Mapping**: type tag and id from the [`HeaderNames`] headers, else the `type` and
//!   `message_id` properties; `produced_at` from the `timestamp` property (none for a timestamp
//!   past what the clock can hold); the `correlation_id` property as the `correlation-id` header
//!   (a header of that name wins); the routing key as the `destination` header, the exchange as
//!   `exchange`, and the other headers as they are. A message without a type tag is a delivery
//!   the run keeps as rejected, with its bytes.
//!
//! Several processes consuming one queue share its messages. To keep an aggregate on one
//! consumer, declare the queue with `x-single-active-consumer` (one consumer at a time, the others
//! on standby), or route by aggregate through a consistent-hash exchange to one queue per consumer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use inbox_core::Envelope;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, ChannelStatus, Confirmation, Connection, Consumer};
use tokio::sync::Mutex;

use super::{Acknowledge, Delivery, HeaderNames, Sink, SinkError, Source, SourceError};

mod connection;

pub use connection::AmqpConnection;

/// The client this module speaks through, for its options, properties and field tables.
pub use lapin;

/// A RabbitMQ queue, consumed with manual acks on a channel of its own. It shares an
/// [`AmqpConnection`] (as [`AmqpPublisher`] does), to consume again on a new channel when the
/// server closed its own or the connection was lost.
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::amqp::{AmqpConnection, AmqpSource};
///
/// let connection = AmqpConnection::connect("amqp://127.0.0.1:5672/%2f").await?;
/// let source = AmqpSource::builder(&connection, "billing").prefetch(64).build().await?;
/// # Ok(()) }
/// ```
pub struct AmqpSource {
    connection: Arc<AmqpConnection>,
    consume: Consume,
    channel: Channel,
    consumer: Consumer,
    /// Whether the server cancelled the consumer: its stream ends, and waits for ever after.
    cancelled: bool,
    headers: HeaderNames,
}

/// What the source consumes, and how: enough to start consuming again.
struct Consume {
    queue: String,
    consumer_tag: String,
    prefetch: u16,
    options: BasicConsumeOptions,
    arguments: FieldTable,
}

/// Builds an [`AmqpSource`] on a queue that exists (its topology is the application's).
pub struct AmqpSourceBuilder {
    connection: Arc<AmqpConnection>,
    consume: Consume,
    headers: HeaderNames,
}

impl AmqpSource {
    /// A source on `queue`, over `connection`.
    pub fn builder(connection: &Arc<AmqpConnection>, queue: &str) -> AmqpSourceBuilder {
        let consume = Consume {
            queue: queue.to_owned(),
            consumer_tag: String::new(),
            prefetch: 64,
            options: BasicConsumeOptions::default(),
            arguments: FieldTable::default(),
        };
        AmqpSourceBuilder {
            connection: Arc::clone(connection),
            consume,
            headers: HeaderNames::default(),
        }
    }

    /// Starts consuming on a new channel, when the server cancelled the consumer or its channel
    /// is closed for good (the server closed it, or the connection was lost, in which case the
    /// connection is dialled again first). The old channel is closed, if it is still open. While
    /// the server cannot be reached, says so: a stopped consumer yields nothing ever again, so
    /// waiting on it would silence the source for good.
    async fn consume_again(&mut self) -> Result<(), SourceError> {
        let stopped = self.cancelled || closed_for_good(self.channel.status());
        if !stopped {
            return Ok(());
        }
        let connection = self.connection.current().await?;
        tracing::info!(queue = %self.consume.queue, "the consumer stopped; consuming again on a new channel");
        if self.channel.status().connected() {
            let _ = self.channel.close(200, "consuming again".into()).await;
        }
        let (channel, consumer) = self.consume.start(&connection).await?;
        (self.channel, self.consumer, self.cancelled) = (channel, consumer, false);
        Ok(())
    }
}

impl Consume {
    /// Opens a channel on `connection` and consumes on it.
    async fn start(&self, connection: &Connection) -> Result<(Channel, Consumer), SourceError> {
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                self.consumer_tag.as_str().into(),
                self.options,
                self.arguments.clone(),
            )
            .await?;
        Ok((channel, consumer))
    }
}

impl AmqpSourceBuilder {
    /// How many deliveries the broker sends ahead of their acks (`basic.qos`, 64 by default).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.consume.prefetch = prefetch.max(1);
        self
    }

    /// The consumer tag (by default the broker names the consumer).
    pub fn consumer_tag(mut self, tag: impl Into<String>) -> Self {
        self.consume.consumer_tag = tag.into();
        self
    }

    /// `basic.consume`'s options and arguments (`no_ack` is never set: the source acks itself).
    pub fn consume(mut self, options: BasicConsumeOptions, arguments: FieldTable) -> Self {
        self.consume.options = BasicConsumeOptions {
            no_ack: false,
            ..options
        };
        self.consume.arguments = arguments;
        self
    }

    /// The headers the type tag and id are read from.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    /// Opens the source's channel and starts consuming.
    pub async fn build(self) -> Result<AmqpSource, SourceError> {
        let connection = self.connection.current().await?;
        let (channel, consumer) = self.consume.start(&connection).await?;
        Ok(AmqpSource {
            connection: self.connection,
            consume: self.consume,
            channel,
            consumer,
            cancelled: false,
            headers: self.headers,
        })
    }
}

impl Source for AmqpSource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        self.consume_again().await?;
        match self.consumer.next().await {
            Some(Ok(delivery)) => Ok(Some(from_amqp(delivery, &self.headers))),
            Some(Err(error)) => Err(error.into()),
            None => {
                self.cancelled = true;
                Err("the server cancelled the RabbitMQ consumer".into())
            }
        }
    }

    /// Cancels the consumer, then hands back what it prefetched: the server sends nothing more,
    /// so a message handed back is not sent straight back to be handed back again (each time one
    /// more delivery, which a quorum queue counts against its delivery limit).
    async fn drain(&mut self) {
        let tag = self.consumer.tag();
        let cancel = self
            .channel
            .basic_cancel(tag, BasicCancelOptions::default());
        if let Err(error) = cancel.await {
            tracing::warn!(%error, "could not cancel the consumer before handing back what it prefetched");
        }
        while let Some(Some(Ok(delivery))) = self.consumer.next().now_or_never() {
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            if let Err(error) = delivery.acker.nack(requeue).await {
                tracing::warn!(%error, "could not hand a prefetched message back");
            }
        }
    }
}

/// A header's value as text, if it is text.
fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

/// A header's value as a count, if it is a whole number of at least zero.
fn count(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::ShortShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// The id of a message that carries none: its routing key and a hash of its body, the same at
/// each delivery (a delivery tag is not), so the run counts its hand-backs and their delays grow.
fn fallback_id(delivery: &lapin::message::Delivery) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};

    let mut body = DefaultHasher::new();
    delivery.data.hash(&mut body);
    format!("{}:{:016x}", delivery.routing_key, body.finish())
}

/// A RabbitMQ delivery as a delivery of the inbox.
fn from_amqp(delivery: lapin::message::Delivery, names: &HeaderNames) -> Delivery {
    let properties = &delivery.properties;
    let table = properties.headers().clone().unwrap_or_default();
    let headers = table.inner();
    let header = |name: &str| headers.get(name).and_then(text);
    let property = |value: &Option<ShortString>| value.as_ref().map(|v| v.as_str().to_owned());
    let message_type = header(&names.message_type).or_else(|| property(properties.kind()));
    let id = header(&names.message_id)
        .or_else(|| property(properties.message_id()))
        .unwrap_or_else(|| fallback_id(&delivery));
    let attempt = match headers.get("x-delivery-count").and_then(count) {
        Some(earlier) => u32::try_from(earlier).unwrap_or(u32::MAX).saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    };
    let mut envelope = Envelope::new(
        message_type.clone().unwrap_or_default(),
        id,
        delivery.data.clone(),
    )
    .with_header("destination", delivery.routing_key.as_str())
    .with_header("exchange", delivery.exchange.as_str());
    if let Some(correlation) = property(properties.correlation_id()) {
        envelope = envelope.with_header("correlation-id", correlation);
    }
    // A timestamp past what the clock can hold says nothing of when the message was published.
    let produced_at = properties
        .timestamp()
        .and_then(|seconds| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds)));
    if let Some(produced_at) = produced_at {
        envelope = envelope.with_produced_at(produced_at);
    }
    for (name, value) in headers {
        if let Some(value) = text(value) {
            envelope = envelope.with_header(name.as_str(), value);
        }
    }
    let acker = Box::new(AmqpAcker(delivery.acker));
    match message_type {
        Some(_) => Delivery::new(envelope, attempt, acker),
        None => {
            let reason = format!(
                "it has no `{}` header and no `type` property",
                names.message_type
            );
            Delivery::unreadable(envelope, attempt, acker, reason)
        }
    }
}

/// Settles a RabbitMQ delivery.
struct AmqpAcker(Acker);

impl Acknowledge for AmqpAcker {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move {
            self.0.ack(BasicAckOptions::default()).await?;
            Ok(())
        })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let handed_back = async move {
            tokio::time::sleep(delay).await;
            if let Err(error) = self.0.nack(requeue).await {
                tracing::warn!(%error, "could not hand a delivery back; the broker requeues it when the channel closes");
            }
        };
        tokio::spawn(handed_back);
        Box::pin(async { Ok(()) })
    }

    /// Acknowledged at once: the inbox retries the failure it recorded from its own store when
    /// `delay` has passed. Held for the delay, the delivery would take a prefetch slot meanwhile,
    /// and as many failing messages as the prefetch would stop the consumer.
    fn retry_later(
        self: Box<Self>,
        _delay: Duration,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        self.ack()
    }
}

/// Publishes envelopes to an exchange, each confirmed by the broker (publisher confirms), as
/// persistent messages carrying the type tag and id in headers and in the `type` and `message_id`
/// properties.
///
/// The publisher shares an [`AmqpConnection`] so that it can open its channel again when the
/// server closes it, or when the connection was lost (dialling the server again first): RabbitMQ
/// closes a channel over a publication it refuses (to an exchange that is not there, past
/// `max_message_size`). The publication that met the closed channel fails as unavailable (the
/// relay tries it again later); the next one goes out on a new channel.
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::amqp::{AmqpConnection, AmqpPublisher, AmqpSource};
///
/// let connection = AmqpConnection::connect("amqp://127.0.0.1:5672/%2f").await?;
/// let publisher = AmqpPublisher::new(connection.clone(), "").await?;
/// let source = AmqpSource::builder(&connection, "billing").build().await?;
/// # Ok(()) }
/// ```
pub struct AmqpPublisher {
    connection: Arc<AmqpConnection>,
    channel: Mutex<Channel>,
    exchange: String,
    headers: HeaderNames,
}

impl AmqpPublisher {
    /// A publisher to `exchange` (`""`: the default exchange, where the routing key names the
    /// queue), on a channel of its own in confirm mode.
    pub async fn new(connection: Arc<AmqpConnection>, exchange: &str) -> Result<Self, SourceError> {
        let channel = confirming_channel(&*connection.current().await?).await?;
        Ok(Self {
            connection,
            channel: Mutex::new(channel),
            exchange: exchange.to_owned(),
            headers: HeaderNames::default(),
        })
    }

    /// The channel to publish on: the one the publisher has, or a new one in its place when it is
    /// closed for good (by the server, or with a lost connection, dialled again first).
    async fn channel(&self) -> Result<Channel, SinkError> {
        let mut channel = self.channel.lock().await;
        if closed_for_good(channel.status()) {
            tracing::info!("the publisher's channel is closed; opening another");
            let connection = self.connection.current().await;
            let connection = connection.map_err(SinkError::unavailable)?;
            *channel = confirming_channel(&connection)
                .await
                .map_err(SinkError::unavailable)?;
        }
        Ok(channel.clone())
    }

    /// Writes the type tag and id to these headers instead.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    fn properties(&self, envelope: &Envelope) -> Result<BasicProperties, SinkError> {
        let mut table = FieldTable::default();
        for (name, value) in self.headers.of(envelope) {
            table.insert(
                short("a header name", name)?,
                AMQPValue::LongString(value.into()),
            );
        }
        let produced_at = envelope.produced_at().unwrap_or_else(SystemTime::now);
        let seconds = produced_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Ok(BasicProperties::default()
            .with_headers(table)
            .with_type(short("the type tag", envelope.message_type())?)
            .with_message_id(short("the message id", envelope.id())?)
            .with_timestamp(seconds)
            .with_delivery_mode(2))
    }
}

/// A new channel on `connection`, in confirm mode.
async fn confirming_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// Whether a channel is closed and will not come back by itself: neither open, nor opening, nor
/// closing.
fn closed_for_good(status: &ChannelStatus) -> bool {
    !(status.connected() || status.initializing() || status.closing())
}

/// `value` as an AMQP short string, or, past the 255 bytes one holds, a refusal saying `what`
/// it is: no broker takes it.
fn short(what: &str, value: &str) -> Result<ShortString, SinkError> {
    ShortString::try_new(value).map_err(|_| {
        SinkError::Refused(format!(
            "{what} is {} bytes, past the 255 an AMQP short string holds",
            value.len()
        ))
    })
}

impl Sink for AmqpPublisher {
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            // Mandatory: a message no queue takes comes back instead of vanishing.
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let routing_key = short("the routing key", destination)?;
            let properties = self.properties(envelope)?;
            let confirm = self
                .channel()
                .await?
                .basic_publish(
                    short("the exchange", &self.exchange)?,
                    routing_key,
                    options,
                    envelope.payload(),
                    properties,
                )
                .await
                .map_err(SinkError::unavailable)?;
            match confirm.await.map_err(SinkError::unavailable)? {
                // RabbitMQ nacks what a queue could not take for now (full, with
                // `x-overflow: reject-publish`, or an internal error): tried again later.
                Confirmation::Nack(_) => Err(SinkError::unavailable(format!(
                    "the broker did not take message `{}` for now (a full queue, or an error \
                     of its own)",
                    envelope.id()
                ))),
                Confirmation::Ack(Some(_)) => Err(SinkError::Refused(format!(
                    "no queue takes routing key `{destination}` on exchange `{}`",
                    self.exchange
                ))),
                Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            }
        })
    }
}
