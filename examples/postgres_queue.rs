//! Two services on one PostgreSQL and no broker: the shop places orders and, in the same
//! transaction, enqueues `order.placed` to the queue `billing`; billing consumes the queue into
//! an inbox in the same database and invoices each order once. An order whose transaction rolls
//! back was never enqueued; a message whose handling committed left the queue in that very
//! transaction, so a billing process that died before its acknowledgement would not see it again.
//!
//! `DATABASE_URL=postgres://... cargo run --features postgres-queue --example postgres_queue`
//! (by default `postgres://postgres@127.0.0.1:5432/postgres`); it works in a schema of its own,
//! dropped at the end.

use std::error::Error;
use std::time::Duration;

use inbox::outbox::AGGREGATE_ID;
use inbox::postgres_queue::{PgQueueSource, enqueue};
use inbox::prelude::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

/// The shop placed an order.
#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.placed")]
struct OrderPlaced {
    order_id: String,
    amount: i64,
}

/// Billing's handler: one invoice per order, written with the inbox's bookkeeping.
#[inbox_handler(key = "order_id", aggregate = "order_id")]
async fn invoice(tx: &mut PgConnection, placed: OrderPlaced) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO invoices (order_id, amount) VALUES ($1, $2)")
        .bind(&placed.order_id)
        .bind(placed.amount)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The shop: places `orders` orders, each with its `order.placed` in the same transaction; every
/// fifth one is rolled back (a payment declined, say). Returns how many were committed.
async fn place_orders(pool: &PgPool, orders: usize) -> Result<usize, Box<dyn Error + Send + Sync>> {
    let mut committed = 0;
    for n in 0..orders {
        let placed = OrderPlaced {
            order_id: format!("order-{n}"),
            amount: 100 + n as i64,
        };
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, amount) VALUES ($1, $2)")
            .bind(&placed.order_id)
            .bind(placed.amount)
            .execute(&mut *tx)
            .await?;
        let envelope = Envelope::encode(format!("{}-placed", placed.order_id), &placed)?
            .with_header(AGGREGATE_ID, placed.order_id.as_str());
        enqueue(&mut *tx, "billing", &envelope).await?;
        if n % 5 == 4 {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
            committed += 1;
        }
    }
    Ok(committed)
}

/// A pool on a fresh schema of its own in the database at `url`, and the schema's name.
async fn own_schema(url: &str) -> Result<(PgPool, String), Box<dyn Error + Send + Sync>> {
    let schema = format!("inbox_queue_example_{}", std::process::id());
    let admin = PgPool::connect(url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await?;
    let options: PgConnectOptions = url.parse()?;
    let options = options.options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new().connect_with(options).await?;
    Ok((pool, schema))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let (pool, schema) = own_schema(&url).await?;
    inbox::migrate(&pool).await?;
    for ddl in [
        "CREATE TABLE orders (id text PRIMARY KEY, amount bigint NOT NULL)",
        "CREATE TABLE invoices (order_id text PRIMARY KEY, amount bigint NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await?;
    }

    let committed = place_orders(&pool, 50).await?;
    println!("shop: 50 orders placed, {committed} committed with their `order.placed`");

    let billing = Inbox::builder(pool.clone())
        .consumer("billing")
        .handler(invoice)
        .build()
        .await?;
    let source = PgQueueSource::builder(&pool, "billing").build().await?;
    let queue = pool.clone();
    let drained = async move {
        for _ in 0..300 {
            let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM inbox_queue")
                .fetch_one(&queue)
                .await
                .unwrap_or(-1);
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let report = billing.run_until(source, drained).await?;
    println!("billing: {report:?}");

    let (invoices, orphans): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM invoices), \
                (SELECT COUNT(*) FROM invoices i WHERE NOT EXISTS \
                    (SELECT 1 FROM orders o WHERE o.id = i.order_id))",
    )
    .fetch_one(&pool)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await?;
    if invoices != committed as i64 || orphans != 0 {
        return Err(format!(
            "billing wrong: {invoices} invoices for {committed} orders, {orphans} for orders never placed"
        )
        .into());
    }
    println!(
        "billing exact: {invoices} invoices, one per committed order; none for the rolled-back ones; the queue is empty"
    );
    Ok(())
}
