// A handler on `&mut inbox::Context<'_, DB>`: the transaction plus the message's metadata.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn mark_paid(
    ctx: &mut inbox::Context<'_, sqlx::Sqlite>,
    msg: OrderPaid,
) -> Result<(), HandlerError> {
    let _aggregate: Option<&str> = ctx.aggregate();
    let _sequence: Option<i64> = ctx.sequence();
    sqlx::query("UPDATE orders SET paid = 1 WHERE id = $1")
        .bind(msg.order_id)
        .execute(&mut **ctx)
        .await?;
    Ok(())
}

fn assert_handler<H: Handler<sqlx::Sqlite, Message = OrderPaid>>(_: H) {}

fn main() {
    assert_handler(mark_paid);
}
