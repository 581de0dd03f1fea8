// A macro error does not break plain calls of the function.
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
async fn unit_test(conn: &mut sqlx::PgConnection, msg: OrderPaid) -> Result<(), HandlerError> {
    mark_paid(conn, msg).await
}

fn main() {}
