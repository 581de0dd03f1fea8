// The type tag must be a string literal.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = order_paid)]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
