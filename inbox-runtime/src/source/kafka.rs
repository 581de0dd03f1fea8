//! Kafka (feature `kafka`, through librdkafka): a consumer of a consumer group as a [`Source`],
//! and an idempotent producer.
//!
//! Kafka has no per-message ack, only a committed offset per partition, below which everything
//! counts as done. So this source commits, per partition, only the **contiguous prefix of settled
//! offsets**: a message is settled once the inbox has it durably (processed, skipped, parked,
//! failed with its retry recorded, dead or rejected); a message done while an earlier one of its
//! partition is still in flight waits for it. A crash therefore redelivers at most what was in
//! flight and what was settled after it since the last commit, which the inbox drops as
//! duplicates.
//!
//! - **Commits**: at most every [commit interval](KafkaSourceBuilder::commit_interval) (1 s by
//!   default) while the run pulls or waits, before a partition is given up in a rebalance, and
//!   when the source is dropped at the end of a run. `enable.auto.commit` is turned off. A
//!   commit that fails (the broker away, the group rebalancing) is made again at the next
//!   interval, though no message has settled since.
//! - **Rebalances**: before partitions are revoked, the source waits (up to the
//!   [revoke timeout](KafkaSourceBuilder::revoke_timeout), 5 s by default) for their messages in
//!   flight to settle, commits what is settled, and forgets the rest: the partition's next owner
//!   resumes from that offset, and what this consumer still finishes later is a duplicate there.
//!   (On a current-thread runtime the source does not wait: nothing could settle meanwhile.)
//!   On assignment, consumption resumes from the committed offset.
//! - **A failed message**: Kafka cannot hand back one message, and blocking its partition until
//!   the retries are exhausted would stop every other aggregate on it. The inbox records the
//!   failure with the payload; the source then takes the offset as settled, and the runtime
//!   retries the message from the store when its backoff is due (the path operator replays take).
//!   Under strict ordering the aggregate's successors park behind it meanwhile; under monotonic
//!   ordering they apply, and the retried message is stale if a newer one applied.
//! - **A delivery that could not be handled at all** (the database unreachable): its offset stays
//!   unsettled and the source delivers it again itself after the delay, with the attempt counted.
//! - **Order**: Kafka keeps a partition's order, and the publisher keys a message by its aggregate
//!   (the `aggregate-id` header), so one aggregate stays on one partition, and so on one consumer
//!   of the group. The runtime handles an aggregate's messages one at a time in the order they
//!   came; messages of different aggregates on one partition run concurrently.
//! - **Mapping**: the type tag and id come from the [`HeaderNames`] headers (the id falls back to
//!   `topic/partition/offset`); other headers whose name and value are UTF-8 become headers (one
//!   whose name is not is left out, where rdkafka's own reader would panic), the topic is the `destination`
//!   header, and `produced_at` is the message's timestamp. A message without a type tag is a
//!   delivery the run keeps as rejected, with its bytes.
//!
//! A long handler needs nothing from the broker (no message is taken back on a timer), but the
//! run must keep pulling: librdkafka takes a consumer out of its group when it has not asked for
//! messages for `max.poll.interval.ms` (5 minutes by default).

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use inbox_core::Envelope;
use inbox_core::outbox::AGGREGATE_ID;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::TopicPartitionListElem;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::runtime::RuntimeFlavor;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Acknowledge, Delivery, HeaderNames, Sink, SinkError, Source, SourceError};

/// The client this module speaks through, for its [`ClientConfig`].
pub use rdkafka;

type StreamConsumer = rdkafka::consumer::StreamConsumer<Rebalancing>;

/// One consumer of a consumer group on Kafka topics.
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::kafka::{KafkaSource, rdkafka::ClientConfig};
///
/// let mut config = ClientConfig::new();
/// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "billing");
/// let source = KafkaSource::builder(&config, &["orders"]).build()?;
/// # Ok(()) }
/// ```
pub struct KafkaSource {
    consumer: StreamConsumer,
    offsets: Arc<Offsets>,
    headers: HeaderNames,
    commit_interval: Duration,
    last_commit: Instant,
    redeliveries: mpsc::UnboundedReceiver<Redelivery>,
    handed_back: mpsc::UnboundedSender<Redelivery>,
    due: BinaryHeap<Redelivery>,
}

/// Builds a [`KafkaSource`].
pub struct KafkaSourceBuilder {
    config: ClientConfig,
    topics: Vec<String>,
    headers: HeaderNames,
    commit_interval: Duration,
    revoke_timeout: Duration,
}

