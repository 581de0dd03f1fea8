// Strict ordering, with and without a gap timeout: the handler reports it.
use inbox::prelude::*;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
    order_id: String,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id", ordering = "strict")]
async fn by_default(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(
    key = "event_id",
    sequence = "sequence",
    aggregate = "order_id",
    ordering = "strict",
    gap_timeout = "15m"
)]
async fn with_timeout(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id", ordering = "monotonic")]
async fn monotonic(_tx: &mut sqlx::PgConnection, _msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn ordering<H: Handler<sqlx::Postgres>>(handler: H) -> inbox::Ordering {
    handler.ordering()
}

fn main() {
    let strict = |gap_timeout| inbox::Ordering::Strict { gap_timeout };
    assert_eq!(ordering(by_default), strict(inbox::DEFAULT_GAP_TIMEOUT));
    assert_eq!(ordering(with_timeout), strict(Duration::from_secs(900)));
    assert_eq!(ordering(monotonic), inbox::Ordering::Monotonic);
}
