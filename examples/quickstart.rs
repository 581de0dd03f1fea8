//! Quickstart: an orders ledger fed by an at-least-once broker.
//!
//! A payment service emits `PaymentReceived` events; our ledger credits each order's balance. The
//! broker delivers *at least once*: it re-sends events, and it does not keep them in order. The
//! handler is a plain `async fn` with one SQL statement; `#[inbox_handler]` runs it in a
//! transaction that also records the event id (a re-sent event is a `Duplicate`: nothing runs) and
//! the order's last applied sequence (an event not newer than that is `Stale`: nothing runs).
//!
//! Two passes deliver the same events, each with >30% duplicate deliveries:
//!   1. shuffled: an order's events arrive in any order, so some are skipped as stale;
//!   2. in order per order, duplicates only: the ledger must be the plain sum of all payments.
//!
//! `cargo run --example quickstart` uses an embedded SQLite file; on PostgreSQL:
//! `DATABASE_URL=postgres://user@host/db cargo run --example quickstart`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;

use inbox::prelude::*;
use inbox::{Backend, MemoryBroker};
use sqlx::{PgConnection, Pool, SqliteConnection};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "payment.received")]
struct PaymentReceived {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

/// The business write: credit the order (creating its row on its first payment). `credits`
/// counts applied payments, so a payment applied twice would show. `$n` works on both backends.
const CREDIT: &str = "INSERT INTO quickstart_ledger (order_id, balance, credits) VALUES ($1, $2, 1) \
    ON CONFLICT (order_id) DO UPDATE SET balance = quickstart_ledger.balance + excluded.balance, \
    credits = quickstart_ledger.credits + 1";

// The first parameter names the database, hence one thin handler per backend. Both are
// `name = "ledger"`: that name, not the function's, is the dedup scope.
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_sqlite(tx: &mut SqliteConnection, p: PaymentReceived) -> Result<(), HandlerError> {
    let credit = sqlx::query(CREDIT).bind(p.order_id).bind(p.amount);
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
    let credit = sqlx::query(CREDIT).bind(p.order_id).bind(p.amount);
    credit.execute(&mut *tx).await?;
    Ok(())
}

const CONSUMER: &str = "quickstart";
const ORDERS: u64 = 300;
// Each pass starts clean: the ledger is recreated and this consumer's inbox rows are deleted.
const RESET: [&str; 2] = [
    "DROP TABLE IF EXISTS quickstart_ledger",
    "CREATE TABLE quickstart_ledger \
     (order_id TEXT PRIMARY KEY, balance BIGINT NOT NULL, credits BIGINT NOT NULL)",
];
const FORGET: [&str; 2] = [
    "DELETE FROM inbox_messages WHERE consumer = $1",
    "DELETE FROM inbox_streams WHERE consumer = $1",
];
// Afterwards, the database's own record: the inbox's verdict per event, and the ledger.
const RECORDS: &str =
    "SELECT message_id, status FROM inbox_messages WHERE consumer = $1 AND handler = $2";
const LEDGER: &str = "SELECT order_id, balance, credits FROM quickstart_ledger";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let events = payments(&mut Rng(2024));
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| fresh_sqlite_file());
    let ok = if url.starts_with("postgres") {
        run(sqlx::PgPool::connect(&url).await?, credit_postgres, &events).await?
    } else if url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect_with(inbox::sqlite_options(&url)?).await?;
        run(pool, credit_sqlite, &events).await?
    } else {
        return Err(format!("unsupported DATABASE_URL `{url}`").into());
    };
    std::process::exit(if ok { 0 } else { 1 })
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

/// Runs both passes on one database and prints what happened; `true` if both check out.
async fn run<DB, H>(
    pool: Pool<DB>,
    handler: H,
    events: &[PaymentReceived],
) -> Result<bool, Box<dyn Error>>
where
    DB: Backend,
    H: Handler<DB, Message = PaymentReceived> + Copy,
    // What this example's own queries need from sqlx (both backends have it).
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

    let mut passes = Vec::new();
    for (title, stream) in [("shuffled", shuffled), ("in order", in_order)] {
        for sql in RESET {
            sqlx::query(sql).execute(&pool).await?;
        }
        for sql in FORGET {
            sqlx::query(sql).bind(CONSUMER).execute(&pool).await?;
        }
        let counts = deliver(&pool, handler, &stream).await?;
        let records = sqlx::query_as(RECORDS)
            .bind(CONSUMER)
            .bind(handler.name())
            .fetch_all(&pool)
            .await?;
        let ledger = sqlx::query_as(LEDGER).fetch_all(&pool).await?;
        let in_order = title == "in order";
        let verdict = check(events, &stream, &counts, records, ledger, in_order);
        passes.push((title, counts, verdict));
    }

    println!("{:14}{:>10}{:>10}", "", passes[0].0, passes[1].0);
    for (row, (label, first)) in passes[0].1.iter().enumerate() {
        println!("  {label:<12}{first:>10}{:>10}", passes[1].1[row].1);
    }
    println!();
    for (title, _, verdict) in &passes {
        match verdict {
            Ok(summary) => println!("{title}: OK, {summary}"),
            Err(problems) => println!("{title}: MISMATCH\n  - {}", problems.join("\n  - ")),
        }
    }
    let ok = passes.iter().all(|(_, _, verdict)| verdict.is_ok());
    match ok {
        true => println!("verdict: OK — every payment counted once, the ledger matches"),
        false => println!("verdict: MISMATCH — see above"),
    }
    Ok(ok)
}

