// A generic message type: its type tag would name many types.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct Event<T> {
    event_id: Uuid,
    body: T,
}

fn main() {}
