// `Message` derived on an enum.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
enum OrderEvent {
    Paid { event_id: Uuid },
    Shipped { event_id: Uuid },
}

fn main() {}
