//! Redis Streams (feature `redis`): a consumer of a consumer group as a [`Source`], and a
//! publisher (`XADD`).
//!
//! - **Ack after commit**: `XACK` once the handlers committed.
//! - **Nack with delay**: the entry stays pending, its idle time set (`XCLAIM ... IDLE`) so that
//!   it becomes reclaimable once the delay has passed.
//! - **A crash** (an entry never settled): it stays pending for the consumer that crashed, and
//!   any consumer of the group claims it (`XAUTOCLAIM`) once it has been idle for the
//!   [visibility timeout](RedisStreamSourceBuilder::visibility_timeout) (30 s by default).
//! - **Long handlers**: the run resets the idle time of every entry it holds (`XCLAIM` to itself)
//!   at a third of the visibility timeout, so no other consumer claims it meanwhile.
//! - **Shutdown**: what the source read and the run did not take is handed back at once,
//!   including what the server gave a read still blocking when the run stopped (the run waits
//!   for that read's answer).
//! - **Dead or rejected**: acknowledged, since the inbox has kept it.
//! - **Attempt**: 1 for a new entry; for a claimed one, its delivery count (`XPENDING`).
//! - **Backpressure**: each read asks for at most [`RedisStreamSourceBuilder::count`] entries.
//! - **Reconnect**: the connections are [`ConnectionManager`]s, which reconnect by themselves;
//!   errors meanwhile go to the run, which asks again after a growing delay. What was pending
//!   when the connection dropped stays pending and is claimed again after the visibility timeout.
//!   A group that is gone (its stream deleted, or a server restarted without what it kept) is
//!   created again, reading from the stream's start, so entries added since are not missed.
//! - **Mapping**: an entry's field `payload` holds the bytes; the type tag and id are the fields
//!   the [`HeaderNames`] name (the id falls back to the entry id); `produced_at` is the time in the
//!   entry id; the stream key is the `destination` header; other text fields are headers (a
//!   field whose name or value is not UTF-8 is none). An entry without a UTF-8 type tag is a
//!   delivery the run keeps as rejected, with its bytes.
//!
//! The consumers of one group share its entries. Redis has no way to keep an aggregate on one
//! consumer of a group: shard by aggregate into several streams instead, one consumer each.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;
use inbox_core::Envelope;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::{
    StreamAutoClaimOptions, StreamClaimOptions, StreamPendingCountReply, StreamReadOptions,
};
use redis::{AsyncCommands, Client, Value};

use super::in_flight::InFlight;
use super::{Acknowledge, Delivery, HeaderNames, Sink, SinkError, Source, SourceError};

/// The client this module speaks through, for its [`Client`].
pub use redis;

/// The entry field that holds a message's bytes.
pub const PAYLOAD_FIELD: &str = "payload";

/// One consumer of a consumer group on a Redis stream.
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::redis::{RedisStreamSource, redis};
///
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let source = RedisStreamSource::builder(&client, "orders", "billing", "billing-1")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct RedisStreamSource {
    reads: ConnectionManager,
    acks: ConnectionManager,
    entries: Entries,
    headers: HeaderNames,
    ready: VecDeque<Delivery>,
    last_claim: Option<Instant>,
    /// Where the next `XAUTOCLAIM` goes on through the pending entries (`0-0`: from the start).
    claim_from: String,
    /// The blocking read in flight: one a stopping run left is handed back by
    /// [`Source::drain`] (the server gives it what arrives until it times out).
    reading: InFlight<Vec<RawEntry>>,
}

/// Where the source's entries are: the stream, the group and this consumer, and how long an
/// entry stays with a consumer that does not settle it.
#[derive(Clone)]
struct Entries {
    stream: String,
    group: String,
    consumer: String,
    visibility: Duration,
    count: usize,
}

/// Builds a [`RedisStreamSource`]: the group is created on the stream (and the stream with it)
/// if it is not there, reading from the stream's start.
pub struct RedisStreamSourceBuilder {
    client: Client,
    entries: Entries,
    headers: HeaderNames,
}

