// A handler without a return type.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) {}

fn main() {}
