//! The quickstart's ledger over RabbitMQ: payments published to a queue (shuffled, with
//! duplicates), consumed with manual acks into an inbox on SQLite, and checked.
//!
//! Needs a RabbitMQ server: `cargo run --features amqp --example rabbitmq`
//! (`AMQP_URL`, by default `amqp://guest:guest@127.0.0.1:5672/%2f`).

#[path = "broker/ledger.rs"]
mod ledger;

use std::error::Error;

use inbox::amqp::lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use inbox::amqp::lapin::types::FieldTable;
use inbox::amqp::{AmqpConnection, AmqpPublisher, AmqpSource};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let connection = AmqpConnection::connect(&url).await?;
    let channel = connection.current().await?.create_channel().await?;
    let queue = format!("payments-{}", std::process::id());
    let options = QueueDeclareOptions::default();
    channel
        .queue_declare(queue.as_str().into(), options, FieldTable::default())
        .await?;

    let source = AmqpSource::builder(&connection, &queue).build().await?;
    let publisher = AmqpPublisher::new(connection.clone(), "").await?;
    let verdict = ledger::run("RabbitMQ", &publisher, &queue, source).await;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    verdict
}
