// A misspelled `#[message(...)]` argument.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(nmae = "order.paid")]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
