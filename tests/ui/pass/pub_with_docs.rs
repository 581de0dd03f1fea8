// A `pub` handler with doc comments, in a module with `missing_docs` denied: the docs land on the
// handler value and it stays reachable from outside the module.
#![deny(missing_docs)]
//! A crate with documented handlers.

mod billing {
    use inbox::prelude::*;

    /// An order was paid.
    #[derive(Debug, Clone, Serialize, Deserialize, Message)]
    pub struct OrderPaid {
        /// The event's id.
        pub event_id: Uuid,
    }

    /// Marks the order as paid.
    ///
    /// Runs once per `event_id`.
    #[inbox_handler(key = "event_id")]
    pub async fn mark_paid(
        _tx: &mut sqlx::SqliteConnection,
        _msg: OrderPaid,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn assert_handler<H: inbox::Handler<sqlx::Sqlite, Message = billing::OrderPaid>>(_: H) {}

fn main() {
    assert_handler(billing::mark_paid);
}
