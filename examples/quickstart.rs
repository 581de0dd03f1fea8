//! Quickstart: an orders ledger fed by an at-least-once broker, and what each ordering makes of it.
//!
//! A payment service emits `PaymentReceived` events, numbered 1, 2, 3, ... per order; our ledger
//! credits each order's balance. The broker delivers *at least once*: it re-sends events, and it
//! does not keep them in order. The handler is a plain `async fn` with one SQL statement;
//! `#[inbox_handler]` runs it in a transaction that also records the event id (a re-sent event is
//! a `Duplicate`: nothing runs; one re-sent with other content under its id is a `Conflict`, kept
//! for an operator and never applied) and guards the order's sequence.
//!
//! Three passes deliver the same events, with the same re-sends, and print a row each:
//!   1. monotonic ordering (the default), shuffled: an event not newer than the last one applied to
//!      its order is skipped as `Stale`, so the ledger comes out short by every payment that came
//!      after a later one;
//!   2. monotonic, each order's events in sequence (as one partition of a log delivers them):
//!      nothing is stale, the ledger is exact;
//!   3. strict ordering, shuffled: an event ahead of its order's next sequence is `Parked` and
//!      applied (`Released`) once its predecessors have; the ledger is exact, nothing is left
//!      parked.
//!
//! Then one order's payments, step by step under both orderings, and a line per pass saying why
//! it ended as it did. Each pass is checked against a replay of the guard's rules over its
//! deliveries, and the ledger against the payments applied: anything else is a `MISMATCH`, and the
//! example exits with status 1.
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
    /// How it was paid. The ledger does not use it, but it is content: a re-send with another
    /// method under the same event id is a `Conflict`, never applied.
    method: String,
}

/// The statements this example runs itself, as one database spells them.
struct LedgerSql {
    /// The business write: credit the order (creating its row on its first payment). `credits`
    /// counts applied payments, so a payment applied twice would show.
    credit: &'static str,
    /// Each pass starts clean: this consumer's inbox rows are deleted.
    forget: [&'static str; 3],
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
        "DELETE FROM inbox_conflicts WHERE consumer = $1",
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
        "DELETE FROM inbox_conflicts WHERE consumer = ?",
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
    /// Every payment must apply, once: the ledger is the plain sum of all payments (else: of
    /// those the inbox applied).
    credits_all: bool,
}

const PASSES: [Pass; 3] = [
    Pass {
        title: "monotonic, shuffled",
        shuffled: true,
        rules: Rules::Monotonic,
        credits_all: false,
    },
    Pass {
        title: "monotonic, in order",
        shuffled: false,
        rules: Rules::Monotonic,
        credits_all: true,
    },
    Pass {
        title: "strict, shuffled",
        shuffled: true,
        rules: Rules::Strict,
        credits_all: true,
    },
];

const CONSUMER: &str = "quickstart";
const ORDERS: u64 = 300;
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

/// Runs every pass on one database and prints what happened and why; `true` if all check out.
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
    print_setup(events, &shuffled, DB::NAME);

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
        results.push(check(pass, events, stream, &delivered, records, ledger));
    }

    print_table(&results, total(events));
    print_example(events, &shuffled);
    Ok(print_verdicts(&results, events))
}

/// The payments' plain sum: what the ledger holds if every payment is credited once.
fn total(events: &[PaymentReceived]) -> i64 {
    events.iter().map(|event| event.amount).sum()
}

/// What every pass is given.
fn print_setup(events: &[PaymentReceived], shuffled: &[PaymentReceived], database: &str) {
    let (count, n) = (events.len(), shuffled.len());
    let (resent, share) = (n - count, 100 * (n - count) / n);
    let total = total(events);
    println!(
        "{count} payments to {ORDERS} orders, {total} in all, numbered 1, 2, 3, ... per order; on {database}."
    );
    println!(
        "The broker delivers each at least once: {n} deliveries, {resent} of them re-sends ({share}%)."
    );
    println!(
        "Every pass gets the same deliveries: shuffled, or in sequence per order (\"in order\").\n"
    );
}

