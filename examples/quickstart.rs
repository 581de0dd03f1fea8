//! Quickstart: an orders ledger fed by an at-least-once broker.
//!
//! A payment service emits `PaymentReceived` events, numbered 1, 2, 3, ... per order; our ledger
//! credits each order's balance. The broker delivers *at least once*: it re-sends events, and it
//! does not keep them in order. The handler is a plain `async fn` with one SQL statement;
//! `#[inbox_handler]` runs it in a transaction that also records the event id (a re-sent event is
//! a `Duplicate`: nothing runs) and guards the order's sequence.
//!
//! Three passes deliver the same events, each with >30% duplicate deliveries:
//!   1. shuffled, monotonic ordering (the default): an event not newer than the last one applied to
//!      its order is skipped as `Stale`, so the ledger is the sum of what the inbox recorded as
//!      processed, not of every payment;
//!   2. in order per order, monotonic: duplicates only, the ledger is the plain sum of all payments;
//!   3. shuffled, strict ordering: an event ahead of its order's next sequence is `Parked` and
//!      applied (`Released`) once its predecessors have, so the ledger is again the plain sum, each
//!      payment applied exactly once, and nothing is left parked.
//!
//! Each pass is checked against a replay of the guard's rules over its delivery stream.
//!
//! Choosing: monotonic when only the latest event matters (a status, a snapshot); strict when every
//! event must apply, in order (credits, counters), and sequences are contiguous from 1.
//!
//! `cargo run --example quickstart` uses an embedded SQLite file; on PostgreSQL:
//! `DATABASE_URL=postgres://user@host/db cargo run --example quickstart`; on MySQL or MariaDB:
//! `DATABASE_URL=mysql://user@host/db cargo run --features mysql --example quickstart`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;

