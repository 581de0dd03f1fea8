// `#[message]` takes a list of arguments, not `= value`.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message = "order.paid"]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