impl RedisStreamSource {
    /// The consumer `consumer` of `group` on `stream`. Give each process its own consumer name.
    pub fn builder(
        client: &Client,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> RedisStreamSourceBuilder {
        RedisStreamSourceBuilder {
            client: client.clone(),
            entries: Entries {
                stream: stream.to_owned(),
                group: group.to_owned(),
                consumer: consumer.to_owned(),
                visibility: Duration::from_secs(30),
                count: 100,
            },
            headers: HeaderNames::default(),
        }
    }

    /// Claims the entries idle past the visibility timeout: a pass through the pending entries
    /// at most every quarter of it. Redis looks at no more than ten times `count` pending
    /// entries a call, so a pass goes on from where the call before ended until it is through.
    async fn claim_abandoned(&mut self) -> Result<(), SourceError> {
        let entries = &self.entries;
        let passing = self.claim_from != START;
        if !passing {
            if self
                .last_claim
                .is_some_and(|at| at.elapsed() < entries.visibility / 4)
            {
                return Ok(());
            }
            self.last_claim = Some(Instant::now());
        }
        let options = StreamAutoClaimOptions::default().count(entries.count);
        let idle = millis(entries.visibility);
        let reply: Value = self
            .reads
            .xautoclaim_options(
                &entries.stream,
                &entries.group,
                &entries.consumer,
                idle,
                &self.claim_from,
                options,
            )
            .await?;
        let (next, claimed) = claimed_entries(reply)?;
        self.claim_from = next;
        for entry in claimed {
            let attempt = self.delivery_count(&entry.id).await?;
            let delivery = self.delivery(entry, attempt);
            self.ready.push_back(delivery);
        }
        Ok(())
    }

    /// Takes back the entries abandoned by other consumers, or else reads new ones.
    async fn fetch(&mut self) -> Result<(), SourceError> {
        self.claim_abandoned().await?;
        if self.ready.is_empty() {
            self.read_new().await?;
        }
        Ok(())
    }

    /// How many times the group has delivered entry `id`.
    async fn delivery_count(&mut self, id: &str) -> Result<u32, SourceError> {
        let entries = &self.entries;
        let pending: StreamPendingCountReply = self
            .reads
            .xpending_count(&entries.stream, &entries.group, id, id, 1)
            .await?;
        let count = pending.ids.first().map_or(1, |p| p.times_delivered);
        Ok(u32::try_from(count).unwrap_or(u32::MAX).max(1))
    }

    /// Reads new entries, waiting up to a quarter of the visibility timeout (at most a second),
    /// or takes what the read in flight read.
    async fn read_new(&mut self) -> Result<(), SourceError> {
        let read = self.reading.answer(|| {
            let (mut reads, entries) = (self.reads.clone(), self.entries.clone());
            async move {
                let options = StreamReadOptions::default()
                    .group(&entries.group, &entries.consumer)
                    .count(entries.count)
                    .block(millis(read_wait(&entries)).max(1));
                let reply: Value = reads
                    .xread_options(&[&entries.stream], &[">"], &options)
                    .await?;
                read_entries(reply)
            }
        });
        let read = read.await?;
        self.hold(read);
        Ok(())
    }

    /// New entries as deliveries, ready to be yielded (or handed back).
    fn hold(&mut self, read: impl IntoIterator<Item = RawEntry>) {
        for entry in read {
            let delivery = self.delivery(entry, 1);
            self.ready.push_back(delivery);
        }
    }

    /// A stream entry as a delivery. A field whose name or value is not UTF-8 is no header; a
    /// type tag that is not makes a delivery the run keeps as rejected.
    fn delivery(&self, entry: RawEntry, attempt: u32) -> Delivery {
        let message_type = entry.text(&self.headers.message_type);
        let id = entry
            .text(&self.headers.message_id)
            .unwrap_or_else(|| entry.id.clone());
        let payload = entry.field(PAYLOAD_FIELD).unwrap_or_default().to_vec();
        let mut envelope = Envelope::new(message_type.clone().unwrap_or_default(), id, payload)
            .with_header("destination", self.entries.stream.as_str());
        if let Some(produced_at) = entry_time(&entry.id) {
            envelope = envelope.with_produced_at(produced_at);
        }
        for (name, value) in &entry.fields {
            if let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value))
                && name != PAYLOAD_FIELD
            {
                envelope = envelope.with_header(name, value);
            }
        }
        let acker = Box::new(RedisAcker {
            acks: self.acks.clone(),
            entries: self.entries.clone(),
            id: entry.id.clone(),
        });
        match message_type {
            Some(_) => Delivery::new(envelope, attempt, acker),
            None => {
                let name = &self.headers.message_type;
                let reason = match entry.field(name) {
                    Some(_) => format!("its `{name}` field is not UTF-8"),
                    None => format!("it has no `{name}` field"),
                };
                Delivery::unreadable(envelope, attempt, acker, reason)
            }
        }
    }
}

