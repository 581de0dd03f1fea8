// An empty type tag.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "")]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