/// What a pass's run did, as the runtime counted it.
#[derive(Clone, Copy, Default)]
struct Counts {
    deliveries: u64,
    processed: u64,
    released: u64,
    duplicates: u64,
    stale: u64,
    parked: u64,
    conflicts: u64,
    failed: u64,
    acked: u64,
}

impl Counts {
    /// Credited to the ledger: processed at once, or released from parking.
    fn applied(&self) -> u64 {
        self.processed + self.released
    }

    /// Each count with its name, to say which ones differ.
    fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("deliveries", self.deliveries),
            ("processed", self.processed),
            ("released", self.released),
            ("duplicates", self.duplicates),
            ("stale", self.stale),
            ("parked", self.parked),
            ("conflicts", self.conflicts),
            ("failed", self.failed),
            ("acked", self.acked),
        ]
    }
}

/// What one pass did, and whether it is what the guard's rules say.
struct Ran {
    pass: &'static Pass,
    counts: Counts,
    /// The ledger's balance over every order.
    ledger: i64,
    /// Where the run differs from a replay of the guard's rules; empty when it checks out.
    problems: Vec<String>,
}

/// The outcome table's columns after the pass's title.
const COLUMNS: [&str; 9] = [
    "deliveries",
    "processed",
    "duplicate",
    "conflict",
    "stale",
    "parked",
    "released",
    "applied",
    "ledger",
];

/// What the outcome table's words mean.
const LEGEND: [&str; 7] = [
    "processed  applied when it came",
    "duplicate  a re-send: its event id is recorded already with this content, nothing runs",
    "conflict   a re-send under a recorded event id with other content: never applied, kept",
    "stale      not newer than the last payment applied to its order: recorded, skipped",
    "parked     strict only: ahead of a missing predecessor, kept until the gap fills",
    "released   a parked payment applied once its predecessor had",
    "applied    credited to the ledger: processed at once, or released",
];

/// The outcome table: a row per pass, then what its words mean.
fn print_table(results: &[Ran], total: i64) {
    let cells = |values: [String; 9]| -> String {
        let cells = values.iter().zip(COLUMNS);
        cells
            .map(|(v, c)| format!("{v:>w$}", w = c.len() + 2))
            .collect()
    };
    println!(
        "{:20}{}  vs. all {total}",
        "",
        cells(COLUMNS.map(String::from))
    );
    for ran in results {
        let c = &ran.counts;
        let row = [
            c.deliveries,
            c.processed,
            c.duplicates,
            c.conflicts,
            c.stale,
            c.parked,
            c.released,
            c.applied(),
        ];
        let [a, b, c, d, e, f, g, h] = row.map(|n| n.to_string());
        let row = cells([a, b, c, d, e, f, g, h, ran.ledger.to_string()]);
        let versus = match total - ran.ledger {
            0 => "exact".to_string(),
            short if short > 0 => format!("short by {short}"),
            over => format!("over by {}", -over),
        };
        println!("{:20}{row}  {versus}", ran.pass.title);
    }
    println!();
    LEGEND.iter().for_each(|line| println!("  {line}"));
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
    let counts = Counts {
        deliveries: stream.len() as u64,
        processed: count(Outcome::Processed),
        released: count(Outcome::Released),
        duplicates: count(Outcome::Duplicate),
        stale: count(Outcome::Stale),
        parked: count(Outcome::Parked),
        conflicts: count(Outcome::Conflict),
        failed: report.failed,
        acked: broker.acked(),
    };
    let left_over = inbox.parked().await?.len() + inbox.dead().await?.len();
    Ok(Delivered {
        handler: name,
        counts,
        left_over,
    })
}

