//! What the runtime benchmarks share: deliveries run through `Inbox::run` over an in-memory
//! broker, timed.

use std::time::Instant;

use inbox::prelude::*;
use inbox::{Backend, Batch, MemoryBroker, RunReport};
use sqlx::Pool;

use crate::ledger::Credited;

/// How `Inbox::run` takes the deliveries: for which consumer, with how many workers, and one
/// message per transaction (`batch: None`) or batched.
pub struct Setup {
    pub consumer: String,
    pub workers: usize,
    pub batch: Option<usize>,
}

/// Runs `deliveries` through `Inbox::run` with `handler` as `setup` says; returns its report and
/// the deliveries per second. Every delivery is acked.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = Credited>,
    deliveries: &[Envelope],
    setup: Setup,
) -> Result<(RunReport, f64), Box<dyn std::error::Error + Send + Sync>> {
    let broker = MemoryBroker::new();
    for delivery in deliveries {
        broker.publish(delivery.clone());
    }
    broker.close();
    let builder = Inbox::builder(pool.clone())
        .consumer(setup.consumer)
        .workers(setup.workers);
    let builder = match setup.batch {
        Some(size) => builder.batch(Batch::new(size)),
        None => builder,
    };
    let inbox = builder.handler(handler).build().await?;
    let started = Instant::now();
    let report = inbox.run(broker.source()).await?;
    let rate = deliveries.len() as f64 / started.elapsed().as_secs_f64();
    assert_eq!(report.acked, deliveries.len() as u64, "{report:?}");
    Ok((report, rate))
}
