// `Message` needs `Serialize` and `Deserialize` as well.
use inbox::prelude::*;

#[derive(Debug, Clone, Message)]
struct OrderPaid {
    event_id: Uuid,
}

fn main() {}
