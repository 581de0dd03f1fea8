// A PostgreSQL handler processed on a SQLite pool.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[allow(dead_code)]
async fn process(pool: &sqlx::SqlitePool, msg: OrderPaid) -> Result<Outcome, inbox::Error> {
    mark_paid.process(pool, msg).await
}

fn main() {}
