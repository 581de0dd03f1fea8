// `Message` derived on a tuple struct: handlers name fields.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid(Uuid, String);

fn main() {}
