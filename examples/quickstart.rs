//! Quickstart: an orders ledger fed by an at-least-once broker.
//!
//! A payment service emits `PaymentReceived` events and our ledger credits each order's balance.
//! The broker delivers *at least once*: it re-sends many events, and it does not keep them in
//! order. The ledger handler below is a plain `async fn` with one SQL statement;
//! `#[inbox_handler]` runs it inside a transaction that first records the event id (a re-sent
//! event becomes a `Duplicate`, nothing runs) and the order's last applied sequence (an event not
//! newer than one already applied becomes `Stale`, nothing runs).
//!
//! The program makes a few thousand events and delivers them twice over, each time with >30%
//! duplicate deliveries:
//!   1. shuffled: an order's events arrive in any order, so some are skipped as stale, and the
//!      ledger must equal exactly the payments the inbox recorded as processed;
//!   2. in order per order (duplicates only): the ledger must equal the plain sum of all payments.
//!
//! Run it with `cargo run --example quickstart` (embedded SQLite, nothing to install), or against
//! PostgreSQL with `DATABASE_URL=postgres://user@host/db cargo run --example quickstart`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;

use inbox::prelude::*;
use inbox::{Backend, MemoryBroker, RunReport};
use sqlx::Pool;

const CONSUMER: &str = "quickstart";
const ORDERS: u64 = 300;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "payment.received")]
struct PaymentReceived {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

/// The ledger's one business write: credit the order, creating its row on its first payment.
/// `credits` counts how many payments were applied, so an event applied twice would show.
/// `$n` placeholders work on PostgreSQL and SQLite alike.
const CREDIT: &str = "INSERT INTO quickstart_ledger (order_id, balance, credits) VALUES ($1, $2, 1) \
    ON CONFLICT (order_id) DO UPDATE SET balance = quickstart_ledger.balance + excluded.balance, \
    credits = quickstart_ledger.credits + 1";

// A handler names its database in its first parameter, hence one thin handler per backend. Both
// are `name = "ledger"`: that name, not the function's, is the dedup scope in `inbox_messages`.
#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_sqlite(
    tx: &mut sqlx::SqliteConnection,
    p: PaymentReceived,
) -> Result<(), HandlerError> {
    sqlx::query(CREDIT)
        .bind(p.order_id)
        .bind(p.amount)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    name = "ledger"
)]
async fn credit_postgres(
    tx: &mut sqlx::PgConnection,
    p: PaymentReceived,
) -> Result<(), HandlerError> {
    sqlx::query(CREDIT)
        .bind(p.order_id)
        .bind(p.amount)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

// Before each pass the example's own table is recreated and its consumer's inbox rows deleted.
const RESET_LEDGER: [&str; 2] = [
    "DROP TABLE IF EXISTS quickstart_ledger",
    "CREATE TABLE quickstart_ledger (order_id TEXT PRIMARY KEY, balance BIGINT NOT NULL, credits BIGINT NOT NULL)",
];
const RESET_INBOX: [&str; 2] = [
    "DELETE FROM inbox_messages WHERE consumer = $1",
    "DELETE FROM inbox_streams WHERE consumer = $1",
];
const RECORDS: &str =
    "SELECT message_id, status FROM inbox_messages WHERE consumer = $1 AND handler = $2";
const LEDGER: &str = "SELECT order_id, balance, credits FROM quickstart_ledger";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let events = payments(&mut Rng(2024));
    let ok = match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            run(
                sqlx::PgPool::connect(&url).await?,
                credit_postgres,
                &events,
                "PostgreSQL",
            )
            .await?
        }
        Ok(url) if url.starts_with("sqlite:") => {
            run(sqlite(&url).await?, credit_sqlite, &events, "SQLite").await?
        }
        Ok(url) => {
            return Err(format!("DATABASE_URL must be postgres:// or sqlite:, not `{url}`").into());
        }
        Err(_) => {
            // Default: a fresh SQLite file in the temp directory.
            let path = std::env::temp_dir().join("inbox-quickstart.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = format!("sqlite://{}", path.display());
            run(
                sqlite(&url).await?,
                credit_sqlite,
                &events,
                &format!("SQLite ({})", path.display()),
            )
            .await?
        }
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

async fn sqlite(url: &str) -> Result<sqlx::SqlitePool, sqlx::Error> {
    sqlx::SqlitePool::connect_with(inbox::sqlite_options(url)?).await
}

/// Runs both passes on one database; `true` if both check out.
async fn run<DB, H>(
    pool: Pool<DB>,
    handler: H,
    events: &[PaymentReceived],
    database: &str,
) -> Result<bool, Box<dyn Error>>
where
    DB: Backend,
    H: Handler<DB, Message = PaymentReceived> + Copy,
    // What the example's own queries need from sqlx; both backends provide it.
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (String, String): for<'r> sqlx::FromRow<'r, DB::Row>,
    (String, i64, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    inbox::migrate(&pool).await?;
    let shuffled = at_least_once(events, &mut Rng(7));
    // A broker that keeps each order's events in order (like a partitioned log) but still
    // redelivers: the same deliveries, stably sorted by sequence.
    let mut in_order = shuffled.clone();
    in_order.sort_by_key(|event| event.sequence);

    let duplicates = shuffled.len() - events.len();
    println!("inbox quickstart: an orders ledger on {database}");
    println!(
        "{} payments across {ORDERS} orders, delivered {} times per pass ({duplicates} duplicate deliveries, {}%)\n",
        events.len(),
        shuffled.len(),
        100 * duplicates / shuffled.len()
    );

    let mut passes = Vec::new();
    for (title, stream) in [("shuffled", shuffled), ("in order", in_order)] {
        for sql in RESET_LEDGER {
            sqlx::query(sql).execute(&pool).await?;
        }
        for sql in RESET_INBOX {
            sqlx::query(sql)
                .bind(CONSUMER.to_owned())
                .execute(&pool)
                .await?;
        }
        let (report, acked) = deliver(&pool, handler, &stream).await?;
        let records: HashMap<String, String> = sqlx::query_as(RECORDS)
            .bind(CONSUMER.to_owned())
            .bind(handler.name().to_owned())
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
        let ledger: Vec<(String, i64, i64)> = sqlx::query_as(LEDGER).fetch_all(&pool).await?;
        let ledger = ledger
            .into_iter()
            .map(|(order, balance, credits)| (order, (balance, credits)))
            .collect();
        let verdict = check(
            events,
            &stream,
            &report,
            acked,
            &records,
            &ledger,
            title == "in order",
        );
        let deliveries = stream.len() as u64;
        passes.push(Pass {
            title,
            deliveries,
            report,
            acked,
            verdict,
        });
    }
    print_table(&passes);
    let mut ok = true;
    for Pass { title, verdict, .. } in &passes {
        match verdict {
            Ok(summary) => println!("{title}: OK, {summary}"),
            Err(problems) => {
                ok = false;
                println!("{title}: MISMATCH\n  - {}", problems.join("\n  - "));
            }
        }
    }
    match ok {
        true => println!(
            "verdict: OK — every payment recorded once, none applied twice, ledger matches"
        ),
        false => println!("verdict: MISMATCH — see above"),
    }
    Ok(ok)
}

/// One pass: what the run reported and what the checks concluded.
struct Pass {
    title: &'static str,
    deliveries: u64,
    report: RunReport,
    acked: u64,
    verdict: Result<String, Vec<String>>,
}

fn print_table(passes: &[Pass]) {
    let rows: [(&str, fn(&Pass) -> u64); 7] = [
        ("deliveries", |p| p.deliveries),
        ("processed", |p| p.report.count(Outcome::Processed)),
        ("duplicates", |p| p.report.count(Outcome::Duplicate)),
        ("stale", |p| p.report.count(Outcome::Stale)),
        ("conflicts", |p| p.report.count(Outcome::Conflict)),
        ("failed", |p| p.report.failed),
        ("acked", |p| p.acked),
    ];
    print!("{:<14}", "");
    passes.iter().for_each(|pass| print!("{:>10}", pass.title));
    for (label, value) in rows {
        print!("\n  {label:<12}");
        passes.iter().for_each(|pass| print!("{:>10}", value(pass)));
    }
    println!("\n");
}

/// Publishes the stream into an in-memory broker and lets an inbox with 4 workers drain it.
async fn deliver<DB: Backend>(
    pool: &Pool<DB>,
    handler: impl Handler<DB, Message = PaymentReceived>,
    stream: &[PaymentReceived],
) -> Result<(RunReport, u64), Box<dyn Error>> {
    let broker = MemoryBroker::new();
    for (n, event) in stream.iter().enumerate() {
        broker.publish(Envelope::encode(format!("delivery-{n}"), event)?);
    }
    broker.close();
    let inbox = Inbox::builder(pool.clone())
        .consumer(CONSUMER)
        .workers(4)
        .handler(handler)
        .build()
        .await?;
    let report = inbox.run(broker.source()).await?;
    Ok((report, broker.acked()))
}

/// Compares one pass against what must have happened. `Ok` holds a summary, `Err` every problem.
fn check(
    events: &[PaymentReceived],
    stream: &[PaymentReceived],
    report: &RunReport,
    acked: u64,
    records: &HashMap<String, String>,
    ledger: &BTreeMap<String, (i64, i64)>,
    in_order: bool,
) -> Result<String, Vec<String>> {
    let mut problems = Vec::new();
    let mut expect = |what: &str, got: u64, want: u64| {
        if got != want {
            problems.push(format!("{what}: got {got}, expected {want}"));
        }
    };
    // 1. The runtime's counts equal a replay of the guard's rules over the delivery stream.
    let (should_apply, duplicates, stale) = replay(stream);
    expect(
        "processed",
        report.count(Outcome::Processed),
        should_apply.len() as u64,
    );
    expect("duplicates", report.count(Outcome::Duplicate), duplicates);
    expect("stale", report.count(Outcome::Stale), stale);
    expect("conflicts", report.count(Outcome::Conflict), 0);
    expect("failed", report.failed, 0);
    expect("acked", acked, stream.len() as u64);
    // 2. The inbox recorded every distinct event exactly once (its primary key allows no more).
    expect("inbox records", records.len() as u64, events.len() as u64);
    let mut applied = HashSet::new();
    for event in events {
        match records.get(&event.event_id.to_string()).map(String::as_str) {
            Some("processed") => _ = applied.insert(event.event_id),
            Some("stale") => {}
            other => problems.push(format!("event {} recorded as {other:?}", event.event_id)),
        }
    }
    if applied != should_apply {
        problems.push("the inbox applied other events than the guard's rules allow".into());
    }
    // 3. The ledger holds exactly the payments that were applied, each once: those the inbox
    // recorded as processed, or, delivered in order, simply every distinct payment.
    let credited = |event: &&PaymentReceived| in_order || applied.contains(&event.event_id);
    let mut expected = BTreeMap::new();
    for event in events.iter().filter(credited) {
        let (balance, credits) = expected.entry(event.order_id.clone()).or_insert((0, 0));
        *balance += event.amount;
        *credits += 1;
    }
    if let Some(order) = expected
        .keys()
        .chain(ledger.keys())
        .find(|order| expected.get(*order) != ledger.get(*order))
    {
        let (want, got) = (expected.get(order), ledger.get(order));
        problems.push(format!(
            "{order}: ledger (balance, credits) is {got:?}, expected {want:?}"
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let total: i64 = expected.values().map(|(balance, _)| balance).sum();
    Ok(match in_order {
        false => format!(
            "ledger matches the {} payments the inbox recorded as processed ({total} credited)",
            applied.len()
        ),
        true => format!(
            "ledger matches the plain sum of all {} distinct payments ({total})",
            events.len()
        ),
    })
}

/// What the monotonic guard must decide, replayed in memory: an event's first delivery applies if
/// its sequence is newer than the last one applied to its order, else it is stale; every later
/// delivery of it is a duplicate. (The inbox handles one order's deliveries in delivery order.)
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

/// A few thousand payments: each order gets 4..=16 events with increasing (gapped) sequences.
fn payments(rng: &mut Rng) -> Vec<PaymentReceived> {
    let mut events = Vec::new();
    for order in 0..ORDERS {
        let mut sequence = 0;
        for _ in 0..rng.between(4, 16) {
            sequence += rng.between(1, 3) as i64;
            events.push(PaymentReceived {
                event_id: rng.uuid(),
                order_id: format!("order-{order:03}"),
                sequence,
                amount: 100 * rng.between(1, 500) as i64,
            });
        }
    }
    events
}

/// What an at-least-once broker delivers: every event once, half of them again (once or twice,
/// identical content), all shuffled.
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

    /// Uniform-enough in `low..=high` for a demo.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn uuid(&mut self) -> Uuid {
        let bits = (u128::from(self.next()) << 64) | u128::from(self.next());
        uuid::Builder::from_random_bytes(bits.to_be_bytes()).into_uuid()
    }
}
