//! The quickstart's ledger over Kafka: payments published to a topic of three partitions
//! (shuffled, with duplicates, keyed by their order so that an order stays on one partition),
//! consumed by a member of a consumer group into an inbox on SQLite, and checked.
//!
//! Needs a Kafka broker: `cargo run --features kafka --example kafka`
//! (`KAFKA_BROKERS`, the bootstrap servers, by default `127.0.0.1:9092`).

#[path = "broker/ledger.rs"]
mod ledger;

use std::error::Error;

use inbox::kafka::rdkafka::ClientConfig;
use inbox::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use inbox::kafka::{KafkaPublisher, KafkaSource};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &brokers);
    let topic = format!("payments-{}", std::process::id());
    let admin: AdminClient<_> = config.create()?;
    let new_topic = NewTopic::new(&topic, 3, TopicReplication::Fixed(1));
    for created in admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await?
    {
        created.map_err(|(topic, error)| format!("cannot create topic {topic}: {error}"))?;
    }

    let published = KafkaPublisher::new(&config)?;
    config.set("group.id", "ledger");
    let source = KafkaSource::builder(&config, &[&topic]).build()?;
    let verdict = ledger::run("Kafka", &published, &topic, source).await;
    admin.delete_topics(&[&topic], &AdminOptions::new()).await?;
    verdict
}
