// A gap timeout needs a number and a unit.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id", ordering = "strict", gap_timeout = "ten minutes")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
