//! A replay: a topic read again from its start after retention purged its dedup rows, so that
//! every message is stale (its stream is past it) and no handler runs. Messages per second
//! through `Inbox::run`, one per transaction against batches of 100, with 1 and 4 workers over
//! 200 aggregates; rounds interleave the two, and the ratio is taken round by round.
//!
//! `cargo bench --bench replay` runs on a SQLite file; `DATABASE_URL=postgres://...` adds
//! PostgreSQL.

use inbox::Backend;
use inbox::prelude::*;
use sqlx::Pool;

mod ledger;
mod runtime;

use ledger::{Credited, credit_postgres, credit_sqlite};
use runtime::Setup;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Messages replayed per run.
const MESSAGES: usize = 4_000;
/// Aggregates the messages are spread over, each in sequence order.
const AGGREGATES: usize = 200;
const WORKERS: [usize; 2] = [1, 4];
const ROUNDS: usize = 3;
/// The consumer that applied the messages, and replays them.
const CONSUMER: &str = "replayed";

/// The topic: each aggregate's messages in sequence order, the aggregates interleaved.
fn topic() -> Vec<Envelope> {
    let event = |i: usize| Credited {
        event_id: Uuid::new_v4(),
        account: format!("acct-{}", i % AGGREGATES),
        sequence: (i / AGGREGATES) as i64 + 1,
        amount: 1,
    };
    let envelope = |i: usize| Envelope::encode(format!("delivery-{i}"), &event(i));
    let encoded = (0..MESSAGES).map(envelope);
    encoded.collect::<Result<_, _>>().expect("encode")
}

/// [`CONSUMER`] with `workers` workers, batched or not.
fn setup(workers: usize, batch: Option<usize>) -> Setup {
    Setup {
        consumer: CONSUMER.into(),
        workers,
        batch,
    }
}

/// Purges the consumer's dedup rows (its streams stay), then replays `topic` as `setup` says:
/// every message stale. Returns messages per second.
async fn replay<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = Credited>,
    topic: &[Envelope],
    setup: Setup,
) -> Result<f64, Failure>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    sqlx::raw_sql("DELETE FROM inbox_messages WHERE handler = 'credit'")
        .execute(pool)
        .await?;
    let (report, rate) = runtime::run(pool, handler, topic, setup).await?;
    assert_eq!(
        report.handler_calls_with(Outcome::Stale),
        topic.len() as u64,
        "{report:?}"
    );
    Ok(rate)
}

fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Applies the topic once, then measures its replays on `pool` and prints a line per worker
/// count.
async fn measure<DB: Backend, H: Handler<DB, Message = Credited> + Copy>(
    name: &str,
    pool: &Pool<DB>,
    handler: H,
) -> Result<(), Failure>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    ledger::prepare(pool, AGGREGATES).await?;
    let topic = topic();
    runtime::run(pool, handler, &topic, setup(1, Some(100))).await?;
    for workers in WORKERS {
        let (mut single, mut batched, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let one = replay(pool, handler, &topic, setup(workers, None)).await?;
            let hundred = replay(pool, handler, &topic, setup(workers, Some(100))).await?;
            single.push(one);
            batched.push(hundred);
            ratios.push(hundred / one);
        }
        println!(
            "{name}, {workers} worker(s): 1 per tx {:.0} msg/s, batch 100 {:.0} msg/s, \
             batch 100 / 1 per tx {:.2}x",
            median(&mut single),
            median(&mut batched),
            median(&mut ratios)
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let sqlite = ledger::fresh_sqlite("inbox_bench_replay.db").await?;
    measure("SQLite (WAL, synchronous = FULL)", &sqlite, credit_sqlite).await?;

    if let Some((postgres, _)) = ledger::postgres_from_env(8).await? {
        measure("PostgreSQL", &postgres, credit_postgres).await?;
    }
    Ok(())
}