/// A stream entry as the server sent it: its id, and its fields with names and values as bytes.
/// (The client's own reply types take every field name as text, so one entry with a name that
/// is not UTF-8 would make a whole read unreadable, and with it every entry the read took.)
struct RawEntry {
    id: String,
    fields: Vec<Field>,
}

/// A field of an entry: its name and its value.
type Field = (Vec<u8>, Vec<u8>);

impl RawEntry {
    /// The value of the field `name`.
    fn field(&self, name: &str) -> Option<&[u8]> {
        let found = self
            .fields
            .iter()
            .find(|(field, _)| field == name.as_bytes());
        found.map(|(_, value)| value.as_slice())
    }

    /// The value of the field `name`, if it is UTF-8.
    fn text(&self, name: &str) -> Option<String> {
        let value = self.field(name)?;
        std::str::from_utf8(value).ok().map(str::to_owned)
    }
}

/// The entries of an `XREADGROUP` answer: per stream, its name and its entries (nil: none came).
fn read_entries(reply: Value) -> Result<Vec<RawEntry>, SourceError> {
    let streams = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|stream| match stream {
                Value::Array(pair) => pair.into_iter().nth(1).ok_or_else(unexpected),
                _ => Err(unexpected()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        _ => return Err(unexpected()),
    };
    let mut entries = Vec::new();
    for list in streams {
        entries.extend(entries_of(list)?);
    }
    Ok(entries)
}

/// The answer of `XAUTOCLAIM`: where the next call goes on, and the entries it claimed.
fn claimed_entries(reply: Value) -> Result<(String, Vec<RawEntry>), SourceError> {
    let Value::Array(parts) = reply else {
        return Err(unexpected());
    };
    let mut parts = parts.into_iter();
    let next = parts.next().and_then(text).ok_or_else(unexpected)?;
    let claimed = entries_of(parts.next().ok_or_else(unexpected)?)?;
    Ok((next, claimed))
}

/// Entries as `[[id, [name, value, ...]], ...]`. An entry deleted from the stream while it was
/// pending comes with no fields (Redis 7), or as a bare nil in `XAUTOCLAIM`'s answer (Redis 6.2):
/// it is not there to deliver, and the entries around it are.
fn entries_of(list: Value) -> Result<Vec<RawEntry>, SourceError> {
    let Value::Array(items) = list else {
        return Err(unexpected());
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let parts = match item {
            Value::Array(parts) => parts,
            Value::Nil => {
                tracing::warn!("a pending entry was deleted");
                continue;
            }
            _ => return Err(unexpected()),
        };
        let mut parts = parts.into_iter();
        let id = parts.next().and_then(text).ok_or_else(unexpected)?;
        match parts.next() {
            Some(Value::Array(flat)) => entries.push(RawEntry {
                id,
                fields: fields_of(flat)?,
            }),
            Some(Value::Nil) | None => tracing::warn!(%id, "a pending entry was deleted"),
            Some(_) => return Err(unexpected()),
        }
    }
    Ok(entries)
}

/// An entry's fields, `[name, value, ...]`, as pairs of bytes.
fn fields_of(flat: Vec<Value>) -> Result<Vec<Field>, SourceError> {
    let mut values = flat.into_iter().map(bytes);
    let mut fields = Vec::new();
    while let Some(name) = values.next() {
        let value = values.next().ok_or_else(unexpected)?;
        fields.push((name?, value?));
    }
    Ok(fields)
}

/// A string of the answer as its bytes.
fn bytes(value: Value) -> Result<Vec<u8>, SourceError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        _ => Err(unexpected()),
    }
}

/// A string of the answer as text (an entry id).
fn text(value: Value) -> Option<String> {
    String::from_utf8(bytes(value).ok()?).ok()
}

