// `aggregate` names a field the message does not have.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    event_id: Uuid,
    order_id: String,
}

fn main() {}