/// Compares one pass with what must have happened.
fn check(
    pass: &'static Pass,
    events: &[PaymentReceived],
    stream: &[PaymentReceived],
    delivered: &Delivered,
    records: Vec<(String, String)>,
    ledger: Vec<(String, i64, i64)>,
) -> Ran {
    let rules = replay(stream, pass.rules);
    let mut problems = check_counts(&delivered.counts, &rules);
    if pass.credits_all && delivered.counts.applied() != events.len() as u64 {
        let (got, want) = (delivered.counts.applied(), events.len());
        problems.push(format!(
            "applied: got {got}, expected every payment, {want}"
        ));
    }
    if delivered.left_over > 0 {
        let left = delivered.left_over;
        problems.push(format!("{left} messages are left parked or dead"));
    }
    let applied = check_records(events, records, &rules, &mut problems);
    let ledger: BTreeMap<_, _> = ledger.into_iter().map(|(o, b, c)| (o, (b, c))).collect();
    // The ledger holds exactly the applied payments, each once: every payment where the pass
    // promises it, else those the inbox recorded as processed.
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
    Ran {
        pass,
        counts: delivered.counts,
        ledger: ledger.values().map(|(balance, _)| balance).sum(),
        problems,
    }
}

/// The outcome counts are those of a replay of the guard's rules over the delivery stream:
/// no failure, every delivery acknowledged.
fn check_counts(counts: &Counts, rules: &Replay) -> Vec<String> {
    let n = counts.deliveries;
    let expected = Counts {
        deliveries: n,
        processed: rules.processed,
        released: rules.released,
        duplicates: rules.duplicates,
        stale: rules.stale,
        parked: rules.parked,
        conflicts: rules.conflicts,
        failed: 0,
        acked: n,
    };
    let got = counts.named().into_iter();
    got.zip(expected.named())
        .filter(|((_, got), (_, want))| got != want)
        .map(|((what, got), (_, want))| format!("{what}: got {got}, expected {want}"))
        .collect()
}

/// The inbox recorded each distinct event once, as processed or stale, and the processed ones
/// (released ones included) are exactly those the rules allow. Returns those.
fn check_records(
    events: &[PaymentReceived],
    records: Vec<(String, String)>,
    rules: &Replay,
    problems: &mut Vec<String>,
) -> HashSet<Uuid> {
    let records: HashMap<_, _> = records.into_iter().collect();
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
    let allowed: HashSet<Uuid> = rules
        .steps
        .iter()
        .filter_map(Step::applied)
        .flatten()
        .collect();
    if applied != allowed {
        problems.push("the inbox applied other events than the guard's rules allow".into());
    }
    applied
}

/// Why each pass ended as it did, then whether every pass is what the guard's rules say.
fn print_verdicts(results: &[Ran], events: &[PaymentReceived]) -> bool {
    let ok = results.iter().all(|ran| ran.problems.is_empty());
    if ok {
        let (duplicates, conflicts) = (results[0].counts.duplicates, results[0].counts.conflicts);
        println!(
            "- every pass: {duplicates} re-sends came back as duplicates, and {conflicts} with another"
        );
        println!(
            "  payment method under a recorded event id as conflicts, kept for an operator and"
        );
        println!("  never applied; nothing ran twice, no payment was credited twice.");
    }
    for ran in results {
        match ran.problems.as_slice() {
            [] => println!("- {}: {}", ran.pass.title, lesson(ran, events)),
            problems => {
                let problems = problems.join("\n    ");
                println!(
                    "- {}: MISMATCH with the guard's rules\n    {problems}",
                    ran.pass.title
                );
            }
        }
    }
    match ok {
        true => println!(
            "\ncheck: OK — each pass did what a replay of the guard's rules over its deliveries does,\n\
             the inbox recorded each payment once, and each order's ledger row holds exactly the\n\
             payments applied, each once."
        ),
        false => println!("\ncheck: MISMATCH — see above"),
    }
    ok
}