/// An answer of a shape the commands do not give.
fn unexpected() -> SourceError {
    "Redis answered a stream read in a shape it does not have".into()
}

/// Creates the group on the stream (and the stream with it) unless it is there, reading from
/// the stream's start.
async fn create_group(
    connection: &mut ConnectionManager,
    entries: &Entries,
) -> Result<(), SourceError> {
    let created: redis::RedisResult<()> = connection
        .xgroup_create_mkstream(&entries.stream, &entries.group, "0")
        .await;
    match created {
        Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
        other => Ok(other?),
    }
}

/// Whether `error` says that the group is not there (the stream was deleted, or the server
/// restarted without what it kept).
fn no_group(error: &SourceError) -> bool {
    let redis = error.downcast_ref::<redis::RedisError>();
    redis.is_some_and(|error| error.code() == Some("NOGROUP"))
}

/// How long a read waits for new entries: a quarter of the visibility timeout, at most a second.
fn read_wait(entries: &Entries) -> Duration {
    (entries.visibility / 4).min(Duration::from_secs(1))
}

/// How much longer than a read's wait its answer may take to come back.
const READ_MARGIN: Duration = Duration::from_secs(2);

/// The stream id before every entry: where a pass through the pending entries starts, and what
/// `XAUTOCLAIM` answers once it is through.
const START: &str = "0-0";

/// `duration` in whole milliseconds.
fn millis(duration: Duration) -> usize {
    usize::try_from(duration.as_millis()).unwrap_or(usize::MAX)
}

/// When an entry was added, from its id (`<milliseconds>-<n>`).
fn entry_time(id: &str) -> Option<SystemTime> {
    let millis: u64 = id.split('-').next()?.parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_millis(millis))
}

impl RedisStreamSourceBuilder {
    /// How long an entry stays with a consumer that neither settles it nor reports it in
    /// progress, before another consumer claims it (30 s by default).
    pub fn visibility_timeout(mut self, visibility: Duration) -> Self {
        self.entries.visibility = visibility.max(Duration::from_millis(100));
        self
    }

    /// How many entries one read asks for (100 by default).
    pub fn count(mut self, count: usize) -> Self {
        self.entries.count = count.max(1);
        self
    }

    /// The fields the type tag and id are read from.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    /// Opens the connections and creates the group unless it is there.
    pub async fn build(self) -> Result<RedisStreamSource, SourceError> {
        // A read blocks for up to a second: its answer may take that long, and longer than the
        // client's default response timeout.
        let reads_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(read_wait(&self.entries) + READ_MARGIN));
        let mut reads =
            ConnectionManager::new_with_config(self.client.clone(), reads_config).await?;
        let acks = ConnectionManager::new(self.client).await?;
        create_group(&mut reads, &self.entries).await?;
        Ok(RedisStreamSource {
            reads,
            acks,
            entries: self.entries,
            headers: self.headers,
            ready: VecDeque::new(),
            last_claim: None,
            claim_from: START.to_owned(),
            reading: InFlight::none(),
        })
    }
}

impl Source for RedisStreamSource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        loop {
            if let Some(delivery) = self.ready.pop_front() {
                return Ok(Some(delivery));
            }
            match self.fetch().await {
                Err(error) if no_group(&error) => {
                    // The stream went with its group (and a publisher may have added it again
                    // since): the group comes back, reading from the start, so that nothing
                    // added since is missed.
                    tracing::warn!(group = %self.entries.group, "the group is gone; creating it again");
                    self.claim_from = START.to_owned();
                    create_group(&mut self.reads, &self.entries).await?;
                }
                other => other?,
            }
        }
    }

    fn keep_alive(&self) -> Option<Duration> {
        Some(self.entries.visibility / 3)
    }

    async fn drain(&mut self) {
        let read = self
            .reading
            .finish(read_wait(&self.entries) + READ_MARGIN)
            .await;
        self.hold(read.into_iter().flatten());
        for delivery in std::mem::take(&mut self.ready) {
            let (_, _, acker) = delivery.into_parts();
            if let Err(error) = acker.nack(Duration::ZERO).await {
                tracing::warn!(%error, "could not hand a prefetched entry back");
            }
        }
    }
}

/// Settles one pending entry.
#[derive(Clone)]
struct RedisAcker {
    acks: ConnectionManager,
    entries: Entries,
    id: String,
}

