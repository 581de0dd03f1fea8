// A handler's state must be `Clone + Send + Sync + 'static`: each call gets its own clone.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

struct Rates {
    vat_percent: i64,
}

#[inbox_handler(key = "event_id")]
async fn book_vat(
    _tx: &mut sqlx::SqliteConnection,
    State(_rates): State<Rates>,
    _msg: OrderPaid,
) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
