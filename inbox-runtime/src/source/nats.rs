//! NATS JetStream (feature `nats`): a durable pull consumer as a [`Source`], and a publisher.
//!
//! - **Ack after commit**, confirmed: a delivery is acknowledged with a double ack (`AckSync`:
//!   the server confirms it), so an ack lost on the way is an error the run logs, not a silent
//!   redelivery later.
//! - **Nack with delay**: `NAK` with the delay; the server redelivers after it. Only deliveries
//!   that could not be handled at all (the database down) are handed back so: a failure the inbox
//!   recorded is acknowledged at once and retried from the database, so that failing messages
//!   never hold `max_ack_pending`.
//! - **A crash** (a delivery never settled): the server redelivers after the consumer's
//!   `ack_wait`.
//! - **Long handlers**: the run sends `+WPI` (in progress) for every delivery it holds, at a
//!   third of `ack_wait`, so a slow handler or a delivery queued behind its aggregate keeps it.
//! - **Dead or rejected**: `TERM`, the server stops redelivering it (the inbox has kept it).
//! - **Shutdown**: what the pull fetched and the run did not take is handed back (`NAK`), for
//!   another consumer once this pull's request has expired on the server (2 s), not after
//!   `ack_wait`.
//! - **Attempt**: the server's delivered count.
//! - **Backpressure**: the consumer's `max_ack_pending` bounds what is in flight (1,000 by
//!   default); the pull asks for at most [`JetStreamSourceBuilder::batch`] messages at a time.
//! - **Reconnect**: the client reconnects by itself; errors meanwhile go to the run, which asks
//!   again after a growing delay. Acks that fail are redelivered by the server after `ack_wait`,
//!   and the inbox takes the redelivery as a duplicate. A consumer deleted under the source (by
//!   an operator, or lost with a server that kept it in memory) is made again.
//! - **Mapping**: type tag and id from the [`HeaderNames`] headers (the id falls back to
//!   `Nats-Msg-Id`, then to `<stream>:<sequence>`), `produced_at` from the time the server
//!   stored the message, the subject as the `destination` header, other headers as they are. A
//!   message without a type tag is a delivery the run keeps as rejected, with its bytes.
//!
//! Several processes on one durable consumer share its messages; each message goes to one of
//! them at a time. To keep an aggregate on one consumer, partition subjects by aggregate
//! (`orders.<n>.>`, a subject transform) and give each process its own filter subject.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::pull::{self, Stream as Messages};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::message::{AckKind, Acker};
use async_nats::jetstream::{self, Context};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use futures::StreamExt;
use futures::future::BoxFuture;
use inbox_core::Envelope;

use super::{Acknowledge, Delivery, HeaderNames, Sink, SinkError, Source, SourceError};

/// The client this module speaks through, for building its [`Context`].
pub use async_nats;

/// How long a drain waits for the pull's next fetched message before it takes the pull for empty.
const DRAIN_WAIT: Duration = Duration::from_millis(200);

/// How long one pull request stays open on the server: once the source is gone, the server may
/// send it messages that long.
const PULL_EXPIRES: Duration = Duration::from_secs(2);

/// The header JetStream dedups published messages by, within the stream's duplicate window.
const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// A durable JetStream pull consumer, consumed by an [`Inbox`](crate::Inbox).
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::nats::{JetStreamSource, async_nats};
///
/// let client = async_nats::connect("127.0.0.1:4222").await?;
/// let context = async_nats::jetstream::new(client);
/// let source = JetStreamSource::builder(&context, "ORDERS", "billing")
///     .ack_wait(std::time::Duration::from_secs(30))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct JetStreamSource {
    consumer: PullConsumer,
    /// The stream and the configuration the consumer was made with, to make it again.
    stream: jetstream::stream::Stream,
    config: pull::Config,
    /// Whether the consumer may be gone: looked up (and created again if it is) before the
    /// next pull.
    look_up: bool,
    messages: Option<Messages>,
    batch: usize,
    headers: HeaderNames,
    keep_alive: Duration,
}

