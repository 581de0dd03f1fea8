//! `inbox parked ...`.

use inbox_core::Backend;
use sqlx::Pool;

use crate::cli::{ParkedArgs, ParkedCommand};
use crate::error::CliError;
use crate::output::{ListKind, MessageList, Output};

/// Runs a parked-message command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: ParkedArgs,
    out: &Output,
) -> Result<(), CliError> {
    let consumer = args.consumer.consumer;
    match args.command {
        ParkedCommand::List => {
            let parked = inbox_core::storage::operators::list(
                pool,
                &consumer,
                inbox_core::MessageStatus::Parked,
            )
            .await?;
            out.emit(&MessageList::new(ListKind::Parked, &consumer, parked))
        }
    }
}
