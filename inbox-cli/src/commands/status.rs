//! `inbox status`.

use inbox_core::Backend;
use sqlx::Pool;

use crate::error::CliError;
use crate::output::{Output, StatusView};

/// Prints the counts by status per consumer and handler, the rejected deliveries and the
/// storage size.
pub async fn show<DB: Backend>(pool: &Pool<DB>, out: &Output) -> Result<(), CliError> {
    let status = inbox_core::status(pool).await?;
    out.emit(&StatusView::from(status))
}
