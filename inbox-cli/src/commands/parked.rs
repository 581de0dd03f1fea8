//! `inbox parked ...`.

use inbox_core::storage::operators;
use inbox_core::{Backend, MessageStatus};
use sqlx::Pool;

use crate::cli::{ParkedArgs, ParkedCommand};
use crate::consumer;
use crate::error::CliError;
use crate::output::{ListKind, MessageList, Output};

/// Runs a parked-message command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: ParkedArgs,
    out: &Output,
) -> Result<(), CliError> {
    match args.command {
        ParkedCommand::List => {
            let parked =
                async |consumer: &str| operators::list(pool, consumer, MessageStatus::Parked).await;
            let (parked, searched) = consumer::gather(pool, args.consumer.consumer, parked).await?;
            out.emit(&MessageList::new(ListKind::Parked, searched, parked))
        }
    }
}