impl KafkaSource {
    /// A consumer of `topics` with librdkafka's `config` (at least `bootstrap.servers` and
    /// `group.id`). The source sets `enable.auto.commit` and `enable.auto.offset.store` to
    /// `false` (it commits itself), and `auto.offset.reset` to `earliest` unless `config` says
    /// otherwise.
    pub fn builder(config: &ClientConfig, topics: &[&str]) -> KafkaSourceBuilder {
        KafkaSourceBuilder {
            config: config.clone(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            headers: HeaderNames::default(),
            commit_interval: Duration::from_secs(1),
            revoke_timeout: Duration::from_secs(5),
        }
    }

    /// Commits what is settled, if the commit interval has passed since the last commit.
    fn commit_if_due(&mut self) {
        if self.last_commit.elapsed() < self.commit_interval {
            return;
        }
        self.last_commit = Instant::now();
        let settled = self.offsets.take_settled(None);
        if settled.count() > 0
            && let Err(error) = self.consumer.commit(&settled, CommitMode::Async)
        {
            tracing::warn!(%error, "committing offsets failed; they are committed again later");
            self.offsets.commit_failed(settled.elements());
        }
    }

    /// A consumed message as a delivery.
    fn delivery(&self, message: &BorrowedMessage<'_>) -> Delivery {
        let position = Position {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
        };
        let generation = self.offsets.yielded(&position);
        let (envelope, untagged) = envelope(message, &self.headers);
        let redelivery = Redelivery {
            due: Instant::now(),
            position,
            generation,
            envelope,
            attempt: 1,
            untagged,
        };
        self.deliver(redelivery)
    }

    /// A message (first delivered, or handed back) as a delivery.
    fn deliver(&self, message: Redelivery) -> Delivery {
        let acker = Box::new(KafkaAcker {
            offsets: Arc::clone(&self.offsets),
            handed_back: self.handed_back.clone(),
            message: message.clone(),
        });
        let Redelivery {
            envelope,
            attempt,
            untagged,
            ..
        } = message;
        match untagged {
            false => Delivery::new(envelope, attempt, acker),
            true => {
                let reason = format!("it has no `{}` header", self.headers.message_type);
                Delivery::unreadable(envelope, attempt, acker, reason)
            }
        }
    }

    /// The next handed-back message that is due and whose partition is still this consumer's.
    fn due_redelivery(&mut self) -> Option<Delivery> {
        while let Ok(message) = self.redeliveries.try_recv() {
            self.due.push(message);
        }
        while self.due.peek().is_some_and(|m| m.due <= Instant::now()) {
            let message = self.due.pop()?;
            if self.offsets.owns(&message.position, message.generation) {
                return Some(self.deliver(message));
            }
        }
        None
    }
}

impl KafkaSourceBuilder {
    /// How often settled offsets are committed at most (1 s by default).
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// How long a rebalance waits for the messages in flight of a revoked partition to settle
    /// before it commits what is settled and gives the partition up (5 s by default).
    pub fn revoke_timeout(mut self, timeout: Duration) -> Self {
        self.revoke_timeout = timeout;
        self
    }

    /// The headers the type tag and id are read from.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }

    /// Creates the consumer and subscribes it to the topics.
    pub fn build(self) -> Result<KafkaSource, SourceError> {
        let mut config = self.config;
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        let offsets = Arc::new(Offsets::default());
        let context = Rebalancing {
            offsets: Arc::clone(&offsets),
            revoke_timeout: self.revoke_timeout,
            cooperative: OnceLock::new(),
        };
        let consumer: StreamConsumer = config.create_with_context(context)?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let (handed_back, redeliveries) = mpsc::unbounded_channel();
        Ok(KafkaSource {
            consumer,
            offsets,
            headers: self.headers,
            commit_interval: self.commit_interval,
            last_commit: Instant::now(),
            redeliveries,
            handed_back,
            due: BinaryHeap::new(),
        })
    }
}

impl Source for KafkaSource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        loop {
            if let Some(delivery) = self.due_redelivery() {
                return Ok(Some(delivery));
            }
            self.commit_if_due();
            let commit = Instant::now() + self.commit_interval;
            let wake = self.due.peek().map_or(commit, |m| m.due.min(commit));
            tokio::select! {
                received = self.consumer.recv() => {
                    let message = received?;
                    return Ok(Some(self.delivery(&message)));
                }
                Some(message) = self.redeliveries.recv() => self.due.push(message),
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

impl Drop for KafkaSource {
    /// Commits what is settled before the consumer leaves its group.
    fn drop(&mut self) {
        let settled = self.offsets.take_settled(None);
        if settled.count() > 0
            && let Err(error) = self.consumer.commit(&settled, CommitMode::Sync)
        {
            tracing::warn!(%error, "committing offsets at the end failed; they are delivered again");
        }
    }
}

/// Where a message is: its topic, partition and offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Position {
    topic: String,
    partition: i32,
    offset: i64,
}

/// A message the source delivers (again) once `due`.
#[derive(Debug, Clone)]
struct Redelivery {
    due: Instant,
    position: Position,
    generation: u64,
    envelope: Envelope,
    attempt: u32,
    untagged: bool,
}

impl PartialEq for Redelivery {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due
    }
}

impl Eq for Redelivery {}

impl PartialOrd for Redelivery {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Redelivery {
    /// The soonest due first, in a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.due.cmp(&self.due)
    }
}

/// The headers of `message` whose name and value are UTF-8 (the last of a name wins).
///
/// They are read through librdkafka itself: rdkafka's reader (`Headers::iter`) panics on a name
/// that is not UTF-8, which any producer can write, and the record would then stop the consumer
/// each time it came back.
fn text_headers(message: &BorrowedMessage<'_>) -> BTreeMap<String, String> {
    use rdkafka::bindings::{
        rd_kafka_header_cnt, rd_kafka_header_get_all, rd_kafka_message_headers,
    };
    use rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR as FOUND;

    let mut texts = BTreeMap::new();
    let mut headers = std::ptr::null_mut();
    // SAFETY: the message is alive for the borrow, and its headers stay its own (read, never
    // detached or freed here).
    let found = unsafe { rd_kafka_message_headers(message.ptr(), &mut headers) };
    if found != FOUND || headers.is_null() {
        return texts;
    }
    // SAFETY: `headers` is the message's own list, alive as long as the message.
    let count = unsafe { rd_kafka_header_cnt(headers) };
    for at in 0..count {
        let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: `at` is below the count; the pointers written belong to the list.
        let got = unsafe { rd_kafka_header_get_all(headers, at, &mut name, &mut value, &mut size) };
        if got != FOUND || name.is_null() || value.is_null() {
            continue;
        }
        // SAFETY: librdkafka gives a NUL-terminated name and a value of `size` bytes, both alive
        // as long as the list.
        let (name, value) = unsafe {
            let name = std::ffi::CStr::from_ptr(name).to_bytes();
            (name, std::slice::from_raw_parts(value.cast::<u8>(), size))
        };
        if let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) {
            texts.insert(name.to_owned(), value.to_owned());
        }
    }
    texts
}

/// A Kafka message as an envelope, and whether it lacks the type tag header.
fn envelope(message: &BorrowedMessage<'_>, names: &HeaderNames) -> (Envelope, bool) {
    let mut headers = text_headers(message);
    let message_type = headers.remove(&names.message_type);
    let id = headers.remove(&names.message_id).unwrap_or_else(|| {
        let (topic, partition) = (message.topic(), message.partition());
        format!("{topic}/{partition}/{}", message.offset())
    });
    let payload = message.payload().unwrap_or_default().to_vec();
    let untagged = message_type.is_none();
    let mut envelope = Envelope::new(message_type.unwrap_or_default(), id, payload);
    for (name, value) in headers {
        envelope = envelope.with_header(name, value);
    }
    envelope = envelope.with_header("destination", message.topic());
    if let Some(millis) = message
        .timestamp()
        .to_millis()
        .and_then(|ms| u64::try_from(ms).ok())
    {
        envelope = envelope.with_produced_at(UNIX_EPOCH + Duration::from_millis(millis));
    }
    (envelope, untagged)
}

/// What is in flight and settled, per partition this consumer owns.
#[derive(Default)]
struct Offsets {
    partitions: Mutex<HashMap<(String, i32), Partition>>,
    generations: std::sync::atomic::AtomicU64,
}