impl RedisAcker {
    /// Claims the entry for its own consumer, its idle time set to `idle`.
    async fn set_idle(mut self, idle: Duration) -> Result<(), SourceError> {
        let entries = &self.entries;
        let options = StreamClaimOptions::default()
            .idle(millis(idle))
            .with_justid();
        let _: Value = self
            .acks
            .xclaim_options(
                &entries.stream,
                &entries.group,
                &entries.consumer,
                0,
                &[&self.id],
                options,
            )
            .await?;
        Ok(())
    }
}

impl Acknowledge for RedisAcker {
    fn ack(mut self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(async move {
            let entries = &self.entries;
            let _: i64 = self
                .acks
                .xack(&entries.stream, &entries.group, &[&self.id])
                .await?;
            Ok(())
        })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        let idle = self.entries.visibility.saturating_sub(delay);
        Box::pin(self.set_idle(idle))
    }

    fn in_progress(&self) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(self.clone().set_idle(Duration::ZERO))
    }
}

/// Adds envelopes to Redis streams (`XADD`): the bytes in [`PAYLOAD_FIELD`], the type tag, id and
/// headers in fields of their own. `XADD` answers once the entry is in the stream.
#[derive(Clone)]
pub struct RedisStreamPublisher {
    connection: ConnectionManager,
    headers: HeaderNames,
}

impl RedisStreamPublisher {
    /// A publisher over `client`, writing the type tag and id to the default [`HeaderNames`].
    ///
    /// An `XADD` waits for its answer as long as it takes (the relay bounds each publication):
    /// the client's default of half a second would count a large entry, or one during a stall of
    /// the server's disk, as failed after the server added it, and add it again on each try.
    pub async fn new(client: &Client) -> Result<Self, SourceError> {
        let config = ConnectionManagerConfig::new().set_response_timeout(None);
        Ok(Self {
            connection: ConnectionManager::new_with_config(client.clone(), config).await?,
            headers: HeaderNames::default(),
        })
    }

    /// Writes the type tag and id to these fields instead.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }
}

impl Sink for RedisStreamPublisher {
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let mut fields: Vec<(&str, &[u8])> = self
                .headers
                .of(envelope)
                .map(|(name, value)| (name, value.as_bytes()))
                .collect();
            fields.push((PAYLOAD_FIELD, envelope.payload()));
            let mut connection = self.connection.clone();
            let added: Result<String, _> = connection.xadd(destination, "*", &fields).await;
            added.map(drop).map_err(xadd_error)
        })
    }
}

/// An answer of the server (the key holds no stream, say) is a refusal; a connection that
/// failed or timed out may pass on a later try.
fn xadd_error(error: ::redis::RedisError) -> SinkError {
    // Answers that mean "not now" rather than "not this".
    const TRANSIENT: [&str; 10] = [
        "OOM",
        "LOADING",
        "READONLY",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "MOVED",
        "ASK",
        "BUSY",
        "MASTERDOWN",
        "NOREPLICAS",
    ];
    let unreachable = error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.code().is_some_and(|code| TRANSIENT.contains(&code));
    if unreachable {
        SinkError::unavailable(error)
    } else {
        SinkError::Refused(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, fields: &[&str]) -> Value {
        let fields = fields
            .iter()
            .map(|f| Value::BulkString(f.as_bytes().to_vec()));
        let id = Value::BulkString(id.as_bytes().to_vec());
        Value::Array(vec![id, Value::Array(fields.collect())])
    }

    /// Redis 7 answers a deleted pending entry with its id and no fields; Redis 6.2's
    /// `XAUTOCLAIM` with a nil in its place. Either way the entries around it are delivered.
    #[test]
    fn entries_deleted_while_pending_are_left_out_and_the_others_kept() {
        let deleted_on_7 = Value::Array(vec![Value::BulkString(b"2-0".to_vec()), Value::Nil]);
        let list = Value::Array(vec![
            entry("1-0", &["type", "a"]),
            deleted_on_7,
            Value::Nil,
            entry("4-0", &["type", "b"]),
        ]);

        let entries = entries_of(list).expect("the entries");

        let ids: Vec<_> = entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["1-0", "4-0"]);
        assert!(entries_of(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
