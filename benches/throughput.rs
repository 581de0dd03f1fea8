//! Throughput: messages per second through `Inbox::run` over an in-memory broker, one message
//! per transaction against batched mode (10, 100 and 1000 per transaction); the same deliveries
//! through `process()` called from as many tasks as the runtime has workers; and, on PostgreSQL
//! when `pgbench` is installed, the guard's per-message SQL run by pgbench
//! (`benches/pgbench/guard.sql`). For 1, 4 and 16 workers over 200 and 20,000 aggregates, with
//! 30% duplicate deliveries. Prints first how long one handler statement takes there and back in
//! a transaction (a batch's new message costs at least that), then msg/s and three ratios, each
//! measured in the same rounds (rounds interleave the modes, so the machine's drift cancels out
//! of the ratios): batched(100) / one per transaction, one per transaction / pgbench, and the
//! runtime / `process()`.
//!
//! `cargo bench --bench throughput` runs on a SQLite file; `DATABASE_URL=postgres://...` adds
//! PostgreSQL, and `MYSQL_URL=mysql://...` with `--features mysql` adds MySQL.
//! `BENCH_WORKERS=1,16`, `BENCH_AGGREGATES=200` and `BENCH_ROUNDS=3` narrow or widen the runs;
//! `BENCH_MESSAGES=20000` lengthens each run (batches of 1000 then fill every worker many times).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use inbox::Backend;
use inbox::prelude::*;
use sqlx::{Pool, Postgres};

mod ledger;
mod runtime;

use ledger::{Credited, credit_postgres, credit_sqlite};
use runtime::Setup;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Distinct messages per measured run, unless `BENCH_MESSAGES` says otherwise.
const MESSAGES: usize = 4_000;
/// The share of deliveries that are copies of an earlier one.
const DUPLICATE_SHARE: f64 = 0.3;
/// The most accounts a workload credits.
const ACCOUNTS: usize = 20_000;
/// The batch sizes measured, besides one message per transaction.
const BATCHES: [usize; 3] = [10, 100, 1000];

/// How one run handles the deliveries.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// `Inbox::run`, one message per transaction (`None`) or batched.
    Runtime(Option<usize>),
    /// `process()` from as many tasks as workers.
    Process,
    /// pgbench running the guard's SQL.
    Pgbench,
}

/// What is measured, and how often.
struct Plan {
    messages: usize,
    aggregates: Vec<usize>,
    workers: Vec<usize>,
    rounds: usize,
}

impl Plan {
    /// The full plan, narrowed by `BENCH_AGGREGATES`, `BENCH_WORKERS` and `BENCH_ROUNDS`, its
    /// runs lengthened by `BENCH_MESSAGES`.
    fn from_env() -> Self {
        let list = |name: &str, default: Vec<usize>| match std::env::var(name) {
            Ok(values) => values
                .split(',')
                .filter_map(|v| v.trim().parse().ok())
                .collect(),
            Err(_) => default,
        };
        Self {
            messages: list("BENCH_MESSAGES", vec![MESSAGES])
                .first()
                .copied()
                .unwrap_or(MESSAGES),
            aggregates: list("BENCH_AGGREGATES", vec![200, ACCOUNTS]),
            workers: list("BENCH_WORKERS", vec![1, 4, 16]),
            rounds: list("BENCH_ROUNDS", vec![2]).first().copied().unwrap_or(2),
        }
    }
}

/// `messages` events round-robin over `aggregates` accounts, each account's in sequence order,
/// delivered with 30% duplicates (each copy right behind a random earlier delivery).
fn deliveries(messages: usize, aggregates: usize) -> Vec<Envelope> {
    let events: Vec<Credited> = (0..messages)
        .map(|i| Credited {
            event_id: Uuid::new_v4(),
            account: format!("acct-{}", i % aggregates),
            sequence: (i / aggregates) as i64 + 1,
            amount: 1,
        })
        .collect();
    let copies = (messages as f64 * DUPLICATE_SHARE / (1.0 - DUPLICATE_SHARE)) as usize;
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

/// `ledger::CREDIT` in MySQL's placeholders.
#[cfg(feature = "mysql")]
const CREDIT_MYSQL: &str = "UPDATE accounts SET balance = balance + ? WHERE id = ?";

/// The ledger's handler on MySQL.
#[cfg(feature = "mysql")]
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "account",
    name = "credit"
)]
async fn credit_mysql(tx: &mut sqlx::MySqlConnection, msg: Credited) -> Result<(), HandlerError> {
    let credit = sqlx::query(CREDIT_MYSQL).bind(msg.amount).bind(msg.account);
    credit.execute(&mut *tx).await?;
    Ok(())
}

