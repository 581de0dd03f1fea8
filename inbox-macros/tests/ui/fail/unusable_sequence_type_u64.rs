// A `sequence` field that does not fit in an `i64`.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: u64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
