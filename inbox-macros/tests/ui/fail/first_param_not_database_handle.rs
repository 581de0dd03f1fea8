// The first parameter is `&mut` something that is not a database handle.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_log: &mut String, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