/// The outcome table's rows: (label, count).
type Counts = [(&'static str, u64); 7];

/// Publishes the stream into an in-memory broker, lets an inbox with 4 workers drain it, and
/// counts the outcomes.
async fn deliver<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = PaymentReceived>,
    stream: &[PaymentReceived],
) -> Result<Counts, Box<dyn Error>> {
    let broker = MemoryBroker::new();
    for (n, event) in stream.iter().enumerate() {
        broker.publish(Envelope::encode(format!("delivery-{n}"), event)?);
    }
    broker.close();
    let inbox = Inbox::builder(pool.clone())
        .consumer(CONSUMER)
        .workers(4)
        .handler(handler);
    let report = inbox.build().await?.run(broker.source()).await?;
    Ok([
        ("deliveries", stream.len() as u64),
        ("processed", report.count(Outcome::Processed)),
        ("duplicates", report.count(Outcome::Duplicate)),
        ("stale", report.count(Outcome::Stale)),
        ("conflicts", report.count(Outcome::Conflict)),
        ("failed", report.failed),
        ("acked", broker.acked()),
    ])
}

/// Compares one pass with what must have happened. `Ok` holds a summary, `Err` every problem.
fn check(
    events: &[PaymentReceived],
    stream: &[PaymentReceived],
    counts: &Counts,
    records: Vec<(String, String)>,
    ledger: Vec<(String, i64, i64)>,
    in_order: bool,
) -> Result<String, Vec<String>> {
    let records: HashMap<_, _> = records.into_iter().collect();
    let ledger: BTreeMap<_, _> = ledger.into_iter().map(|(o, b, c)| (o, (b, c))).collect();
    // 1. The outcome counts are those of a replay of the guard's rules over the delivery stream.
    let (should_apply, duplicates, stale) = replay(stream);
    let n = stream.len() as u64;
    let expected = [n, should_apply.len() as u64, duplicates, stale, 0, 0, n];
    let mut problems: Vec<String> = counts
        .iter()
        .zip(expected)
        .filter(|((_, got), want)| got != want)
        .map(|((what, got), want)| format!("{what}: got {got}, expected {want}"))
        .collect();
    // 2. The inbox recorded each distinct event once, as processed or stale, and the processed
    //    ones are exactly those the rules allow.
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
    if applied != should_apply {
        problems.push("the inbox applied other events than the guard's rules allow".into());
    }
    // 3. The ledger holds exactly the applied payments, each once: delivered in order, simply
    //    every distinct payment; shuffled, those the inbox recorded as processed.
    let credited = |e: &&PaymentReceived| in_order || applied.contains(&e.event_id);
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
    let (count, what) = match in_order {
        true => (events.len(), "distinct payments"),
        false => (applied.len(), "payments the inbox recorded as processed"),
    };
    Ok(format!("ledger = sum of the {count} {what} = {total}"))
}

/// The monotonic guard's rules, replayed in memory: an event's first delivery applies if its
/// sequence is newer than the last one applied to its order, else it is stale; any later delivery
/// is a duplicate. (The inbox handles one order's deliveries in delivery order.)
fn replay(stream: &[PaymentReceived]) -> (HashSet<Uuid>, u64, u64) {
    let (mut seen, mut applied, mut last) = (HashSet::new(), HashSet::new(), HashMap::new());
    let (mut duplicates, mut stale) = (0, 0);
    for event in stream {
        let last = last.entry(&event.order_id).or_insert(0);
        if !seen.insert(event.event_id) {
            duplicates += 1;
        } else if event.sequence > *last {
            *last = event.sequence;
            applied.insert(event.event_id);
        } else {
            stale += 1;
        }
    }
    (applied, duplicates, stale)
}

/// 300 orders, each with 4..=12 payments of increasing (sometimes gapped) sequence numbers.
fn payments(rng: &mut Rng) -> Vec<PaymentReceived> {
    let mut events = Vec::new();
    for order in 0..ORDERS {
        let mut sequence = 0;
        for _ in 0..rng.between(4, 12) {
            sequence += rng.between(1, 3) as i64;
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
