//! The quickstart's ledger over a real broker, shared by the broker examples: payments published
//! to the broker shuffled and with duplicates, consumed by an inbox on SQLite under strict
//! ordering, and checked: every payment applied once, in order per order.

use std::error::Error;
use std::time::Duration;

use inbox::prelude::*;
use inbox::{Sink, Source};
use sqlx::{SqliteConnection, SqlitePool};

/// A payment to an order, numbered 1, 2, 3, ... per order.
#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "payment.received")]
pub struct PaymentReceived {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    ordering = "strict"
)]
async fn credit(tx: &mut SqliteConnection, p: PaymentReceived) -> Result<(), HandlerError> {
    sqlx::query(
        "INSERT INTO ledger (order_id, balance, credits, last_sequence) VALUES ($1, $2, 1, $3) \
         ON CONFLICT (order_id) DO UPDATE SET balance = ledger.balance + excluded.balance, \
         credits = ledger.credits + 1, last_sequence = excluded.last_sequence \
         WHERE ledger.last_sequence + 1 = excluded.last_sequence",
    )
    .bind(&p.order_id)
    .bind(p.amount)
    .bind(p.sequence)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// `orders × per_order` payments, every third one published twice, in a shuffled order.
fn payments(orders: usize, per_order: i64) -> Vec<PaymentReceived> {
    let mut stream = Vec::new();
    for order in 0..orders {
        for sequence in 1..=per_order {
            let payment = PaymentReceived {
                event_id: Uuid::new_v4(),
                order_id: format!("order-{order}"),
                sequence,
                amount: 10 * sequence,
            };
            if stream.len() % 3 == 0 {
                stream.push(payment.clone());
            }
            stream.push(payment);
        }
    }
    // A fixed shuffle (an LCG): the run is the same every time.
    let mut state: u64 = 2024;
    for i in (1..stream.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        stream.swap(i, (state >> 33) as usize % (i + 1));
    }
    stream
}

/// Publishes the payments to `destination` through `publisher`, consumes them from `source`
/// into a fresh SQLite ledger, and prints the verdict; an inexact ledger is an error.
pub async fn run<S: Source>(
    broker: &str,
    publisher: &impl Sink,
    destination: &str,
    source: S,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    let (orders, per_order) = (20, 10);
    let stream = payments(orders, per_order);
    for payment in &stream {
        // The aggregate's id travels with the message: Kafka keys the record by it, so an order
        // stays on one partition.
        let envelope = Envelope::encode(payment.event_id.to_string(), payment)?
            .with_header(inbox::outbox::AGGREGATE_ID, payment.order_id.as_str());
        publisher.publish(destination, &envelope).await?;
    }
    println!(
        "published {} deliveries of {} payments to {broker}",
        stream.len(),
        orders * per_order as usize
    );

    let path = std::env::temp_dir().join(format!("inbox_broker_example_{}.db", Uuid::new_v4()));
    let pool = SqlitePool::connect_with(inbox::sqlite_options(&format!(
        "sqlite://{}",
        path.display()
    ))?)
    .await?;
    inbox::migrate(&pool).await?;
    sqlx::query("CREATE TABLE ledger (order_id TEXT PRIMARY KEY, balance BIGINT NOT NULL, credits BIGINT NOT NULL, last_sequence BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    let inbox = Inbox::builder(pool.clone())
        .consumer("ledger")
        .handler(credit)
        .build()
        .await?;
    let expected = (orders as i64) * per_order;
    let applied = pool.clone();
    let all_applied = async move {
        for _ in 0..600 {
            let credits: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(credits), 0) FROM ledger")
                .fetch_one(&applied)
                .await
                .unwrap_or_default();
            if credits >= expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let report = inbox.run_until(source, all_applied).await?;
    println!("{report:?}");

    let (credits, balance): (i64, i64) =
        sqlx::query_as("SELECT COALESCE(SUM(credits), 0), COALESCE(SUM(balance), 0) FROM ledger")
            .fetch_one(&pool)
            .await?;
    let expected_balance = (orders as i64) * (1..=per_order).map(|s| 10 * s).sum::<i64>();
    if credits != expected || balance != expected_balance {
        return Err(format!("ledger wrong: {credits} credits (expected {expected}), balance {balance} (expected {expected_balance})").into());
    }
    println!(
        "ledger exact: {credits} payments applied once each, in order per order, balance {balance}"
    );
    Ok(())
}
