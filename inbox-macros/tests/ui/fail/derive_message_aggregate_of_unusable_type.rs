// `aggregate` names a field whose type has no stable text form.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.placed", aggregate = "total")]
struct OrderPlaced {
    event_id: Uuid,
    total: f64,
}

fn main() {}
