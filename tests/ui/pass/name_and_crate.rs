// `name = "..."` sets the dedup scope; `crate = "..."` finds inbox through a re-export.
mod reexport {
    pub use inbox;
}

use reexport::inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.paid", crate = "reexport::inbox")]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(
    key = "event_id",
    name = "billing.mark_paid",
    crate = "reexport::inbox"
)]
async fn mark_paid(
    _tx: &mut sqlx::PgConnection,
    _msg: OrderPaid,
) -> Result<(), reexport::inbox::HandlerError> {
    Ok(())
}

fn main() {
    assert_eq!(<OrderPaid as reexport::inbox::Message>::TYPE, "order.paid");
    assert_eq!(
        reexport::inbox::Handler::<sqlx::Postgres>::name(&mark_paid),
        "billing.mark_paid"
    );
}
