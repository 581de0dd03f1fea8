//! Dead letters: a message no retry can fix, and what an operator does about it.
//!
//! A shipping service handles `ShipOrder` messages. An order to a country the handler does not
//! support yet fails, is retried with backoff while the other orders flow, and ends *dead*: kept
//! with its payload, attempts and last error. A garbled delivery is kept *rejected*, with its exact
//! bytes. Then a fix is deployed; the operator replays the dead order and discards the garbled one.
//! Run it with `cargo run --example dead_letters` (embedded SQLite, nothing to install).

use std::error::Error;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use inbox::prelude::*;
use inbox::{MemoryBroker, RetryPolicy};
use sqlx::{Sqlite, SqlitePool};

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "shipping.ship_order")]
struct ShipOrder {
    order_id: String,
    country: String,
}

/// The orders of the day; `o-4` goes to Iceland, which version 1 does not support.
const ORDERS: [&str; 6] = ["o-1", "o-2", "o-3", "o-4", "o-5", "o-6"];
const COUNTRIES: [&str; 6] = ["DE", "FR", "NL", "IS", "DE", "FR"];
const POISON: &str = "o-4";
const OPERATOR: &str = "ops@example.com";
type Res<T> = Result<T, Box<dyn Error>>;

/// When the program started, to show the backoff between attempts.
static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Version 1 of the handler. Its error is an ordinary one, so the inbox retries it (with backoff)
/// before giving up; `HandlerError::permanent(..)` would make it dead at once.
#[inbox_handler(key = "order_id", name = "ship_order")]
async fn ship_v1(ctx: &mut Context<'_, Sqlite>, order: ShipOrder) -> Result<(), HandlerError> {
    if !["DE", "FR", "NL"].contains(&order.country.as_str()) {
        let (id, attempt, ms) = (&order.order_id, ctx.attempt(), START.elapsed().as_millis());
        let why = format!("no carrier for {}", order.country);
        println!("  {id} attempt {attempt} failed at +{ms} ms: {why}");
        return Err(HandlerError::msg(why));
    }
    Ok(ship(ctx, &order, "v1").await?)
}

/// Version 2, after the fix. The same `name` keeps the same dedup scope: what v1 shipped stays
/// shipped, and the dead message belongs to this handler too.
#[inbox_handler(key = "order_id", name = "ship_order")]
async fn ship_v2(ctx: &mut Context<'_, Sqlite>, order: ShipOrder) -> Result<(), HandlerError> {
    Ok(ship(ctx, &order, "v2").await?)
}

/// The business write, in the inbox's transaction: a row per shipment, with the handler version.
/// No unique key on purpose: an order shipped twice would show as two rows.
async fn ship(ctx: &mut Context<'_, Sqlite>, order: &ShipOrder, by: &str) -> sqlx::Result<()> {
    let sql = "INSERT INTO shipments (order_id, shipped_by) VALUES ($1, $2)";
    let insert = sqlx::query(sql).bind(&order.order_id);
    insert.bind(by).execute(&mut **ctx).await?;
    let (id, country, attempt) = (&order.order_id, &order.country, ctx.attempt());
    println!("  {id} shipped to {country} by {by} on attempt {attempt}");
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    LazyLock::force(&START);
    let pool = fresh_database().await?;

    println!("\n1. Version 1 handles the day's orders (and one garbled delivery)");
    let v1 = inbox(&pool, ship_v1).await?;
    deliver(&v1).await?;

    println!("\n2. What the operator sees");
    show_kept(&v1).await?;

    println!("\n3. The fix is deployed: version 2 ships to IS; the operator acts");
    let v2 = inbox(&pool, ship_v2).await?;
    // Replay by handler name and message id; `by` and the reason are kept with the message.
    let replay = |reason| v2.replay("ship_order", POISON, OPERATOR, reason);
    let replayed = replay("country support added").await?;
    println!("  replay {POISON}: {replayed:?}");
    let again = replay("clicked twice").await?;
    println!("  replay {POISON} again: {again:?} (nothing ran)");
    for rejected in v2.rejected().await? {
        let reason = "truncated by the producer, which re-sent it";
        v2.discard_rejected(rejected.id, OPERATOR, reason).await?;
        println!("  rejected #{} discarded: {reason}", rejected.id);
    }

    println!("\n4. Checks");
    let problems = check(&v2, &pool, [replayed, again]).await?;
    if problems.is_empty() {
        let shipped = format!("each order shipped exactly once ({POISON} after its replay)");
        println!("verdict: OK — {shipped}; nothing is left dead or rejected");
        return Ok(());
    }
    println!("verdict: MISMATCH\n  - {}", problems.join("\n  - "));
    std::process::exit(1)
}

