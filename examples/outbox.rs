//! Outbox: an orders service and a billing service that never lose or double an event.
//!
//! The orders service writes each order and its `OrderPlaced` event in one transaction
//! (`outbox::publish`): the event exists exactly when the order does. Two relays publish the
//! outbox to a broker, in order per order, at least once. The billing service consumes
//! `OrderPlaced` through its inbox and, in the same guarded transaction that writes the
//! invoice, publishes `InvoiceIssued` through the outbox (`ctx.publish`). Midway, one relay is
//! killed between the broker's confirm and its commit: what it had published goes out again
//! under the same id, and billing's inbox drops the copies. The program checks that every order
//! has exactly one invoice and one published `InvoiceIssued`, and prints a verdict.
//!
//! `cargo run --example outbox` uses an embedded SQLite file; on PostgreSQL:
//! `DATABASE_URL=postgres://user@host/db cargo run --example outbox`; on MySQL or MariaDB:
//! `DATABASE_URL=mysql://user@host/db cargo run --features mysql --example outbox`.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use inbox::outbox::{self, Relay};
use inbox::prelude::*;
use inbox::{Backend, MemoryBroker, Sink, SinkError, Source};
use sqlx::{Pool, Postgres, Sqlite};
use tokio::sync::watch;

/// How many orders the orders service takes.
const ORDERS: usize = 200;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.placed", aggregate = "order_id")]
struct OrderPlaced {
    order_id: String,
    amount: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "invoice.issued", aggregate = "order_id")]
struct InvoiceIssued {
    invoice_id: String,
    order_id: String,
    amount: i64,
}

/// The example's writes in a database's placeholders: an order, and the invoice billing writes
/// in the transaction that publishes it.
struct ExampleSql {
    order: &'static str,
    invoice: &'static str,
}

/// PostgreSQL's and SQLite's placeholders.
const STANDARD_SQL: ExampleSql = ExampleSql {
    order: "INSERT INTO outbox_orders (order_id, amount) VALUES ($1, $2)",
    invoice: "INSERT INTO outbox_invoices (invoice_id, order_id, amount) VALUES ($1, $2, $3)",
};

/// MySQL's and MariaDB's placeholders.
#[cfg(feature = "mysql")]
const MYSQL_SQL: ExampleSql = ExampleSql {
    order: "INSERT INTO outbox_orders (order_id, amount) VALUES (?, ?)",
    invoice: "INSERT INTO outbox_invoices (invoice_id, order_id, amount) VALUES (?, ?, ?)",
};

/// Billing's work on any database, `insert` in its placeholders: writes the invoice and
/// publishes that it did, in the guarded transaction.
async fn bill<DB: Backend>(
    ctx: &mut Context<'_, DB>,
    placed: OrderPlaced,
    insert: &'static str,
) -> Result<(), HandlerError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    let invoice = InvoiceIssued {
        invoice_id: format!("inv-{}", placed.order_id),
        order_id: placed.order_id,
        amount: placed.amount,
    };
    let insert = sqlx::query(insert)
        .bind(invoice.invoice_id.clone())
        .bind(invoice.order_id.clone());
    insert.bind(invoice.amount).execute(&mut **ctx).await?;
    ctx.publish(&invoice).await?;
    Ok(())
}

#[inbox_handler(key = "order_id")]
async fn bill_sqlite(
    ctx: &mut Context<'_, Sqlite>,
    placed: OrderPlaced,
) -> Result<(), HandlerError> {
    bill(ctx, placed, STANDARD_SQL.invoice).await
}

#[inbox_handler(key = "order_id")]
async fn bill_postgres(
    ctx: &mut Context<'_, Postgres>,
    placed: OrderPlaced,
) -> Result<(), HandlerError> {
    bill(ctx, placed, STANDARD_SQL.invoice).await
}

#[cfg(feature = "mysql")]
#[inbox_handler(key = "order_id")]
async fn bill_mysql(
    ctx: &mut Context<'_, sqlx::MySql>,
    placed: OrderPlaced,
) -> Result<(), HandlerError> {
    bill(ctx, placed, MYSQL_SQL.invoice).await
}

/// The example's tables, dropped and created at each run.
const RESET: [&str; 4] = [
    "DROP TABLE IF EXISTS outbox_orders",
    "DROP TABLE IF EXISTS outbox_invoices",
    "CREATE TABLE outbox_orders (order_id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)",
    // No unique order id: an order billed twice would show as two invoices.
    "CREATE TABLE outbox_invoices (invoice_id VARCHAR(64) NOT NULL, order_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
];

