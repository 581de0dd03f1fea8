//! The quickstart's ledger over NATS JetStream: payments published to a stream (shuffled, with
//! duplicates), consumed by a durable pull consumer into an inbox on SQLite, and checked.
//!
//! Needs a NATS server with JetStream: `cargo run --features nats --example nats`
//! (`NATS_URL`, by default `nats://127.0.0.1:4222`).

#[path = "broker/ledger.rs"]
mod ledger;

use std::error::Error;

use inbox::nats::async_nats::jetstream::{self, stream};
use inbox::nats::{JetStreamPublisher, JetStreamSource, async_nats};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let context = jetstream::new(async_nats::connect(&url).await?);
    let name = format!("PAYMENTS_{}", std::process::id());
    let config = stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    };
    context.create_stream(config).await?;

    let source = JetStreamSource::builder(&context, &name, "ledger")
        .build()
        .await?;
    let published = JetStreamPublisher::new(&context);
    let verdict = ledger::run("JetStream", &published, &format!("{name}.payments"), source).await;
    context.delete_stream(&name).await?;
    verdict
}
