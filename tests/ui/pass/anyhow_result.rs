// A handler may return `anyhow::Result<()>`.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(tx: &mut sqlx::PgConnection, msg: OrderPaid) -> anyhow::Result<()> {
    anyhow::ensure!(!msg.order_id.is_empty(), "an order id is required");
    sqlx::query("UPDATE orders SET paid = true WHERE id = $1")
        .bind(&msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn assert_handler<H: Handler<sqlx::Postgres, Message = OrderPaid>>(_: H) {}

fn main() {
    assert_handler(mark_paid);
}
