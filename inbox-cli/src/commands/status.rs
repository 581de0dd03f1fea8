//! `inbox status`.

use inbox_core::Backend;
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{Output, StatusView};

/// Prints the counts by status per consumer and handler, the rejected deliveries, the outbox
/// backlog and the storage size.
pub async fn show<DB: Backend>(pool: &Pool<DB>, out: &Output) -> Result<(), CliError> {
    let status = inbox_core::status(pool).await?;
    let backlog = inbox_core::outbox::backlog(pool).await?;
    out.emit(&StatusView::new(
        status,
        backlog,
        inbox_core::outbox::now_ms(),
    ))
}