/// The broker's two topics, each a memory broker; the relays publish to them by type tag.
#[derive(Clone, Default)]
struct Topics {
    orders: MemoryBroker,
    invoices: MemoryBroker,
}

impl Sink for Topics {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let broker = match topic {
            "order.placed" => &self.orders,
            "invoice.issued" => &self.invoices,
            other => {
                return Box::pin(
                    async move { Err(SinkError::Refused(format!("no topic `{other}`"))) },
                );
            }
        };
        broker.publish(envelope.clone());
        Box::pin(async { Ok(()) })
    }
}

/// The topics as a relay sees them until it is killed: after `publications`, it never hears
/// from the broker again, like a process killed between the broker's confirms and its commit.
struct Doomed {
    topics: Topics,
    publications: AtomicUsize,
    killed: watch::Sender<bool>,
}

impl Sink for Doomed {
    fn publish<'a>(
        &'a self,
        topic: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            self.topics.publish(topic, envelope).await?;
            if self.publications.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.killed.send_replace(true);
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| fresh_sqlite_file());
    let ok = if url.starts_with("postgres") {
        let connect = || sqlx::PgPool::connect(&url);
        let pools = [connect().await?, connect().await?];
        run::<Postgres, _>(pools, &STANDARD_SQL, bill_postgres).await?
    } else if url.starts_with("sqlite:") {
        let connect =
            || sqlx::SqlitePool::connect_with(inbox::sqlite_options(&url).expect("a SQLite URL"));
        let pools = [connect().await?, connect().await?];
        run::<Sqlite, _>(pools, &STANDARD_SQL, bill_sqlite).await?
    } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        run_mysql(&url.replacen("mariadb:", "mysql:", 1)).await?
    } else {
        let expected = "postgres://, mysql:// or sqlite://";
        return Err(format!("unsupported DATABASE_URL `{url}` ({expected})").into());
    };
    std::process::exit(if ok { 0 } else { 1 })
}

/// The example on MySQL or MariaDB.
#[cfg(feature = "mysql")]
async fn run_mysql(url: &str) -> Result<bool, Box<dyn Error + Send + Sync>> {
    let connect = || sqlx::MySqlPool::connect(url);
    let pools = [connect().await?, connect().await?];
    run::<sqlx::MySql, _>(pools, &MYSQL_SQL, bill_mysql).await
}

/// Without the `mysql` feature, says how to turn it on.
#[cfg(not(feature = "mysql"))]
async fn run_mysql(_: &str) -> Result<bool, Box<dyn Error + Send + Sync>> {
    Err("MySQL needs the `mysql` feature: cargo run --features mysql --example outbox".into())
}

/// The default database: a SQLite file in the temp directory, deleted so every run starts fresh.
fn fresh_sqlite_file() -> String {
    let path = std::env::temp_dir().join("inbox-outbox.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    println!("database: {}", path.display());
    format!("sqlite://{}", path.display())
}

/// Runs both services and both relays on `pools` (two, as two processes would have), kills a
/// relay once, and checks the outcome.
async fn run<DB, H>(
    pools: [Pool<DB>; 2],
    sql: &ExampleSql,
    bill: H,
) -> Result<bool, Box<dyn Error + Send + Sync>>
where
    DB: Backend,
    H: Handler<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (String, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let [pool, other_pool] = pools;
    inbox::migrate(&pool).await?;
    for ddl in RESET.into_iter().chain([
        "DELETE FROM inbox_outbox",
        "DELETE FROM inbox_outbox_streams",
        "DELETE FROM inbox_messages",
    ]) {
        sqlx::query(ddl).execute(&pool).await?;
    }
    let topics = Topics::default();
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut stopped: watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };

    // Two relays, on two pools. The first runs alone until it is killed, mid-batch (alone, so
    // that the second cannot publish everything before the first reaches that point); then the
    // second starts, and the first is started again.
    let (killed, mut was_killed) = watch::channel(false);
    let doomed = Doomed {
        topics: topics.clone(),
        publications: AtomicUsize::new(5),
        killed,
    };
    let relay = |pool: Pool<DB>| {
        Relay::new(pool, topics.clone())
            .batch_size(16)
            .poll_interval(Duration::from_millis(20))
    };
    // Its lease says how soon the others publish again what it had claimed when it died.
    let doomed = Relay::new(pool.clone(), doomed)
        .batch_size(16)
        .poll_interval(Duration::from_millis(20))
        .lease(Duration::from_secs(1));
    let first = tokio::spawn(doomed.run(until_stopped(stopped.clone())));

    let billing = Inbox::builder(pool.clone())
        .consumer("billing")
        .handler(bill)
        .build()
        .await?;
    let billing = Arc::new(billing);
    let consuming = tokio::spawn({
        let (billing, source, stopped) = (
            Arc::clone(&billing),
            topics.orders.source(),
            stopped.clone(),
        );
        async move { billing.run_until(source, until_stopped(stopped)).await }
    });

    place_orders(&pool, sql.order).await?;
    let kill = tokio::time::timeout(
        Duration::from_secs(60),
        was_killed.wait_for(|killed| *killed),
    );
    kill.await
        .map_err(|_| "relay 1 never reached the point it is killed at")??;
    first.abort();
    println!(
        "relay 1 killed mid-batch, after the broker confirmed what it sent; relay 2 starts and \
         relay 1 restarts"
    );
    let second = tokio::spawn(relay(other_pool.clone()).run(until_stopped(stopped.clone())));
    let restarted = tokio::spawn(relay(pool.clone()).run(until_stopped(stopped.clone())));

    wait_until_billed(&pool).await?;
    stop.send_replace(true);
    let billed = consuming.await??;
    let published = second.await?.published + restarted.await?.published;
    println!("relays published {published} messages (plus what relay 1 sent before it died)");
    println!("billing: {:?}", billed.handler_outcomes);
    verdict(&pool, &topics).await
}

