//! `inbox outbox ...`: list the outbox, and retry what the relay gave up on.

use inbox_core::Backend;
use inbox_core::outbox::{self, OutboxStatus};
use sqlx::Pool;

use crate::cli::{Confirm, OutboxCommand, OutboxRetryArgs};
use crate::error::CliError;
use crate::output::{OutboxList, OutboxRetried, Output};
use crate::prompt;

/// Runs an outbox command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    command: OutboxCommand,
    out: &Output,
) -> Result<(), CliError> {
    match command {
        OutboxCommand::List { status, limit } => {
            let status = status.map(OutboxStatus::from);
            let messages = outbox::list(pool, status, limit).await?;
            out.emit(&OutboxList::new(status, limit, messages))
        }
        OutboxCommand::Retry(OutboxRetryArgs { id: Some(id), .. }) => {
            retry_one(pool, &id, out).await
        }
        // Without an id, clap has required `--all-failed`.
        OutboxCommand::Retry(OutboxRetryArgs { confirm, .. }) => {
            retry_all_failed(pool, &confirm, out).await
        }
    }
}

/// Makes the failed message `id` pending again, or fails with
/// [`CliError::NoFailedOutboxMessage`].
async fn retry_one<DB: Backend>(pool: &Pool<DB>, id: &str, out: &Output) -> Result<(), CliError> {
    match outbox::retry(pool, Some(id)).await? {
        0 => Err(CliError::NoFailedOutboxMessage(id.to_owned())),
        _ => out.emit(&OutboxRetried::one(id)),
    }
}

/// Makes every failed message pending again, once the operator confirms (nothing is asked when
/// none has failed).
async fn retry_all_failed<DB: Backend>(
    pool: &Pool<DB>,
    confirm: &Confirm,
    out: &Output,
) -> Result<(), CliError> {
    let failed = outbox::backlog(pool).await?.failed;
    if failed == 0 {
        return out.emit(&OutboxRetried::all(0));
    }
    let question = format!(
        "Make {failed} failed outbox messages pending again? The running relay publishes them, \
         and the broker may refuse them again."
    );
    prompt::confirm(&question, confirm).await?;
    let retried = outbox::retry(pool, None).await?;
    out.emit(&OutboxRetried::all(retried))
}
