// A handler named with a raw identifier: its default dedup scope is the name without `r#`.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct OrderPaid {
    event_id: Uuid,
}

#[inbox_handler(key = "event_id")]
async fn r#match(_msg: OrderPaid) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {
    assert_eq!(Handler::<sqlx::Sqlite>::name(&r#match), "match");
}
