//! What an operator sees first: how many messages each handler holds in each state.

use sqlx::Pool;

use crate::error::Error;
use crate::storage::operators::HandlerStatus;
use crate::storage::{Backend, operators};

/// The state of an inbox database, over every consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// Per consumer and handler: rows by status and the oldest parked message.
    pub handlers: Vec<HandlerStatus>,
    /// Per consumer: rejected deliveries not resolved yet (waiting for an operator, or for the
    /// running consumer to replay them).
    pub rejected: Vec<(String, i64)>,
    /// Per consumer and handler: conflicting deliveries (an id seen before with other content)
    /// waiting for an operator.
    pub conflicts: Vec<(String, String, i64)>,
    /// The space the inbox takes, in bytes (PostgreSQL: its tables with their indexes; SQLite:
    /// the whole database file).
    pub storage_bytes: i64,
}

/// Reads the [`Status`] of the inbox behind `pool`. It counts every row, so on a large table it
/// takes as long as a scan: an operator's command, not something to poll.
pub async fn status<DB: Backend>(pool: &Pool<DB>) -> Result<Status, Error> {
    Ok(Status {
        handlers: operators::status(pool).await?,
        rejected: operators::rejected_counts(pool).await?,
        conflicts: operators::conflict_counts(pool).await?,
        storage_bytes: operators::storage_bytes(pool).await?,
    })
}
