//! Kafka beyond the conformance suite (tests/brokers.rs): the offset a consumer group commits is
//! never ahead of a message still in flight, so a consumer killed mid-batch loses nothing and the
//! next one handles every message once; a failed message does not hold its partition up, and the
//! runtime retries it from the store; a header name that is not UTF-8 stops nothing. Runs when `INBOX_TEST_KAFKA_BROKERS` and
//! `INBOX_TEST_POSTGRES_URL` are set (required under `CI=true`): the inbox runs on PostgreSQL,
//! where a handler stalled in its transaction holds up no other aggregate.
#![cfg(feature = "kafka")]

mod common;

use std::time::Duration;

use inbox::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use inbox::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use inbox::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use inbox::kafka::{KafkaPublisher, KafkaSource};
use inbox::prelude::*;
use inbox::{RetryPolicy, Sink};

use common::ledger::Credited;

common::ledger::ledger_handlers!(sqlx::Postgres, sqlx::PgConnection);
common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

/// A topic of one partition (so that offsets follow the order of publication), and its group.
struct Topic {
    brokers: String,
    name: String,
}

impl Topic {
    /// A new topic, or `None` (with a line saying so) when Kafka is not configured.
    async fn new(test: &str) -> Option<Self> {
        let brokers = common::kafka_brokers(test)?;
        let name = common::unique(test);
        let admin: AdminClient<_> = config(&brokers).create().expect("an admin client");
        let topic = NewTopic::new(&name, 1, TopicReplication::Fixed(1));
        let created = admin.create_topics([&topic], &AdminOptions::new()).await;
        for result in created.unwrap_or_else(|e| panic!("cannot reach Kafka at {brokers}: {e}")) {
            result.unwrap_or_else(|(topic, e)| panic!("cannot create topic {topic}: {e}"));
        }
        Some(Topic { brokers, name })
    }

    /// Publishes `events` in this order, each keyed by its account.
    async fn publish(&self, events: &[Credited]) {
        let publisher = KafkaPublisher::new(&config(&self.brokers)).expect("a producer");
        for event in events {
            let envelope = Envelope::encode(format!("delivery-{}", event.event_id), event)
                .expect("encode")
                .with_header(inbox::outbox::AGGREGATE_ID, event.account.as_str());
            publisher
                .publish(&self.name, &envelope)
                .await
                .expect("publish");
        }
    }

    /// The group's consumer config.
    fn group_config(&self) -> ClientConfig {
        let mut config = config(&self.brokers);
        config
            .set("group.id", format!("group-{}", self.name))
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        config
    }

    /// A consumer of the group, committing every 100 ms.
    fn source(&self) -> KafkaSource {
        KafkaSource::builder(&self.group_config(), &[&self.name])
            .commit_interval(Duration::from_millis(100))
            .build()
            .expect("build the source")
    }

    /// The offset the group has committed on the partition, if any.
    fn committed(&self) -> Option<i64> {
        let consumer: BaseConsumer = self.group_config().create().expect("a consumer");
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&self.name, 0);
        let committed = consumer
            .committed_offsets(partitions, Duration::from_secs(10))
            .expect("read the committed offsets");
        match committed.elements()[0].offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }
    }
}

fn config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

