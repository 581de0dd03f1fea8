// `#[message(name)]` given twice.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.paid", name = "order.settled")]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