/// Runs `deliveries` through `Inbox::run` for a new consumer group; returns deliveries per second.
async fn runtime<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = Credited>,
    deliveries: &[Envelope],
    workers: usize,
    batch: Option<usize>,
) -> Result<f64, Failure> {
    let setup = Setup {
        consumer: format!("bench-{}", Uuid::new_v4()),
        workers,
        batch,
    };
    let (report, rate) = runtime::run(pool, handler, deliveries, setup).await?;
    assert_eq!(report.handler_calls_with(Outcome::Stale), 0, "{report:?}");
    Ok(rate)
}

/// Runs `deliveries` through `process()` from `workers` tasks taking them in order from one
/// queue, after clearing what `process()` recorded before; returns deliveries per second.
async fn process<DB: Backend, H>(
    pool: &Pool<DB>,
    handler: H,
    deliveries: &[Envelope],
    workers: usize,
) -> Result<f64, Failure>
where
    H: Handler<DB, Message = Credited> + Copy + 'static,
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    forget(pool, inbox::DEFAULT_CONSUMER).await?;
    let queue: VecDeque<Credited> = deliveries
        .iter()
        .map(|delivery| delivery.decode::<Credited>())
        .collect::<Result<_, _>>()?;
    let queue = Arc::new(Mutex::new(queue));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, queue) = (pool.clone(), Arc::clone(&queue));
            tokio::spawn(async move {
                loop {
                    let next = queue.lock().expect("queue").pop_front();
                    let Some(message) = next else {
                        return Ok::<_, Failure>(());
                    };
                    handler.process(&pool, message).await?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(deliveries.len() as f64 / started.elapsed().as_secs_f64())
}

/// Runs `transactions` deliveries of the guard's SQL through pgbench with `workers` clients;
/// returns its transactions (deliveries) per second, or `None` when pgbench is not installed.
async fn pgbench(
    url: &str,
    aggregates: usize,
    workers: usize,
    transactions: usize,
) -> Result<Option<f64>, Failure> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/pgbench/guard.sql");
    let output = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-f", script])
        .args(["-D", &format!("aggregates={aggregates}")])
        .args([
            "-c",
            &workers.to_string(),
            "-j",
            &workers.min(2).to_string(),
        ])
        .args(["-t", &(transactions / workers).to_string(), url])
        .output()
        .await;
    let output = match output {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let tps = text
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok());
    match tps {
        Some(tps) => Ok(Some(tps)),
        None => Err(format!(
            "pgbench failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into()),
    }
}

/// One database to measure: its pool, its handler and the handler's statement, and its URL for
/// pgbench (PostgreSQL only).
struct Target<DB: Backend, H> {
    name: &'static str,
    pool: Pool<DB>,
    handler: H,
    credit: &'static str,
    pgbench_url: Option<String>,
}

impl<DB: Backend, H> Target<DB, H>
where
    H: Handler<DB, Message = Credited> + Copy + 'static,
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    async fn measure(
        &self,
        mode: Mode,
        aggregates: usize,
        work: &[Envelope],
        workers: usize,
    ) -> Result<Option<f64>, Failure> {
        let (pool, handler) = (&self.pool, self.handler);
        match (mode, &self.pgbench_url) {
            (Mode::Runtime(batch), _) => {
                Ok(Some(runtime(pool, handler, work, workers, batch).await?))
            }
            (Mode::Process, _) => Ok(Some(process(pool, handler, work, workers).await?)),
            (Mode::Pgbench, Some(url)) => pgbench(url, aggregates, workers, work.len()).await,
            (Mode::Pgbench, None) => Ok(None),
        }
    }

    /// One table: for each aggregate count and worker count, msg/s per mode and the ratios.
    async fn table(&self, plan: &Plan) -> Result<(), Failure> {
        let modes: Vec<Mode> = [Mode::Runtime(None)]
            .into_iter()
            .chain(BATCHES.map(|size| Mode::Runtime(Some(size))))
            .chain([Mode::Process, Mode::Pgbench])
            .collect();
        println!(
            "{}: one handler statement's round trip {:.1} µs",
            self.name,
            round_trip(&self.pool, self.credit).await?
        );
        println!(
            "{}: {} messages + 30% duplicates, msg/s (median of {} rounds)",
            self.name, plan.messages, plan.rounds
        );
        println!(
            "  {:>10} {:>7} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}   {:>9} {:>11} {:>11}",
            "aggregates",
            "workers",
            "1 per tx",
            "batch 10",
            "batch 100",
            "batch 1000",
            "process()",
            "pgbench",
            "b100 / 1",
            "1 / pgbench",
            "1 / process"
        );
        for &aggregates in &plan.aggregates {
            let work = deliveries(plan.messages, aggregates);
            for &workers in &plan.workers {
                let mut rates = vec![Vec::new(); modes.len()];
                for _ in 0..plan.rounds {
                    for (at, mode) in modes.iter().enumerate() {
                        rates[at].extend(self.measure(*mode, aggregates, &work, workers).await?);
                    }
                }
                let m: Vec<Option<f64>> = rates.iter_mut().map(|r| median(r)).collect();
                let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) => format!("{:.2}x", a / b),
                    _ => "-".to_owned(),
                };
                let rate = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.0}"));
                println!(
                    "  {aggregates:>10} {workers:>7} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}   {:>9} {:>11} {:>11}",
                    rate(m[0]),
                    rate(m[1]),
                    rate(m[2]),
                    rate(m[3]),
                    rate(m[4]),
                    rate(m[5]),
                    ratio(m[2], m[0]),
                    ratio(m[0], m[5]),
                    ratio(m[0], m[4])
                );
            }
        }
        Ok(())
    }
}

