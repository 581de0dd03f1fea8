// A pool is not a handle: the handler writes in the guarded transaction.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_pool: &mut sqlx::PgPool, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
