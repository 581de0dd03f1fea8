//! Metrics for Prometheus: the inbox reports through the `metrics` facade, and this program wires
//! the Prometheus exporter to it, runs a little traffic through an inbox, and prints the scrape.
//!
//! A payments consumer receives `PaymentCaptured` events: most are new, one is delivered twice, one
//! arrives after a newer event of its order (stale), one cannot be decoded (rejected) and one fails
//! for good (dead). Then a retention purge runs. Run it with
//! `cargo run --example prometheus` (embedded SQLite, nothing to install). In a service, serve
//! the same text on `/metrics` (the exporter's `http-listener` feature does it for you).

use std::error::Error;
use std::time::{Duration, SystemTime};

use inbox::prelude::*;
use inbox::{MemoryBroker, Retention, RetryPolicy};
use metrics_exporter_prometheus::PrometheusBuilder;
use sqlx::sqlite::SqlitePoolOptions;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "payments.captured")]
struct PaymentCaptured {
    event_id: String,
    order_id: String,
    sequence: i64,
    amount: i64,
}

/// Records the capture; an amount of zero is refused for good, so that message ends dead.
#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn record_capture(
    tx: &mut sqlx::SqliteConnection,
    event: PaymentCaptured,
) -> Result<(), HandlerError> {
    if event.amount == 0 {
        let refused = HandlerError::msg("a capture of zero is not a capture");
        return Err(HandlerError::permanent(refused));
    }
    sqlx::query("INSERT INTO captures (event_id, amount) VALUES ($1, $2)")
        .bind(&event.event_id)
        .bind(event.amount)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let scrape = PrometheusBuilder::new().install_recorder()?;
    // The database lives in memory, on the one connection of the pool.
    let memory = inbox::sqlite_options("sqlite::memory:")?;
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(memory)
        .await?;
    inbox::migrate(&pool).await?;
    sqlx::query("CREATE TABLE captures (event_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let inbox = Inbox::builder(pool.clone())
        .consumer("payments")
        .retry(RetryPolicy::new(2).backoff(Duration::from_millis(5), Duration::from_millis(5)))
        .retention(Retention::new(Duration::from_secs(7 * 24 * 3600)))
        .handler(record_capture)
        .build()
        .await?;

    let broker = MemoryBroker::new();
    publish_traffic(&broker)?;
    let report = inbox.run(broker.source()).await?;
    println!("handled: {:?}\n", report.handler_outcomes);
    inbox.purge().await?;

    println!("# GET /metrics\n{}", scrape.render());
    Ok(())
}

/// Seven deliveries, six saying when it was published (one second ago), for the lag histogram.
fn publish_traffic(broker: &MemoryBroker) -> Result<(), Box<dyn Error>> {
    let published = SystemTime::now() - Duration::from_secs(1);
    let captures = [
        ("e-1", "o-1", 1, 100),
        ("e-2", "o-2", 1, 250),
        ("e-2", "o-2", 1, 250), // redelivered: a duplicate
        ("e-4", "o-1", 3, 70),
        ("e-3", "o-1", 2, 30), // older than e-4 of the same order: stale
        ("e-5", "o-3", 1, 0),  // refused for good: dead
    ];
    for (n, (event_id, order_id, sequence, amount)) in captures.into_iter().enumerate() {
        let event = PaymentCaptured {
            event_id: event_id.into(),
            order_id: order_id.into(),
            sequence,
            amount,
        };
        let envelope = Envelope::encode(format!("d-{n}"), &event)?;
        broker.publish(envelope.with_produced_at(published));
    }
    let garbled = Envelope::new("payments.captured", "d-9", b"{\"event_id\":".to_vec());
    broker.publish(garbled); // cannot be decoded: rejected, kept with its bytes
    broker.close();
    Ok(())
}