/// One owned partition.
#[derive(Debug)]
struct Partition {
    /// Which ownership of the partition this is: a message delivered under an earlier one is
    /// not settled in this one.
    generation: u64,
    /// The offsets delivered and not committed yet, each with whether it is settled.
    in_flight: BTreeMap<i64, bool>,
    /// The offset to commit (one past the last of the settled prefix), if it has moved since
    /// the last commit.
    to_commit: Option<i64>,
    /// The offset the last commit of this ownership sent: if that commit fails, it is the one to
    /// commit again, unless the prefix has moved since.
    committing: Option<i64>,
}

impl Offsets {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, i32), Partition>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that the message at `position` was delivered; returns the ownership it belongs to.
    fn yielded(&self, position: &Position) -> u64 {
        let mut partitions = self.lock();
        let key = (position.topic.clone(), position.partition);
        let partition = partitions.entry(key).or_insert_with(|| Partition {
            generation: self.new_generation(),
            in_flight: BTreeMap::new(),
            to_commit: None,
            committing: None,
        });
        partition.in_flight.entry(position.offset).or_insert(false);
        partition.generation
    }

    fn new_generation(&self) -> u64 {
        (self.generations).fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the partition of `position` is still owned as it was under `generation`.
    fn owns(&self, position: &Position, generation: u64) -> bool {
        let key = (position.topic.clone(), position.partition);
        self.lock()
            .get(&key)
            .is_some_and(|p| p.generation == generation)
    }

    /// Notes that the message at `position` is settled, and moves its partition's settled
    /// prefix.
    fn settle(&self, position: &Position, generation: u64) {
        let mut partitions = self.lock();
        let key = (position.topic.clone(), position.partition);
        let Some(partition) = partitions.get_mut(&key) else {
            return;
        };
        if partition.generation != generation {
            return;
        }
        if let Some(settled) = partition.in_flight.get_mut(&position.offset) {
            *settled = true;
        }
        while let Some(entry) = partition.in_flight.first_entry() {
            if !*entry.get() {
                break;
            }
            partition.to_commit = Some(entry.key() + 1);
            entry.remove();
        }
    }

    /// The offsets to commit, of every partition or of those in `only`; they count as committed.
    fn take_settled(&self, only: Option<&TopicPartitionList>) -> TopicPartitionList {
        let mut settled = TopicPartitionList::new();
        for ((topic, number), partition) in self.lock().iter_mut() {
            let wanted = only.is_none_or(|list| list.find_partition(topic, *number).is_some());
            if let (true, Some(offset)) = (wanted, partition.to_commit.take()) {
                partition.committing = Some(offset);
                // An offset is valid: it came from a message of this partition.
                let _ = settled.add_partition_offset(topic, *number, Offset::Offset(offset));
            }
        }
        settled
    }

    /// Takes the offsets in `failed`, whose commit failed, as to commit again: each where its
    /// partition is still owned as when the commit took it, and its settled prefix has not moved
    /// since (a later commit carries the prefix past it).
    fn commit_failed<'a>(&self, failed: impl IntoIterator<Item = TopicPartitionListElem<'a>>) {
        let mut partitions = self.lock();
        for element in failed {
            let key = (element.topic().to_owned(), element.partition());
            let (Some(partition), Offset::Offset(offset)) =
                (partitions.get_mut(&key), element.offset())
            else {
                continue;
            };
            if partition.committing == Some(offset) && partition.to_commit.is_none() {
                partition.to_commit = Some(offset);
            }
        }
    }

    /// Whether the partitions in `list` have nothing in flight.
    fn settled(&self, list: &TopicPartitionList) -> bool {
        let partitions = self.lock();
        list.elements().iter().all(|element| {
            let key = (element.topic().to_owned(), element.partition());
            partitions.get(&key).is_none_or(|p| p.in_flight.is_empty())
        })
    }

    /// Forgets the partitions in `list`: what is delivered of them settles nothing any more.
    fn forget(&self, list: &TopicPartitionList) {
        let mut partitions = self.lock();
        for element in list.elements() {
            partitions.remove(&(element.topic().to_owned(), element.partition()));
        }
    }
}

/// The consumer's rebalance callbacks: before partitions are revoked, their settled offsets are
/// committed.
struct Rebalancing {
    offsets: Arc<Offsets>,
    revoke_timeout: Duration,
    /// Whether the group rebalances incrementally (cooperative), as librdkafka said at the first
    /// assignment.
    cooperative: OnceLock<bool>,
}

impl ClientContext for Rebalancing {}

