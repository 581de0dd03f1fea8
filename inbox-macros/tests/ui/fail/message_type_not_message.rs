// The message type does not derive `Message`.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(key = "event_id")]
async fn mark_paid(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
