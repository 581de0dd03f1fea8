// A message that names its aggregate: the outbox publishes it in order within it.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.placed", aggregate = "order_id")]
struct OrderPlaced {
    event_id: Uuid,
    order_id: u64,
}

fn main() {
    let placed = OrderPlaced { event_id: Uuid::nil(), order_id: 7 };
    assert_eq!(placed.aggregate().as_deref(), Some("7"));
}