/// What a pass teaches: what the ordering did with its stream, and what it is for.
fn lesson(ran: &Ran, events: &[PaymentReceived]) -> String {
    let (c, count) = (&ran.counts, events.len());
    match (ran.pass.rules, c.stale) {
        (Rules::Monotonic, 0) => format!(
            "each order's payments came in sequence, so none was stale and all {count}\n  \
             applied. Monotonic counts every event only while the broker keeps each aggregate's\n  \
             order: a partition of a log does, until a delivery is retried after its successor."
        ),
        (Rules::Monotonic, stale) => format!(
            "{stale} payments came after a later payment of their order had applied:\n  \
             skipped as stale, never credited, so the ledger is short by {short}. Right where only\n  \
             the newest event counts (a status, a snapshot); a ledger must not lose events.",
            short = total(events) - ran.ledger,
        ),
        (Rules::Strict, _) => format!(
            "{parked} payments came ahead of a missing predecessor: parked, then released\n  \
             in order once it applied, none left behind. All {count} applied, once each, in order:\n  \
             a ledger needs `ordering = \"strict\"`.",
            parked = c.parked,
        ),
    }
}

/// One order's payments as the shuffled stream first delivered them, and what each ordering did
/// with each: the table's numbers, on a scale one can follow.
fn print_example(events: &[PaymentReceived], shuffled: &[PaymentReceived]) {
    let (monotonic, strict) = (
        replay(shuffled, Rules::Monotonic),
        replay(shuffled, Rules::Strict),
    );
    let Some(order) = example_order(events, shuffled, &monotonic) else {
        return;
    };
    let monotonic = monotonic.of_order(shuffled, &order);
    let strict = strict.of_order(shuffled, &order);
    let sequence = |step: &Step| shuffled[step.delivery].sequence;
    let payments: Vec<String> = monotonic.iter().map(|s| sequence(s).to_string()).collect();
    let count = payments.len();
    let did = |steps: &[&Step]| -> Vec<String> {
        steps.iter().map(|step| step.decision.to_string()).collect()
    };
    let credited = |steps: &[&Step]| {
        let applied = steps
            .iter()
            .filter_map(|step| step.applied())
            .flatten()
            .count();
        format!("→ {applied} of {count} credited")
    };
    let rows = [
        ("payment", payments, String::new()),
        ("monotonic", did(&monotonic), credited(&monotonic)),
        ("strict", did(&strict), credited(&strict)),
    ];
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            rows.iter()
                .map(|(_, row, _)| row[i].len())
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    println!(
        "Why: {order}'s {count} payments as the shuffled stream delivered them, re-sends left out."
    );
    for (label, row, credited) in &rows {
        let cells: String = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", format!("  {label:<11}{cells}{credited}").trim_end());
    }
    let chain = strict.iter().find_map(|step| match &step.decision {
        Decision::Applied(_, released) if !released.is_empty() => Some((step, released)),
        _ => None,
    });
    if let Some((step, released)) = chain {
        let released: Vec<String> = released.iter().map(|(seq, _)| seq.to_string()).collect();
        let (seq, released) = (sequence(step), released.join(", "));
        println!(
            "  ({}: applies {seq}, then the parked {released}, which waited for it)",
            step.decision
        );
    }
    println!();
}

/// The first order with a few payments (so that its line stays short) of which monotonic
/// skipped at least two as stale.
fn example_order(
    events: &[PaymentReceived],
    shuffled: &[PaymentReceived],
    monotonic: &Replay,
) -> Option<String> {
    let mut stale: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for event in events {
        stale.entry(&event.order_id).or_default().0 += 1;
    }
    for step in &monotonic.steps {
        if matches!(step.decision, Decision::Stale) {
            let order = shuffled[step.delivery].order_id.as_str();
            stale.entry(order).or_default().1 += 1;
        }
    }
    let mut orders = stale.into_iter();
    let found = orders.find(|(_, (payments, stale))| *payments <= 7 && *stale >= 2);
    found.map(|(order, _)| order.to_string())
}

/// What the guard's rules do with the first delivery of a payment.
enum Decision {
    /// Applied, then the parked successors released after it, by sequence.
    Applied(Uuid, Vec<(i64, Uuid)>),
    Stale,
    Parked,
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Applied(_, released) => {
                f.write_str("apply")?;
                released.iter().try_for_each(|(seq, _)| write!(f, "+{seq}"))
            }
            Decision::Stale => f.write_str("stale"),
            Decision::Parked => f.write_str("park"),
        }
    }
}