impl ConsumerContext for Rebalancing {
    /// A commit the broker refused (or that never reached it) is made again with the next one,
    /// and so is a partition whose commit alone failed.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let elements = offsets.elements();
        let failed = match result {
            Err(error) => {
                tracing::warn!(%error, "committing offsets failed; they are committed again later");
                elements
            }
            Ok(()) => elements.into_iter().filter(refused_alone).collect(),
        };
        self.offsets.commit_failed(failed);
    }

    /// Takes or gives up partitions as rdkafka's own rebalance does, except that it asks
    /// librdkafka for the group's protocol only at the first assignment: asked again in the
    /// revocation that closing the consumer makes (when the source is dropped at the end of a
    /// run), librdkafka can wait forever for its own answer (librdkafka #4041), and the run's
    /// thread with it.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        error: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        let rebalance = match error {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(partitions),
            _ => Rebalance::Error(KafkaError::Rebalance(error.into())),
        };
        let assign = matches!(rebalance, Rebalance::Assign(_));
        self.pre_rebalance(consumer, &rebalance);
        let cooperative = match assign {
            true => *self.cooperative.get_or_init(|| {
                matches!(
                    consumer.rebalance_protocol(),
                    RebalanceProtocol::Cooperative
                )
            }),
            // Nothing to give up incrementally if nothing was ever assigned.
            false => self.cooperative.get().copied().unwrap_or(false),
        };
        let changed = match (assign, cooperative) {
            (true, true) => consumer.incremental_assign(partitions),
            (true, false) => consumer.assign(partitions),
            (false, true) => consumer.incremental_unassign(partitions),
            (false, false) => consumer.unassign(),
        };
        if let Err(error) = changed {
            tracing::warn!(%error, "the consumer could not change its assignment");
        }
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        self.wait_until_settled(revoked);
        let settled = self.offsets.take_settled(Some(revoked));
        if settled.count() > 0
            && let Err(error) = consumer.commit(&settled, CommitMode::Sync)
        {
            tracing::warn!(%error, "committing the offsets of revoked partitions failed");
        }
        self.offsets.forget(revoked);
    }
}

impl Rebalancing {
    /// Waits, up to the revoke timeout, for the messages in flight of `revoked` to settle. The
    /// wait blocks the thread that polls the consumer: on a multi-thread runtime, that thread's
    /// other tasks move to another worker meanwhile (`block_in_place`); on a current-thread
    /// runtime nothing could settle while its one thread waits, so it does not wait, and what is
    /// in flight is a duplicate for the partition's next owner.
    fn wait_until_settled(&self, revoked: &TopicPartitionList) {
        let wait = || {
            let waited = std::time::Instant::now();
            while !self.offsets.settled(revoked) && waited.elapsed() < self.revoke_timeout {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        match tokio::runtime::Handle::try_current().map(|runtime| runtime.runtime_flavor()) {
            Ok(RuntimeFlavor::CurrentThread) => {}
            Ok(_) => tokio::task::block_in_place(wait),
            Err(_) => wait(),
        }
    }
}

/// Whether the broker refused this partition's commit (the others' may have passed).
fn refused_alone(element: &TopicPartitionListElem<'_>) -> bool {
    let Err(error) = element.error() else {
        return false;
    };
    tracing::warn!(%error, topic = element.topic(), partition = element.partition(),
        "committing a partition's offset failed; it is committed again later");
    true
}

/// Settles one message.
struct KafkaAcker {
    offsets: Arc<Offsets>,
    handed_back: mpsc::UnboundedSender<Redelivery>,
    message: Redelivery,
}

impl KafkaAcker {
    fn settle(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        let message = &self.message;
        self.offsets.settle(&message.position, message.generation);
        Box::pin(async { Ok(()) })
    }
}

impl Acknowledge for KafkaAcker {
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        self.settle()
    }

    /// Delivers the message again after `delay`, its offset unsettled meanwhile.
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        let mut message = self.message;
        message.due = Instant::now() + delay;
        message.attempt += 1;
        // A source that is gone redelivers nothing: its partitions go to the next owner.
        let _ = self.handed_back.send(message);
        Box::pin(async { Ok(()) })
    }

    fn retry_later(
        self: Box<Self>,
        _delay: Duration,
    ) -> BoxFuture<'static, Result<(), SourceError>> {
        self.settle()
    }
}

/// Publishes envelopes to Kafka topics with an idempotent producer (`enable.idempotence`,
/// `acks=all`), keyed by the envelope's `aggregate-id` header so that an aggregate stays on one
/// partition; `publish` returns once the broker has the message.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    headers: HeaderNames,
    timeout: Duration,
}

