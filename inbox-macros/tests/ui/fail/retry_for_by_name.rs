// `retry_for` takes the handler itself, so a misspelt name cannot be silently ignored.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_tx: &mut sqlx::SqliteConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    let _ = Inbox::builder(pool)
        .handler(mark_paid)
        .retry_for("mark_piad", RetryPolicy::new(10));
}
