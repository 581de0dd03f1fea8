// Strict ordering holds a message until its predecessor applied: it needs a sequence.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", aggregate = "order_id", ordering = "strict")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
