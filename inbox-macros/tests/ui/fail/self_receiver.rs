// A method with a `self` receiver.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

struct Billing;

impl Billing {
    #[inbox_handler(key = "event_id")]
    async fn mark_paid(
        &self,
        _tx: &mut sqlx::PgConnection,
        _msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