use inbox::prelude::*;
use inbox::{Backend, MemoryBroker};
#[cfg(feature = "mysql")]
use sqlx::MySqlConnection;
use sqlx::{PgConnection, Pool, SqliteConnection};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "payment.received")]
struct PaymentReceived {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

/// The statements this example runs itself, as one database spells them.
struct LedgerSql {
    /// The business write: credit the order (creating its row on its first payment). `credits`
    /// counts applied payments, so a payment applied twice would show.
    credit: &'static str,
    /// Each pass starts clean: this consumer's inbox rows are deleted.
    forget: [&'static str; 2],
    /// Afterwards, the database's own record: the inbox's verdict per event.
    records: &'static str,
}

/// PostgreSQL's spelling, which SQLite reads too.
const STANDARD_SQL: LedgerSql = LedgerSql {
    credit: "INSERT INTO quickstart_ledger (order_id, balance, credits) VALUES ($1, $2, 1) \
        ON CONFLICT (order_id) DO UPDATE SET balance = quickstart_ledger.balance + excluded.balance, \
        credits = quickstart_ledger.credits + 1",
    forget: [
        "DELETE FROM inbox_messages WHERE consumer = $1",
        "DELETE FROM inbox_streams WHERE consumer = $1",
    ],
    records: "SELECT message_id, status FROM inbox_messages WHERE consumer = $1 AND handler = $2",
};

/// MySQL's and MariaDB's spelling: `?` placeholders, `ON DUPLICATE KEY UPDATE`.
#[cfg(feature = "mysql")]
const MYSQL_SQL: LedgerSql = LedgerSql {
    credit: "INSERT INTO quickstart_ledger (order_id, balance, credits) VALUES (?, ?, 1) \
        ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), credits = credits + 1",
    forget: [
        "DELETE FROM inbox_messages WHERE consumer = ?",
        "DELETE FROM inbox_streams WHERE consumer = ?",
    ],
    records: "SELECT message_id, status FROM inbox_messages WHERE consumer = ? AND handler = ?",
};

// The first parameter names the database, hence one thin handler per backend and ordering. The
// `name`, not the function's, is the dedup scope: "ledger" for monotonic, "ledger_strict" for
// strict, so that the two orderings never share a scope or a stream.
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_sqlite(tx: &mut SqliteConnection, p: PaymentReceived) -> Result<(), HandlerError> {
    let credit = sqlx::query(STANDARD_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_postgres(tx: &mut PgConnection, p: PaymentReceived) -> Result<(), HandlerError> {
    let credit = sqlx::query(STANDARD_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    ordering = "strict",
    name = "ledger_strict"
)]
async fn credit_sqlite_strict(
    tx: &mut SqliteConnection,
    p: PaymentReceived,
) -> Result<(), HandlerError> {
    let credit = sqlx::query(STANDARD_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    ordering = "strict",
    name = "ledger_strict"
)]
async fn credit_postgres_strict(
    tx: &mut PgConnection,
    p: PaymentReceived,
) -> Result<(), HandlerError> {
    let credit = sqlx::query(STANDARD_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[cfg(feature = "mysql")]
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_mysql(tx: &mut MySqlConnection, p: PaymentReceived) -> Result<(), HandlerError> {
    let credit = sqlx::query(MYSQL_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

#[cfg(feature = "mysql")]
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    ordering = "strict",
    name = "ledger_strict"
)]
async fn credit_mysql_strict(
    tx: &mut MySqlConnection,
    p: PaymentReceived,
) -> Result<(), HandlerError> {
    let credit = sqlx::query(MYSQL_SQL.credit)
        .bind(p.order_id)
        .bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

/// One backend's handlers, one per ordering, and the example's own statements.
#[derive(Clone, Copy)]
struct Handlers<M, S> {
    monotonic: M,
    strict: S,
    sql: &'static LedgerSql,
}

/// The guard's rules: which handler a pass uses, and what the replay expects of it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    Monotonic,
    Strict,
}

/// One pass over the events.
struct Pass {
    title: &'static str,
    /// Every order's deliveries shuffled, or in sequence order (duplicates either way).
    shuffled: bool,
    rules: Rules,
    /// The ledger must be the plain sum of all payments (else: of those the inbox applied).
    credits_all: bool,
}

const PASSES: [Pass; 3] = [
    Pass {
        title: "shuffled",
        shuffled: true,
        rules: Rules::Monotonic,
        credits_all: false,
    },
    Pass {
        title: "in order",
        shuffled: false,
        rules: Rules::Monotonic,
        credits_all: true,
    },
    Pass {
        title: "shuffled, strict",
        shuffled: true,
        rules: Rules::Strict,
        credits_all: true,
    },
];

const CONSUMER: &str = "quickstart";
const ORDERS: u64 = 150;
// Each pass starts clean: the ledger is recreated (the same words on every database).
const RESET: [&str; 2] = [
    "DROP TABLE IF EXISTS quickstart_ledger",
    "CREATE TABLE quickstart_ledger \
     (order_id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL, credits BIGINT NOT NULL)",
];
// Afterwards, the ledger.
const LEDGER: &str = "SELECT order_id, balance, credits FROM quickstart_ledger";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let events = payments(&mut Rng(2024));
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| fresh_sqlite_file());
    let ok = if url.starts_with("postgres") {
        let handlers = Handlers {
            monotonic: credit_postgres,
            strict: credit_postgres_strict,
            sql: &STANDARD_SQL,
        };
        run(sqlx::PgPool::connect(&url).await?, handlers, &events).await?
    } else if url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect_with(inbox::sqlite_options(&url)?).await?;
        let handlers = Handlers {
            monotonic: credit_sqlite,
            strict: credit_sqlite_strict,
            sql: &STANDARD_SQL,
        };
        run(pool, handlers, &events).await?
    } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        run_mysql(&url, &events).await?
    } else {
        return Err(format!("unsupported DATABASE_URL `{url}`").into());
    };
    std::process::exit(if ok { 0 } else { 1 })
}

/// Runs the passes on MySQL or MariaDB.
#[cfg(feature = "mysql")]
async fn run_mysql(url: &str, events: &[PaymentReceived]) -> Result<bool, Box<dyn Error>> {
    let handlers = Handlers {
        monotonic: credit_mysql,
        strict: credit_mysql_strict,
        sql: &MYSQL_SQL,
    };
    let url = url.replacen("mariadb:", "mysql:", 1);
    run(sqlx::MySqlPool::connect(&url).await?, handlers, events).await
}

/// Without the `mysql` feature, says how to turn it on.
#[cfg(not(feature = "mysql"))]
async fn run_mysql(_: &str, _: &[PaymentReceived]) -> Result<bool, Box<dyn Error>> {
    Err("MySQL needs the `mysql` feature: cargo run --features mysql --example quickstart".into())
}

/// The default database: a SQLite file in the temp directory, deleted so every run starts fresh.
fn fresh_sqlite_file() -> String {
    let path = std::env::temp_dir().join("inbox-quickstart.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    println!("database: {}", path.display());
    format!("sqlite://{}", path.display())
}

/// Runs every pass on one database and prints what happened; `true` if all check out.
async fn run<DB, M, S>(
    pool: Pool<DB>,
    handlers: Handlers<M, S>,
    events: &[PaymentReceived],
) -> Result<bool, Box<dyn Error>>
where
    DB: Backend,
    M: Handler<DB, Message = PaymentReceived> + Copy,
    S: Handler<DB, Message = PaymentReceived> + Copy,
    // What this example's own queries need from sqlx (every backend has it).
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (String, String): for<'r> sqlx::FromRow<'r, DB::Row>,
    (String, i64, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    inbox::migrate(&pool).await?;
    let shuffled = at_least_once(events, &mut Rng(7));
    // Like a partitioned log: each order's deliveries in sequence order, duplicates and all
    // (a stable sort by sequence keeps the orders interleaved).
    let mut in_order = shuffled.clone();
    in_order.sort_by_key(|event| event.sequence);
    let (count, n) = (events.len(), shuffled.len());
    let (duplicates, share) = (n - count, 100 * (n - count) / n);
    println!("{count} payments for {ORDERS} orders, on {}", DB::NAME);
    println!("each pass: {n} deliveries, {duplicates} of them duplicates ({share}%)\n");

    let mut results = Vec::new();
    for pass in &PASSES {
        let stream = if pass.shuffled { &shuffled } else { &in_order };
        for sql in RESET {
            sqlx::query(sql).execute(&pool).await?;
        }
        for sql in handlers.sql.forget {
            sqlx::query(sql).bind(CONSUMER).execute(&pool).await?;
        }
        let delivered = match pass.rules {
            Rules::Monotonic => deliver(&pool, handlers.monotonic, stream).await?,
            Rules::Strict => deliver(&pool, handlers.strict, stream).await?,
        };
        let records = sqlx::query_as(handlers.sql.records)
            .bind(CONSUMER)
            .bind(delivered.handler)
            .fetch_all(&pool)
            .await?;
        let ledger = sqlx::query_as(LEDGER).fetch_all(&pool).await?;
        let verdict = check(pass, events, stream, &delivered, records, ledger);
        results.push((pass, delivered.counts, verdict));
    }

    print_table(&results);
    for (pass, _, verdict) in &results {
        match verdict {
            Ok(summary) => println!("{}: OK, {summary}", pass.title),
            Err(problems) => {
                let problems = problems.join("\n  - ");
                println!("{}: MISMATCH\n  - {problems}", pass.title);
            }
        }
    }
    let ok = results.iter().all(|(_, _, verdict)| verdict.is_ok());
    match ok {
        true => println!("verdict: OK — every payment counted once, the ledger matches"),
        false => println!("verdict: MISMATCH — see above"),
    }
    Ok(ok)
}

/// The outcome table's rows.
const ROWS: [&str; 9] = [
    "deliveries",
    "processed",
    "released",
    "duplicates",
    "stale",
    "parked",
    "conflicts",
    "failed",
    "acked",
];
/// A pass's count for each of [`ROWS`].
type Counts = [u64; ROWS.len()];
/// A pass's check: a summary, or every problem found.
type Verdict = Result<String, Vec<String>>;

/// The count in the row labelled `label`.
fn row(counts: &Counts, label: &str) -> u64 {
    let index = ROWS.iter().position(|row| *row == label);
    counts[index.expect("a row label")]
}

/// The outcome table: a column per pass.
fn print_table(results: &[(&Pass, Counts, Verdict)]) {
    let titles: String = results
        .iter()
        .map(|r| format!("{:>18}", r.0.title))
        .collect();
    println!("{:12}{titles}", "");
    for (i, label) in ROWS.iter().enumerate() {
        let counts: String = results.iter().map(|r| format!("{:>18}", r.1[i])).collect();
        println!("  {label:<10}{counts}");
    }
    println!();
}

/// What one pass's run left: its handler (the dedup scope), its outcome counts, and how many
/// messages are still parked or dead at the end.
struct Delivered {
    handler: &'static str,
    counts: Counts,
    left_over: usize,
}

/// Publishes the stream into an in-memory broker, lets an inbox (default workers) drain it, and
/// counts the outcomes.
async fn deliver<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = PaymentReceived>,
    stream: &[PaymentReceived],
) -> Result<Delivered, Box<dyn Error>> {
    let broker = MemoryBroker::new();
    for (n, event) in stream.iter().enumerate() {
        broker.publish(Envelope::encode(format!("delivery-{n}"), event)?);
    }
    broker.close();
    let name = handler.name();
    let builder = Inbox::builder(pool.clone()).consumer(CONSUMER);
    let inbox = builder.handler(handler).build().await?;
    let report = inbox.run(broker.source()).await?;
    let count = |outcome| report.handler_calls_with(outcome);
    let counts = [
        stream.len() as u64,
        count(Outcome::Processed),
        count(Outcome::Released),
        count(Outcome::Duplicate),
        count(Outcome::Stale),
        count(Outcome::Parked),
        count(Outcome::Conflict),
        report.failed,
        broker.acked(),
    ];
    let left_over = inbox.parked().await?.len() + inbox.dead().await?.len();
    Ok(Delivered {
        handler: name,
        counts,
        left_over,
    })
}

/// Compares one pass with what must have happened.
fn check(
    pass: &Pass,
    events: &[PaymentReceived],
    stream: &[PaymentReceived],
    delivered: &Delivered,
    records: Vec<(String, String)>,
    ledger: Vec<(String, i64, i64)>,
) -> Verdict {
    let records: HashMap<_, _> = records.into_iter().collect();
    let ledger: BTreeMap<_, _> = ledger.into_iter().map(|(o, b, c)| (o, (b, c))).collect();
    // 1. The outcome counts are those of a replay of the guard's rules over the delivery stream.
    let rules = replay(stream, pass.rules);
    let n = stream.len() as u64;
    let expected = [
        n,
        rules.processed,
        rules.released,
        rules.duplicates,
        rules.stale,
        rules.parked,
        0,
        0,
        n,
    ];
    let mut problems: Vec<String> = ROWS
        .iter()
        .zip(delivered.counts.iter().zip(expected))
        .filter(|(_, (got, want))| *got != want)
        .map(|(what, (got, want))| format!("{what}: got {got}, expected {want}"))
        .collect();
    if pass.credits_all {
        let applied = row(&delivered.counts, "processed") + row(&delivered.counts, "released");
        if applied != events.len() as u64 {
            let want = events.len();
            problems.push(format!(
                "processed + released: got {applied}, expected {want}"
            ));
        }
    }
    if delivered.left_over > 0 {
        let left = delivered.left_over;
        problems.push(format!("{left} messages are left parked or dead"));
    }
    // 2. The inbox recorded each distinct event once, as processed or stale, and the processed
    //    ones (released ones included) are exactly those the rules allow.
    if records.len() != events.len() {
        let (got, want) = (records.len(), events.len());
        problems.push(format!("inbox records: got {got}, expected {want}"));
    }
    let mut applied = HashSet::new();
    for event in events {
        match records.get(&event.event_id.to_string()).map(String::as_str) {
            Some("processed") => _ = applied.insert(event.event_id),
            Some("stale") => {}
            other => problems.push(format!("event {} is recorded as {other:?}", event.event_id)),
        }
    }
    if applied != rules.applied {
        problems.push("the inbox applied other events than the guard's rules allow".into());
    }
    // 3. The ledger holds exactly the applied payments, each once: every distinct payment where
    //    the pass promises it, else those the inbox recorded as processed.
    let credited = |e: &&PaymentReceived| pass.credits_all || applied.contains(&e.event_id);
    let mut want = BTreeMap::new();
    for event in events.iter().filter(credited) {
        let (balance, credits) = want.entry(event.order_id.clone()).or_insert((0, 0));
        *balance += event.amount;
        *credits += 1;
    }
    let mut orders = want.keys().chain(ledger.keys());
    if let Some(order) = orders.find(|order| want.get(*order) != ledger.get(*order)) {
        let (got, want) = (ledger.get(order), want.get(order));
        problems.push(format!("{order}: ledger has {got:?}, expected {want:?}"));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let total: i64 = want.values().map(|(balance, _)| balance).sum();
    let (count, what) = match pass.credits_all {
        true => (events.len(), "distinct payments"),
        false => (applied.len(), "payments the inbox recorded as processed"),
    };
    let mut summary = format!("ledger = sum of the {count} {what} = {total}");
    if rules.released > 0 {
        let released = rules.released;
        summary += &format!(" ({released} of them released from parking, none left parked)");
    }
    Ok(summary)
}

/// What the guard's rules make of a delivery stream.
#[derive(Default)]
struct Replay {
    applied: HashSet<Uuid>,
    processed: u64,
    released: u64,
    duplicates: u64,
    stale: u64,
    parked: u64,
}

/// The guard's rules, replayed in memory. An event's later deliveries are duplicates. Its first
/// delivery is stale if its sequence is not newer than the last one applied to its order. Else,
/// monotonic: it applies. Strict: it applies if it is the next one (last + 1), and then releases
/// the parked events that follow it without a gap; if it is further ahead, it is parked. (The inbox
/// handles one order's deliveries in delivery order; sequences are unique per order here.)
fn replay(stream: &[PaymentReceived], rules: Rules) -> Replay {
    let (mut seen, mut replay) = (HashSet::new(), Replay::default());
    // Per order: the last applied sequence, and the parked events by sequence.
    let mut orders: HashMap<&str, (i64, BTreeMap<i64, Uuid>)> = HashMap::new();
    for event in stream {
        let (last, parked) = orders.entry(&event.order_id).or_default();
        if !seen.insert(event.event_id) {
            replay.duplicates += 1;
        } else if event.sequence <= *last {
            replay.stale += 1;
        } else if rules == Rules::Monotonic || event.sequence == *last + 1 {
            *last = event.sequence;
            replay.applied.insert(event.event_id);
            replay.processed += 1;
            while let Some(successor) = parked.remove(&(*last + 1)) {
                *last += 1;
                replay.applied.insert(successor);
                replay.released += 1;
            }
        } else {
            parked.insert(event.sequence, event.event_id);
            replay.parked += 1;
        }
    }
    replay
}

/// `ORDERS` orders, each with 4..=12 payments numbered 1, 2, 3, ... without gaps.
fn payments(rng: &mut Rng) -> Vec<PaymentReceived> {
    let mut events = Vec::new();
    for order in 0..ORDERS {
        for sequence in 1..=rng.between(4, 12) as i64 {
            let (event_id, amount) = (rng.uuid(), rng.between(1, 500) as i64);
            events.push(PaymentReceived {
                event_id,
                order_id: format!("order-{order:03}"),
                sequence,
                amount,
            });
        }
    }
    events
}

/// What an at-least-once broker hands over: every event once, half of them once or twice more
/// (identical content), in shuffled order.
fn at_least_once(events: &[PaymentReceived], rng: &mut Rng) -> Vec<PaymentReceived> {
    let mut stream = Vec::new();
    for event in events {
        let copies = [1, 1, 1, 1, 1, 2, 2, 2, 3, 3][rng.between(0, 9) as usize];
        stream.extend(std::iter::repeat_n(event, copies).cloned());
    }
    for i in (1..stream.len()).rev() {
        stream.swap(i, rng.between(0, i as u64) as usize); // Fisher–Yates
    }
    stream
}

/// A tiny seeded PRNG (SplitMix64): the same events and deliveries on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Roughly uniform in `low..=high`, plenty for a demo.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn uuid(&mut self) -> Uuid {
        let bits = (u128::from(self.next()) << 64) | u128::from(self.next());
        uuid::Builder::from_random_bytes(bits.to_be_bytes()).into_uuid()
    }
}
