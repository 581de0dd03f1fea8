//! Throughput of the runtime: messages per second through `Inbox::run` over an in-memory broker,
//! one message per transaction against batched mode (10, 100 and 1000 per transaction), for 1, 4
//! and 16 workers, over 200 and 20,000 aggregates, with 30% duplicate deliveries. Prints figures
//! and the ratio batched / one per transaction measured in the same round; rounds interleave the
//! modes, so the machine's drift cancels out of the ratios.
//!
//! `cargo bench --bench throughput` runs on a SQLite file; `DATABASE_URL=postgres://...` adds
//! PostgreSQL.

use std::time::Instant;

use inbox::prelude::*;
use inbox::{Backend, Batch, MemoryBroker};
use sqlx::{Pool, Postgres};

mod ledger;

use ledger::{Credited, credit_postgres, credit_sqlite};

/// Distinct messages per measured run.
const MESSAGES: usize = 4_000;
/// The share of deliveries that are copies of an earlier one.
const DUPLICATE_SHARE: f64 = 0.3;
/// The most accounts a workload credits.
const ACCOUNTS: usize = 20_000;
const ROUNDS: usize = 2;

/// `MESSAGES` events round-robin over `aggregates` accounts, each account's in sequence order,
/// delivered with 30% duplicates (each copy right behind a random earlier delivery).
fn deliveries(aggregates: usize) -> Vec<Envelope> {
    let events: Vec<Credited> = (0..MESSAGES)
        .map(|i| Credited {
            event_id: Uuid::new_v4(),
            account: format!("acct-{}", i % aggregates),
            sequence: (i / aggregates) as i64 + 1,
            amount: 1,
        })
        .collect();
    let copies = (MESSAGES as f64 * DUPLICATE_SHARE / (1.0 - DUPLICATE_SHARE)) as usize;
    let mut stream: Vec<&Credited> = events.iter().collect();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..copies {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let at = (state % stream.len() as u64) as usize;
        stream.insert(at + 1, stream[at]);
    }
    let envelope = |(n, event): (usize, &&Credited)| Envelope::encode(format!("d-{n}"), *event);
    let encoded = stream.iter().enumerate().map(envelope);
    encoded.collect::<Result<_, _>>().expect("encode")
}

/// Runs `deliveries` through a new consumer group and returns messages (deliveries) per second.
async fn measure<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = Credited>,
    deliveries: &[Envelope],
    workers: usize,
    batch: Option<usize>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    for delivery in deliveries {
        broker.publish(delivery.clone());
    }
    broker.close();
    let consumer = format!("bench-{}", Uuid::new_v4());
    let builder = Inbox::builder(pool.clone())
        .consumer(consumer)
        .workers(workers);
    let builder = match batch {
        Some(size) => builder.batch(Batch::new(size)),
        None => builder,
    };
    let inbox = builder.handler(handler).build().await?;
    let started = Instant::now();
    let report = inbox.run(broker.source()).await?;
    let elapsed = started.elapsed();
    assert_eq!(report.acked, deliveries.len() as u64, "{report:?}");
    assert_eq!(report.count(Outcome::Stale), 0, "{report:?}");
    Ok(deliveries.len() as f64 / elapsed.as_secs_f64())
}

/// One table: for each aggregate count and worker count, msg/s per mode and the ratios.
async fn table<DB: Backend, H>(
    name: &str,
    pool: &Pool<DB>,
    handler: H,
) -> Result<(), Box<dyn std::error::Error>>
where
    H: Handler<DB, Message = Credited> + Copy,
{
    const MODES: [Option<usize>; 4] = [None, Some(10), Some(100), Some(1000)];
    println!("{name}: {MESSAGES} messages + 30% duplicates, msg/s (median of {ROUNDS} rounds)");
    println!(
        "  {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}   batched(100) / one per tx",
        "aggregates", "workers", "1 per tx", "batch 10", "batch 100", "batch 1000"
    );
    for aggregates in [200, ACCOUNTS] {
        let deliveries = deliveries(aggregates);
        for workers in [1, 4, 16] {
            let mut rates = vec![Vec::new(); MODES.len()];
            for _ in 0..ROUNDS {
                for (mode, batch) in MODES.iter().enumerate() {
                    let rate = measure(pool, handler, &deliveries, workers, *batch).await?;
                    rates[mode].push(rate);
                }
            }
            let medians: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
            println!(
                "  {aggregates:>10} {workers:>7} {:>10.0} {:>10.0} {:>10.0} {:>10.0}   {:.2}x",
                medians[0],
                medians[1],
                medians[2],
                medians[3],
                medians[2] / medians[0]
            );
        }
    }
    Ok(())
}

fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sqlite = ledger::fresh_sqlite("inbox_bench_throughput.db").await?;
    ledger::prepare(&sqlite, ACCOUNTS).await?;
    table("SQLite (WAL, synchronous = FULL)", &sqlite, credit_sqlite).await?;

    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            let postgres: Pool<Postgres> = sqlx::postgres::PgPoolOptions::new()
                .max_connections(24)
                .connect(&url)
                .await?;
            ledger::prepare(&postgres, ACCOUNTS).await?;
            table("PostgreSQL", &postgres, credit_postgres).await?;
        }
        _ => println!("PostgreSQL: skipped (set DATABASE_URL=postgres://... to measure it)"),
    }
    Ok(())
}
