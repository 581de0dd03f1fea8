// `Message` derived on a unit struct: there is no field to key on.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct Tick;

fn main() {}