/// The orders service: each order and its event in one transaction.
async fn place_orders<DB>(
    pool: &Pool<DB>,
    insert_order: &'static str,
) -> Result<(), Box<dyn Error + Send + Sync>>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    for n in 0..ORDERS {
        let placed = OrderPlaced {
            order_id: format!("order-{n:04}"),
            amount: 100 + n as i64,
        };
        // `Backend::begin`: on SQLite `BEGIN IMMEDIATE`, so that a writer waits for the write
        // lock rather than failing on a snapshot the relays' commits made stale.
        let mut tx = DB::begin(pool).await?;
        sqlx::query(insert_order)
            .bind(placed.order_id.clone())
            .bind(placed.amount)
            .execute(&mut *tx)
            .await?;
        outbox::publish(&mut tx, &placed).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Waits until every order has an invoice and the outbox has published everything.
async fn wait_until_billed<DB: Backend>(pool: &Pool<DB>) -> Result<(), Box<dyn Error + Send + Sync>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    for _ in 0..600 {
        let (invoices,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM outbox_invoices")
            .fetch_one(pool)
            .await?;
        let backlog = outbox::backlog(pool).await?;
        if invoices as usize >= ORDERS && backlog.pending + backlog.failed == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("billing did not finish within a minute".into())
}

/// Every order has exactly one invoice, and one `InvoiceIssued` was published for each (a relay
/// may publish one more than once; the copies share their envelope id).
async fn verdict<DB: Backend>(
    pool: &Pool<DB>,
    topics: &Topics,
) -> Result<bool, Box<dyn Error + Send + Sync>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    (String, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT o.order_id, COUNT(i.invoice_id) FROM outbox_orders o \
         LEFT JOIN outbox_invoices i ON i.order_id = o.order_id GROUP BY o.order_id",
    )
    .fetch_all(pool)
    .await?;
    let wrong: Vec<_> = counts
        .iter()
        .filter(|(_, invoices)| *invoices != 1)
        .collect();
    let issued = drain(&topics.invoices).await?;
    let ids: BTreeSet<&String> = issued.keys().collect();
    let copies: usize = issued.values().map(|copies| copies - 1).sum();
    println!(
        "orders: {}, with exactly one invoice: {}",
        counts.len(),
        counts.len() - wrong.len()
    );
    println!(
        "invoice.issued: {} published, {} copies sent again under the same id",
        ids.len(),
        copies
    );
    let ok = counts.len() == ORDERS && wrong.is_empty() && ids.len() == ORDERS;
    println!(
        "verdict: {}",
        if ok {
            "OK, every order has exactly one invoice"
        } else {
            "FAILED"
        }
    );
    Ok(ok)
}

/// The envelopes on `broker`, by id, with how many times each was published.
async fn drain(
    broker: &MemoryBroker,
) -> Result<BTreeMap<String, usize>, Box<dyn Error + Send + Sync>> {
    broker.close();
    let mut source = broker.source();
    let mut seen = BTreeMap::new();
    while let Some(delivery) = source.next().await? {
        *seen.entry(delivery.envelope().id().to_owned()).or_insert(0) += 1;
        delivery.ack().await?;
    }
    Ok(seen)
}