impl KafkaPublisher {
    /// A producer with librdkafka's `config` (at least `bootstrap.servers`), made idempotent.
    pub fn new(config: &ClientConfig) -> Result<Self, SourceError> {
        let mut config = config.clone();
        config.set("enable.idempotence", "true").set("acks", "all");
        Ok(Self {
            producer: config.create()?,
            headers: HeaderNames::default(),
            timeout: Duration::from_secs(30),
        })
    }

    /// Writes the type tag and id to these headers instead.
    pub fn headers(mut self, headers: HeaderNames) -> Self {
        self.headers = headers;
        self
    }
}

impl Sink for KafkaPublisher {
    fn publish<'a>(
        &'a self,
        destination: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let headers =
                self.headers
                    .of(envelope)
                    .fold(OwnedHeaders::new(), |headers, (key, value)| {
                        headers.insert(Header {
                            key,
                            value: Some(value),
                        })
                    });
            let mut record = FutureRecord::to(destination)
                .payload(envelope.payload())
                .headers(headers)
                .timestamp(now_millis());
            if let Some(aggregate) = envelope.headers().get(AGGREGATE_ID) {
                record = record.key(aggregate.as_str());
            }
            match self.producer.send(record, self.timeout).await {
                Ok(_) => Ok(()),
                Err((error, _)) => Err(produce_error(error)),
            }
        })
    }
}

/// Now, in Unix epoch milliseconds.
fn now_millis() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// What the broker said of this message itself is a refusal; anything else may pass later.
fn produce_error(error: rdkafka::error::KafkaError) -> SinkError {
    const REFUSED: [RDKafkaErrorCode; 6] = [
        RDKafkaErrorCode::MessageSizeTooLarge,
        RDKafkaErrorCode::InvalidMessage,
        RDKafkaErrorCode::InvalidMessageSize,
        RDKafkaErrorCode::InvalidRecord,
        RDKafkaErrorCode::TopicAuthorizationFailed,
        RDKafkaErrorCode::InvalidTopic,
    ];
    match error.rdkafka_error_code() {
        Some(code) if REFUSED.contains(&code) => SinkError::Refused(error.to_string()),
        _ => SinkError::unavailable(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: i64) -> Position {
        Position {
            topic: "orders".to_owned(),
            partition: 0,
            offset,
        }
    }

    /// A partition's offsets 0, 1 and 2 delivered and settled, and the commit that took them;
    /// with the partition's ownership.
    fn three_settled_and_sent() -> (Offsets, u64, TopicPartitionList) {
        let offsets = Offsets::default();
        let generation = offsets.yielded(&at(0));
        for offset in 0..3 {
            offsets.yielded(&at(offset));
            offsets.settle(&at(offset), generation);
        }
        let sent = offsets.take_settled(None);
        (offsets, generation, sent)
    }

    fn committed(list: &TopicPartitionList) -> Option<Offset> {
        list.find_partition("orders", 0)
            .map(|element| element.offset())
    }

    /// The partition's offset the next commit takes, if any.
    fn next_commit(offsets: &Offsets) -> Option<Offset> {
        committed(&offsets.take_settled(None))
    }

    #[test]
    fn an_offset_whose_commit_failed_is_committed_again() {
        let (offsets, _, sent) = three_settled_and_sent();
        assert_eq!(committed(&sent), Some(Offset::Offset(3)));
        assert_eq!(next_commit(&offsets), None);

        offsets.commit_failed(sent.elements());
        assert_eq!(next_commit(&offsets), Some(Offset::Offset(3)));
    }

    #[test]
    fn a_failed_commit_leaves_a_prefix_that_moved_since_as_it_is() {
        let (offsets, generation, sent) = three_settled_and_sent();
        offsets.yielded(&at(3));
        offsets.settle(&at(3), generation);

        offsets.commit_failed(sent.elements());
        assert_eq!(next_commit(&offsets), Some(Offset::Offset(4)));
    }

    #[test]
    fn a_failed_commit_of_an_earlier_ownership_is_not_made_again() {
        let (offsets, _, sent) = three_settled_and_sent();
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("orders", 0);
        offsets.forget(&revoked);
        // Owned again, from the offset the group had committed before: 3 is not settled now.
        offsets.yielded(&at(0));

        offsets.commit_failed(sent.elements());
        assert_eq!(next_commit(&offsets), None);
    }
}
