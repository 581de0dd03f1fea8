// A `key` field whose type has no stable text form.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct PriceChanged {
    price: f64,
}

#[inbox_handler(key = "price")]
async fn reprice(_tx: &mut sqlx::PgConnection, _msg: PriceChanged) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