/// The rules' decision on the first delivery of a payment, the `delivery`-th of the stream.
struct Step {
    delivery: usize,
    decision: Decision,
}

impl Step {
    /// The payments this step applied: the delivered one and those it released.
    fn applied(&self) -> Option<Vec<Uuid>> {
        match &self.decision {
            Decision::Applied(id, released) => Some(
                std::iter::once(*id)
                    .chain(released.iter().map(|r| r.1))
                    .collect(),
            ),
            _ => None,
        }
    }
}

/// What the guard's rules make of a delivery stream.
#[derive(Default)]
struct Replay {
    /// A step per payment, in the order of their first deliveries.
    steps: Vec<Step>,
    processed: u64,
    released: u64,
    duplicates: u64,
    conflicts: u64,
    stale: u64,
    parked: u64,
}

impl Replay {
    /// The steps of one order's payments, in the order of their first deliveries in `stream`.
    fn of_order<'r>(&'r self, stream: &[PaymentReceived], order: &str) -> Vec<&'r Step> {
        let steps = self.steps.iter();
        steps
            .filter(|step| stream[step.delivery].order_id == order)
            .collect()
    }
}

/// The guard's rules, replayed in memory. An event's later deliveries are duplicates, or conflicts
/// where their content differs from that of its first delivery. Its first
/// delivery is stale if its sequence is not newer than the last one applied to its order. Else,
/// monotonic: it applies. Strict: it applies if it is the next one (last + 1), and then releases
/// the parked events that follow it without a gap; if it is further ahead, it is parked. (The inbox
/// handles one order's deliveries in delivery order; sequences are unique per order here.)
fn replay(stream: &[PaymentReceived], rules: Rules) -> Replay {
    let (mut seen, mut replay) = (HashMap::new(), Replay::default());
    // Per order: the last applied sequence, and the parked events by sequence.
    let mut orders: HashMap<&str, (i64, BTreeMap<i64, Uuid>)> = HashMap::new();
    for (delivery, event) in stream.iter().enumerate() {
        let (last, parked) = orders.entry(&event.order_id).or_default();
        // The content of an event's first delivery, which the inbox records.
        if let Some(first) = seen.get(&event.event_id) {
            match *first == event.method {
                true => replay.duplicates += 1,
                false => replay.conflicts += 1,
            }
            continue;
        }
        seen.insert(event.event_id, event.method.as_str());
        let decision = if event.sequence <= *last {
            replay.stale += 1;
            Decision::Stale
        } else if rules == Rules::Monotonic || event.sequence == *last + 1 {
            *last = event.sequence;
            replay.processed += 1;
            let mut released = Vec::new();
            while let Some(successor) = parked.remove(&(*last + 1)) {
                *last += 1;
                released.push((*last, successor));
            }
            replay.released += released.len() as u64;
            Decision::Applied(event.event_id, released)
        } else {
            parked.insert(event.sequence, event.event_id);
            replay.parked += 1;
            Decision::Parked
        };
        replay.steps.push(Step { delivery, decision });
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
                method: "card".into(),
            });
        }
    }
    events
}

/// What an at-least-once broker hands over: every event once, half of them once or twice more,
/// in shuffled order. One re-send in forty comes with other content under the same event id (a
/// producer that re-sent a corrected event without a new id).
fn at_least_once(events: &[PaymentReceived], rng: &mut Rng) -> Vec<PaymentReceived> {
    let mut stream = Vec::new();
    for event in events {
        let copies = [1, 1, 1, 1, 1, 2, 2, 2, 3, 3][rng.between(0, 9) as usize];
        stream.push(event.clone());
        for _ in 1..copies {
            let mut resent = event.clone();
            if rng.between(0, 39) == 0 {
                resent.method = "transfer".into();
            }
            stream.push(resent);
        }
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
