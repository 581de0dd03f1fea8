// A macro error, and uses of the handler as a `Handler` value.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequnce = "sequence")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[allow(dead_code)]
async fn process(pool: &sqlx::PgPool, msg: OrderPaid) -> Result<Outcome, inbox::Error> {
    mark_paid.process(pool, msg).await
}

#[allow(dead_code)]
fn register(pool: sqlx::PgPool) {
    let _ = Inbox::builder(pool).handler(mark_paid);
}

fn main() {}