/// Builds a [`JetStreamSource`]: the durable consumer is created on the stream if it is not there,
/// with the settings below, and used as it is if it is.
pub struct JetStreamSourceBuilder {
    context: Context,
    stream: String,
    config: pull::Config,
    batch: usize,
    headers: HeaderNames,
}

impl JetStreamSource {
    /// A source on the durable consumer `consumer` of `stream`.
    pub fn builder(context: &Context, stream: &str, consumer: &str) -> JetStreamSourceBuilder {
        let config = pull::Config {
            durable_name: Some(consumer.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1_000,
            ..Default::default()
        };
        JetStreamSourceBuilder {
            context: context.clone(),
            stream: stream.to_owned(),
            config,
            batch: 100,
            headers: HeaderNames::default(),
        }
    }

    /// Starts the pull that yields messages, unless it runs; first makes the consumer again if
    /// it is gone.
    async fn pull(&mut self) -> Result<(), SourceError> {
        if self.look_up {
            let name = self.config.durable_name.clone().unwrap_or_default();
            let config = self.config.clone();
            self.consumer = self.stream.get_or_create_consumer(&name, config).await?;
            self.look_up = false;
        }
        if self.messages.is_none() {
            let pull = self
                .consumer
                .stream()
                .max_messages_per_batch(self.batch)
                .expires(PULL_EXPIRES)
                .heartbeat(PULL_EXPIRES / 4);
            self.messages = Some(pull.messages().await?);
        }
        Ok(())
    }
}

impl JetStreamSourceBuilder {
    /// How long the server waits for a delivery's ack before it redelivers it (30 s by default).
    /// The run reports held deliveries in progress at a third of it.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.config.ack_wait = ack_wait;
        self
    }

    /// How many deliveries may be unacknowledged at once (1,000 by default).
    pub fn max_ack_pending(mut self, max_ack_pending: i64) -> Self {
        self.config.max_ack_pending = max_ack_pending;
        self
    }

    /// Consumes only the stream's subjects that match `filter`.
    pub fn filter_subject(mut self, filter: impl Into<String>) -> Self {
        self.config.filter_subject = filter.into();
        self
    }

    /// The consumer's whole configuration, for what the other methods do not set.
    pub fn config(mut self, config: pull::Config) -> Self {
        self.config = config;
        self
    }

    /// How many messages one pull asks for (100 by default).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// The headers the type tag and id are read from.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    /// Finds or creates the consumer. Refuses [`headers`](Self::headers) NATS cannot carry (a
    /// name with a space, a `:` or a control character), which no delivery could be read by.
    pub async fn build(self) -> Result<JetStreamSource, SourceError> {
        for name in [&self.headers.message_type, &self.headers.message_id] {
            if HeaderName::from_str(name).is_err() {
                return Err(format!("NATS cannot carry a header named `{name:?}`").into());
            }
        }
        let stream = self.context.get_stream(&self.stream).await?;
        let name = self.config.durable_name.clone().unwrap_or_default();
        let config = self.config.clone();
        let consumer: PullConsumer = stream.get_or_create_consumer(&name, config).await?;
        let ack_wait = consumer.cached_info().config.ack_wait;
        Ok(JetStreamSource {
            consumer,
            stream,
            config: self.config,
            look_up: false,
            messages: None,
            batch: self.batch,
            headers: self.headers,
            keep_alive: (ack_wait / 3).max(Duration::from_millis(100)),
        })
    }
}

