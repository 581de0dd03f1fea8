// A handler that takes only the message works with every database.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(key = "event_id")]
async fn log_payment(msg: OrderPaid) -> Result<(), HandlerError> {
    let _ = msg.event_id;
    Ok(())
}

fn assert_handler<DB: inbox::Backend, H: Handler<DB, Message = OrderPaid>>(_: H) {}

fn main() {
    assert_handler::<sqlx::Postgres, _>(log_payment);
    assert_handler::<sqlx::Sqlite, _>(log_payment);
}