/// The event whose first attempt stalls for good.
static STALLED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Credits; the first attempt at `e-5` stalls for an hour, inside its transaction.
#[inbox_handler(key = "event_id", aggregate = "account", name = "stall_e5")]
async fn stall_e5(tx: &mut sqlx::PgConnection, msg: Credited) -> Result<(), HandlerError> {
    let first = {
        let mut stalled = STALLED.lock().unwrap();
        let first = msg.event_id == "e-5" && !stalled.contains(&msg.event_id);
        stalled.push(msg.event_id.clone());
        first
    };
    if first {
        tokio::time::sleep(Duration::from_secs(3_600)).await;
    }
    apply_credit(tx, &msg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_batch_commits_nothing_past_unsettled_work_and_loses_nothing() {
    let Some(topic) = Topic::new("kafka_killed").await else {
        return;
    };
    let Some(pool) = ledger("kafka_killed").await else {
        return;
    };
    // Twenty accounts, one event each, on one partition: e-5 at offset 5.
    let events: Vec<_> = (0..20)
        .map(|n| Credited::new(format!("e-{n}"), format!("acct-{n}"), 1, 1))
        .collect();
    topic.publish(&events).await;
    let stalling = async |pool: Pool| {
        let inbox = Inbox::builder(pool).handler(stall_e5).build();
        inbox.await.expect("build the inbox")
    };

    // The run is killed while e-5 is in flight and everything after it is done and settled,
    // past several commit intervals.
    let killed = async || (stalling(second_pool(&pool).await).await, topic.source());
    common::run_then_kill(killed, async {
        let watching = second_pool(&pool).await;
        common::eventually_async("the other 19 applied", || async {
            count(&watching, "applied").await == 19
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    });

    let committed = tokio::task::block_in_place(|| topic.committed());
    assert!(
        committed.is_none_or(|offset| offset <= 5),
        "the group committed {committed:?}, past e-5 (offset 5), which was never handled"
    );
    let inbox = stalling(pool.clone()).await;
    let report = run_until_applied(&inbox, &pool, topic.source(), 20).await;
    assert_eq!(count(&pool, "applied").await, 20, "{report:?}");
    for n in 0..20 {
        let account = format!("acct-{n}");
        assert_eq!(balance(&pool, &account).await, 1, "{account}: {report:?}");
    }
    assert_eq!(
        report.handler_calls_with(Outcome::Processed),
        1,
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_message_settles_its_offset_and_is_retried_from_the_store() {
    let Some(topic) = Topic::new("kafka_failed").await else {
        return;
    };
    let Some(pool) = ledger("kafka_failed").await else {
        return;
    };
    // a#1 fails until its crash point is removed; a#2 parks behind it; b applies meanwhile.
    sqlx::query("INSERT INTO crash_points (account, sequence) VALUES ('a', 1)")
        .execute(&pool)
        .await
        .unwrap();
    let events = [
        Credited::new("a-1", "a", 1, 1),
        Credited::new("a-2", "a", 2, 10),
        Credited::new("b-1", "b", 1, 1),
        Credited::new("b-2", "b", 2, 1),
        Credited::new("b-3", "b", 3, 1),
    ];
    topic.publish(&events).await;
    let inbox = Inbox::builder(pool.clone())
        .handler(credit_strict)
        .retry(
            RetryPolicy::new(100).backoff(Duration::from_millis(200), Duration::from_millis(200)),
        )
        .sweep_interval(Duration::from_millis(200))
        .build()
        .await
        .unwrap();

    let run = {
        let (inbox, pool, source) = (inbox.clone(), pool.clone(), topic.source());
        tokio::spawn(async move { run_until_applied(&inbox, &pool, source, 5).await })
    };
    let mut committed = None;
    for _ in 0..100 {
        committed = tokio::task::block_in_place(|| topic.committed());
        if committed == Some(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        committed,
        Some(5),
        "the failed message held its partition up"
    );
    assert_eq!(
        status(&pool, "credit_strict", "a-1").await.as_deref(),
        Some("failed"),
        "a#1 is kept as failed, to be retried from the store"
    );
    assert_eq!(count(&pool, "applied").await, 3, "only b applied");

    sqlx::query("DELETE FROM crash_points")
        .execute(&pool)
        .await
        .unwrap();
    let report = run.await.unwrap();

    assert_eq!(count(&pool, "applied").await, 5, "{report:?}");
    let order: Vec<i64> = applied(&pool, "a")
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(order, [1, 2], "{report:?}");
    assert_eq!(balance(&pool, "a").await, 11);
}

/// Drops `source` on a blocking thread; fails if closing it takes more than half a minute.
async fn close_within_half_a_minute(source: KafkaSource, what: &str) {
    let closed = tokio::task::spawn_blocking(move || drop(source));
    let closed = tokio::time::timeout(Duration::from_secs(30), closed).await;
    closed
        .unwrap_or_else(|_| panic!("{what} did not close in 30 s"))
        .expect("the thread closing the consumer");
}

/// A consumer dropped while its group rebalances (a second consumer joining) closes: it gives up
/// its partitions without asking librdkafka for the group's protocol, which closing can make wait
/// forever (librdkafka #4041). Several rounds, each on a topic and group of its own, each dropping
/// the first consumer a little later into the second one's join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_while_its_group_rebalances_closes() {
    use inbox::Source;

    for round in 0..6_u64 {
        let Some(topic) = Topic::new(&format!("kafka_close_{round}")).await else {
            return;
        };
        topic.publish(&[Credited::new("e-1", "acct-1", 1, 1)]).await;
        let mut first = topic.source();
        let delivery = tokio::time::timeout(Duration::from_secs(30), first.next()).await;
        let delivery = delivery.unwrap_or_else(|_| panic!("round {round}: no delivery in 30 s"));
        let delivery = delivery
            .expect("the source")
            .expect("the topic is not empty");
        delivery.ack().await.expect("ack");
        let mut second = topic.source();
        let joining = tokio::time::timeout(Duration::from_millis(100 * round), second.next());
        let _ = joining.await;
        close_within_half_a_minute(first, "the first consumer").await;
        close_within_half_a_minute(second, "the second consumer").await;
    }
}

/// A record with a header name that is not UTF-8 (any producer can write one) is delivered
/// without that header, and the consumer goes on with the next record: rdkafka's own header
/// reader would panic on it, each time the record came back.
#[tokio::test]
async fn a_header_name_that_is_not_utf8_is_left_out() {
    use inbox::Source;
    use inbox::kafka::rdkafka::message::{Header, OwnedHeaders};
    use inbox::kafka::rdkafka::producer::{FutureProducer, FutureRecord};

    let Some(topic) = Topic::new("kafka_header_not_utf8").await else {
        return;
    };
    let producer: FutureProducer = config(&topic.brokers).create().expect("a producer");
    let tagged = |id: &'static str| {
        let header = |key, value: &'static str| Header {
            key,
            value: Some(value),
        };
        OwnedHeaders::new()
            .insert(header("ce-type", "test.credited"))
            .insert(header("ce-id", id))
    };
    for (id, odd) in [("e-1", true), ("e-2", false)] {
        let headers = tagged(id);
        if odd {
            add_raw_header(&headers, b"odd-\xff-name", b"value");
        }
        let record = FutureRecord::<(), _>::to(&topic.name)
            .payload(&b"{}"[..])
            .headers(headers);
        let sent = producer.send(record, Duration::from_secs(10)).await;
        sent.map_err(|(e, _)| e).expect("publish");
    }
    let mut source = topic.source();

    let mut ids = Vec::new();
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(30), source.next());
        let delivery = next.await.expect("a delivery in time").expect("read");
        let delivery = delivery.expect("the source goes on");
        ids.push(delivery.envelope().id().to_owned());
        let kept = delivery
            .envelope()
            .headers()
            .keys()
            .any(|name| name.starts_with("odd"));
        assert!(!kept, "{:?}", delivery.envelope());
    }

    assert_eq!(ids, ["e-1", "e-2"]);
}

/// Adds a header to `headers` through librdkafka, whose names are bytes (rdkafka's own `insert`
/// takes only text).
fn add_raw_header(
    headers: &inbox::kafka::rdkafka::message::OwnedHeaders,
    name: &[u8],
    value: &[u8],
) {
    use inbox::kafka::rdkafka::bindings::{rd_kafka_header_add, rd_kafka_headers_t};
    use inbox::kafka::rdkafka::message::BorrowedHeaders;

    // A borrowed view of headers is, by rdkafka's own construction, the native list itself.
    let native = std::ptr::from_ref::<BorrowedHeaders>(headers.as_borrowed()).cast_mut();
    let native = native.cast::<rd_kafka_headers_t>();
    let (name_size, value_size) = (name.len() as isize, value.len() as isize);
    // SAFETY: `native` is the live list `headers` owns; librdkafka copies name and value.
    unsafe {
        rd_kafka_header_add(
            native,
            name.as_ptr().cast(),
            name_size,
            value.as_ptr().cast(),
            value_size,
        );
    }
}
