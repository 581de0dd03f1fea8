// A handler with more parameters than a handle, its state and the message.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[derive(Clone)]
struct Rates;

#[inbox_handler(key = "event_id")]
async fn mark_paid(
    _tx: &mut sqlx::PgConnection,
    _rates: State<Rates>,
    _msg: OrderPaid,
    _retries: u32,
) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