/// An inbox running `handler`, retrying fast for the demo: 3 attempts, ~50 ms then ~100 ms apart.
async fn inbox(pool: &SqlitePool, handler: impl Handler<Sqlite>) -> Res<Inbox<Sqlite>> {
    let retry = RetryPolicy::new(3).backoff(Duration::from_millis(50), Duration::from_secs(1));
    let builder = Inbox::builder(pool.clone()).retry(retry);
    Ok(builder.handler(handler).build().await?)
}

/// A new SQLite file in the temp directory (the old one deleted), with the inbox tables and ours.
async fn fresh_database() -> Res<SqlitePool> {
    let path = std::env::temp_dir().join("inbox-dead-letters.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    println!("database: {}", path.display());
    let url = format!("sqlite://{}", path.display());
    let pool = SqlitePool::connect_with(inbox::sqlite_options(&url)?).await?;
    inbox::migrate(&pool).await?;
    let create = "CREATE TABLE shipments (order_id TEXT NOT NULL, shipped_by TEXT NOT NULL)";
    sqlx::query(create).execute(&pool).await?;
    Ok(pool)
}

/// Publishes the orders and a garbled delivery to an in-memory broker, and lets `inbox` drain it.
async fn deliver(inbox: &Inbox<Sqlite>) -> Res<()> {
    let broker = MemoryBroker::new();
    for (id, country) in ORDERS.into_iter().zip(COUNTRIES) {
        let (order_id, country) = (id.to_owned(), country.to_owned());
        let order = ShipOrder { order_id, country };
        broker.publish(Envelope::encode(format!("delivery-{id}"), &order)?);
    }
    // A producer bug: a truncated JSON payload, which no version of the handler could decode.
    let garbled = br#"{"order_id": "o-7", "country": "#.to_vec();
    broker.publish(Envelope::new(ShipOrder::TYPE, "delivery-o-7", garbled));
    broker.close(); // the run ends once everything published is settled
    let report = inbox.run(broker.source()).await?;
    let [processed, retried, dead] = [Outcome::Processed, Outcome::Retrying, Outcome::Dead]
        .map(|o| report.handler_calls_with(o));
    let rejected = report.rejected;
    println!("  run: {processed} processed, {retried} retried, {dead} dead, {rejected} rejected");
    // Dead and rejected deliveries are acknowledged too: the database keeps them now.
    let (acked, published) = (broker.acked(), ORDERS.len() + 1);
    println!("  broker: {acked} of {published} deliveries acknowledged");
    Ok(())
}

/// Prints what is kept for the operator: dead messages and rejected deliveries.
async fn show_kept(inbox: &Inbox<Sqlite>) -> Res<()> {
    for dead in inbox.dead().await? {
        let (id, attempts) = (&dead.message_id, dead.attempt_count);
        let error = dead.error_text.as_deref().unwrap_or("-");
        println!("  dead {id}: {attempts} attempts, last error: {error}");
        let payload = dead.payload.unwrap_or_default();
        println!("    payload: {}", String::from_utf8_lossy(&payload));
    }
    for rejected in inbox.rejected().await? {
        let (n, delivery, reason) = (rejected.id, &rejected.delivery_id, &rejected.reason);
        println!("  rejected #{n} ({delivery}): {reason}");
        let bytes = &rejected.payload;
        let text = String::from_utf8_lossy(bytes);
        println!("    {} bytes, exactly as delivered: `{text}`", bytes.len());
    }
    Ok(())
}

/// Everything that must hold at the end; returns what does not.
async fn check(v2: &Inbox<Sqlite>, pool: &SqlitePool, replays: [Outcome; 2]) -> Res<Vec<String>> {
    let mut problems = Vec::new();
    // One row per order: the good ones shipped by v1, the poison one by v2 (through the replay).
    let sql = "SELECT order_id, shipped_by FROM shipments ORDER BY order_id";
    let shipped: Vec<(String, String)> = sqlx::query_as(sql).fetch_all(pool).await?;
    let by = |id: &str| if id == POISON { "v2" } else { "v1" };
    let expected = ORDERS.map(|id| (id.to_owned(), by(id).to_owned()));
    let (rows, orders) = (shipped.len(), ORDERS.len());
    println!("  shipments: {rows} rows for {orders} orders");
    if shipped != expected {
        problems.push(format!("shipments {shipped:?}, expected {expected:?}"));
    }
    if replays != [Outcome::Processed, Outcome::Duplicate] {
        problems.push(format!("the replays gave {replays:?}"));
    }
    let (dead, rejected) = (v2.dead().await?.len(), v2.rejected().await?.len());
    println!("  left: {dead} dead, {rejected} rejected");
    if dead + rejected > 0 {
        problems.push(format!("{dead} dead and {rejected} rejected are left"));
    }
    Ok(problems)
}
