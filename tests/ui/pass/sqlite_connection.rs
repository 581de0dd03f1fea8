// A handler on a SQLite connection.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn mark_paid(tx: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), HandlerError> {
    sqlx::query("UPDATE orders SET paid = 1 WHERE id = $1")
        .bind(msg.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn assert_handler<H: Handler<sqlx::Sqlite, Message = OrderPaid>>(_: H) {}

fn main() {
    assert_handler(mark_paid);
}
