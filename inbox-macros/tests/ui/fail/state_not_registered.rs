// A handler that takes state, registered on a builder that has none.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[derive(Clone)]
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

fn main() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    let _ = Inbox::builder(pool).handler(book_vat);
}
