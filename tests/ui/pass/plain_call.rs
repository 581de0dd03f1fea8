// The annotated name stays callable as the plain, unguarded function.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_tx: &mut sqlx::SqliteConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(key = "event_id")]
async fn log_payment(_msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[allow(dead_code)]
async fn unit_test(conn: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), HandlerError> {
    mark_paid(&mut *conn, msg.clone()).await?;
    mark_paid(conn, msg.clone()).await?;
    log_payment(msg).await
}

fn main() {}
