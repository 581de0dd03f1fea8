// The design's example: a handler on a PostgreSQL connection with key, sequence and aggregate.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.paid")]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
    amount: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> Result<(), HandlerError> {
    sqlx::query("UPDATE orders SET status = 'PAID', paid_amount = $1 WHERE id = $2")
        .bind(msg.amount)
        .bind(&msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

#[allow(dead_code)]
async fn process(pool: &sqlx::PgPool, msg: OrderPaid) -> Result<Outcome, inbox::Error> {
    mark_paid.process(pool, msg).await
}

fn main() {
    assert_handler(mark_paid);
    assert_eq!(mark_paid.name(), "mark_paid");
}