impl Source for JetStreamSource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        self.pull().await?;
        let Some(messages) = self.messages.as_mut() else {
            return Err("the JetStream pull did not start".into());
        };
        match messages.next().await {
            Some(Ok(message)) => Ok(Some(delivery(message, &self.headers)?)),
            Some(Err(error)) => {
                if consumer_may_be_gone(error.kind()) {
                    // A pull on a consumer that is gone would ask a name nobody answers for
                    // ever: the next pull starts after the consumer is looked up.
                    self.messages = None;
                    self.look_up = true;
                }
                Err(error.into())
            }
            None => {
                self.messages = None;
                Err("the JetStream pull ended; starting another".into())
            }
        }
    }

    fn keep_alive(&self) -> Option<Duration> {
        Some(self.keep_alive)
    }

    /// Hands back what the pull has fetched: every message it yields within 200 ms of the last,
    /// until the requests it had sent have expired on the server. Each is redelivered once the
    /// pull's request has expired (so it goes to a live consumer, not back to this pull, which
    /// ends here). The pull goes on asking for more while it is read: the bound keeps a drain
    /// on a backlog from fetching messages only to hand them back.
    async fn drain(&mut self) {
        let Some(mut messages) = self.messages.take() else {
            return;
        };
        let expired = tokio::time::Instant::now() + PULL_EXPIRES;
        loop {
            let left = expired.saturating_duration_since(tokio::time::Instant::now());
            let wait = DRAIN_WAIT.min(left);
            let message = match tokio::time::timeout(wait, messages.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(_))) => continue,
                Ok(None) | Err(_) => return,
            };
            let handed_back = message.ack_with(AckKind::Nak(Some(PULL_EXPIRES * 2)));
            if let Err(error) = handed_back.await {
                tracing::warn!(%error, "could not hand a prefetched message back");
            }
        }
    }
}

/// Whether a pull's error may mean that its consumer is gone: deleted (by an operator, or lost
/// with a server that kept it in memory), or nobody answering for it.
fn consumer_may_be_gone(kind: pull::MessagesErrorKind) -> bool {
    use pull::MessagesErrorKind::{ConsumerDeleted, MissingHeartbeat, NoResponders, Pull};
    matches!(
        kind,
        ConsumerDeleted | NoResponders | MissingHeartbeat | Pull
    )
}

/// A JetStream message as a delivery.
fn delivery(message: jetstream::Message, names: &HeaderNames) -> Result<Delivery, SourceError> {
    let info = message.info()?;
    let attempt = u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1);
    let produced_at = SystemTime::from(info.published);
    let fallback_id = format!("{}:{}", info.stream, info.stream_sequence);
    let (message, acker) = message.split();
    let acker = Box::new(JetStreamAcker(std::sync::Arc::new(acker)));
    let headers = message.headers.unwrap_or_default();
    let header = |name: &str| headers.get(name).map(|value| value.as_str().to_owned());
    let id = header(&names.message_id)
        .or_else(|| header(NATS_MSG_ID))
        .unwrap_or(fallback_id);
    let message_type = header(&names.message_type);
    let mut envelope = Envelope::new(
        message_type.clone().unwrap_or_default(),
        id,
        message.payload.to_vec(),
    )
    .with_produced_at(produced_at)
    .with_header("destination", message.subject.as_str());
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        if let Some(value) = values.first() {
            envelope = envelope.with_header(name, value.as_str());
        }
    }
    Ok(match message_type {
        Some(_) => Delivery::new(envelope, attempt, acker),
        None => {
            let reason = format!("it has no `{}` header", names.message_type);
            Delivery::unreadable(envelope, attempt, acker, reason)
        }
    })
}

/// Settles a JetStream delivery.
struct JetStreamAcker(std::sync::Arc<Acker>);

impl Acknowledge for JetStreamAcker {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move { self.0.double_ack().await })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        let delay = (!delay.is_zero()).then_some(delay);
        Box::pin(async move { self.0.ack_with(AckKind::Nak(delay)).await })
    }

    /// Acknowledged at once: the inbox retries the failure it recorded from its own store when
    /// `delay` has passed. A `NAK` with the delay would keep the message pending meanwhile, and
    /// as many failing messages as `max_ack_pending` would stop the consumer.
    fn retry_later(
        self: Box<Self>,
        _delay: Duration,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        self.ack()
    }

    fn terminate(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move { self.0.double_ack_with(AckKind::Term).await })
    }

    fn in_progress(&self) -> BoxFuture<'static, Result<(), SourceError>> {
        let acker = std::sync::Arc::clone(&self.0);
        Box::pin(async move { acker.ack_with(AckKind::Progress).await })
    }
}

/// Publishes envelopes to JetStream subjects, each confirmed by the stream's publish ack. The
/// envelope's id goes in `Nats-Msg-Id` too, so that the stream drops a message published twice
/// within its duplicate window (a relay that crashed before it saw the ack).
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: Context,
    headers: HeaderNames,
}