/// Deletes what `consumer` recorded for handler `credit`, so that its next run finds nothing seen.
async fn forget<DB: Backend>(pool: &Pool<DB>, consumer: &str) -> Result<(), Failure>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    for table in ["inbox_messages", "inbox_streams"] {
        let delete =
            format!("DELETE FROM {table} WHERE consumer = '{consumer}' AND handler = 'credit'");
        sqlx::raw_sql(sqlx::AssertSqlSafe(delete))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The message whose copies the pgbench script delivers as duplicates.
async fn seen_by_pgbench(pool: &Pool<Postgres>) -> Result<(), Failure> {
    forget(pool, "pgbench").await?;
    sqlx::raw_sql(
        "INSERT INTO inbox_messages (consumer, handler, message_id, message_type, status, payload_hash) \
         VALUES ('pgbench', 'credit', 'seen', 'Credited', 'processed', '\\x00')",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The time one handler statement (`credit`) takes in a transaction, there and back, in µs: a
/// batch's new message costs at least this.
async fn round_trip<DB: Backend>(pool: &Pool<DB>, credit: &'static str) -> Result<f64, Failure>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    const STATEMENTS: u32 = 5_000;
    let mut tx = pool.begin().await?;
    let started = Instant::now();
    for n in 0..STATEMENTS {
        let credit = sqlx::query(credit)
            .bind(0_i64)
            .bind(format!("acct-{}", n % 200));
        credit.execute(&mut *tx).await?;
    }
    let took = started.elapsed();
    tx.rollback().await?;
    Ok(took.as_secs_f64() * 1e6 / f64::from(STATEMENTS))
}

/// The MySQL database `MYSQL_URL` names, on a pool of up to `connections`, or `None` (printed
/// as skipped) when it is not set.
#[cfg(feature = "mysql")]
async fn mysql_from_env(connections: u32) -> Result<Option<Pool<sqlx::MySql>>, Failure> {
    match std::env::var("MYSQL_URL") {
        Ok(url) => {
            let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(connections);
            Ok(Some(pool.connect(&url).await?))
        }
        Err(_) => {
            println!(
                "MySQL: skipped (set MYSQL_URL=mysql://... and --features mysql to measure it)"
            );
            Ok(None)
        }
    }
}

fn median(rates: &mut [f64]) -> Option<f64> {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let plan = Plan::from_env();
    let sqlite = ledger::fresh_sqlite("inbox_bench_throughput.db").await?;
    ledger::prepare(&sqlite, ACCOUNTS).await?;
    let target = Target {
        name: "SQLite (WAL, synchronous = FULL)",
        pool: sqlite,
        handler: credit_sqlite,
        credit: ledger::CREDIT,
        pgbench_url: None,
    };
    target.table(&plan).await?;

    if let Some((postgres, url)) = ledger::postgres_from_env(24).await? {
        ledger::prepare(&postgres, ACCOUNTS).await?;
        seen_by_pgbench(&postgres).await?;
        let target = Target {
            name: "PostgreSQL",
            pool: postgres,
            handler: credit_postgres,
            credit: ledger::CREDIT,
            pgbench_url: Some(url),
        };
        target.table(&plan).await?;
        forget(&target.pool, "pgbench").await?;
    }

    #[cfg(feature = "mysql")]
    if let Some(mysql) = mysql_from_env(24).await? {
        ledger::prepare(&mysql, ACCOUNTS).await?;
        let target = Target {
            name: "MySQL",
            pool: mysql,
            handler: credit_mysql,
            credit: CREDIT_MYSQL,
            pgbench_url: None,
        };
        target.table(&plan).await?;
    }
    Ok(())
}