impl JetStreamPublisher {
    /// A publisher on `context`, writing the type tag and id to the default [`HeaderNames`].
    pub fn new(context: &Context) -> Self {
        Self {
            context: context.clone(),
            headers: HeaderNames::default(),
        }
    }

    /// Writes the type tag and id to these headers instead.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    /// "No stream" answers a publication when no stream takes its subject, and also while the
    /// stream that takes it has no leader (an election, its server restarting): a refusal only
    /// when the server says that no stream takes the subject.
    async fn no_stream(&self, subject: &str, error: PublishError) -> SinkError {
        match self
            .context
            .stream_by_subject(subject)
            .await
            .map_err(|e| e.kind())
        {
            // No stream takes it, or no stream could (an empty token: `orders..paid`).
            Err(GetStreamByNameErrorKind::NotFound | GetStreamByNameErrorKind::InvalidSubject) => {
                SinkError::Refused(error.to_string())
            }
            _ => SinkError::unavailable(error),
        }
    }

    /// The envelope's headers as NATS carries them, or a refusal naming the first one it cannot
    /// carry (a name with a control character, a space or a `:`; a line break in a value).
    fn header_map(&self, envelope: &Envelope) -> Result<HeaderMap, SinkError> {
        let mut headers = HeaderMap::new();
        let id = std::iter::once((NATS_MSG_ID, envelope.id()));
        for (name, value) in self.headers.of(envelope).chain(id) {
            let refused = |what: &str| {
                SinkError::Refused(format!("NATS cannot carry the {what} of header `{name:?}`"))
            };
            let header = HeaderName::from_str(name).map_err(|_| refused("name"))?;
            let value = HeaderValue::from_str(value).map_err(|_| refused("value"))?;
            headers.insert(header, value);
        }
        Ok(headers)
    }
}

impl Sink for JetStreamPublisher {
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let payload = envelope.payload().to_vec().into();
            let subject = destination.to_owned();
            let sent = self
                .context
                .publish_with_headers(subject, self.header_map(envelope)?, payload)
                .await;
            let acked = match sent {
                Ok(ack) => ack.await,
                Err(error) => Err(error),
            };
            match acked {
                Ok(_) => Ok(()),
                Err(error) if error.kind() == PublishErrorKind::StreamNotFound => {
                    Err(self.no_stream(destination, error).await)
                }
                Err(error) => Err(publish_error(error)),
            }
        })
    }
}

/// An expectation the stream refused, a message over the server's `max_payload`, a subject no
/// server takes (a space in it, an empty token) or an error the stream answered with about the
/// message (over the stream's size limit, say) is a refusal; anything else (no connection, no ack
/// in time, a stream without a leader or out of resources for now) may pass on a later try.
/// "No stream" is looked into apart ([`JetStreamPublisher::no_stream`]).
fn publish_error(error: PublishError) -> SinkError {
    let refused = match error.kind() {
        PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence
        | PublishErrorKind::MaxPayloadExceeded => true,
        PublishErrorKind::Other => std::error::Error::source(&error).is_some_and(|source| {
            source.is::<async_nats::subject::SubjectError>()
                || source
                    .downcast_ref::<async_nats::jetstream::Error>()
                    .is_some_and(|answer| !for_now(answer))
        }),
        _ => false,
    };
    match refused {
        true => SinkError::Refused(error.to_string()),
        false => SinkError::unavailable(error),
    }
}

/// Whether an error the stream answered with says "not now" rather than "not this message":
/// no leader or no cluster yet, JetStream still starting, resources (storage, memory, the
/// account's) exhausted for now, or a store that failed.
fn for_now(answer: &async_nats::jetstream::Error) -> bool {
    use async_nats::jetstream::ErrorCode;
    const FOR_NOW: [ErrorCode; 9] = [
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::JETSTREAM_NOT_ENABLED,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode::STORAGE_RESOURCES_EXCEEDED,
        ErrorCode::MEMORY_RESOURCES_EXCEEDED,
        ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        ErrorCode::STREAM_STORE_FAILED,
    ];
    answer.code() >= 500 || FOR_NOW.contains(&answer.error_code())
}
