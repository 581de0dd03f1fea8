//! `inbox conflicts ...`: the deliveries whose id was seen before with other content.

use inbox_core::storage::operators;
use inbox_core::{Backend, MessageKey};
use sqlx::Pool;

use crate::cli::{ConflictsArgs, ConflictsCommand};
use crate::consumer;
use crate::error::CliError;
use crate::output::{ConflictDetail, ConflictList, Output};

/// Runs a conflict command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: ConflictsArgs,
    out: &Output,
) -> Result<(), CliError> {
    let named = args.consumer.consumer;
    match args.command {
        ConflictsCommand::List => {
            let conflicts = operators::conflicts(pool, named.as_deref()).await?;
            let (_, searched) = consumer::listed(pool, named).await?;
            out.emit(&ConflictList::new(searched, conflicts))
        }
        ConflictsCommand::Show { id } => {
            let conflict = operators::conflict(pool, id).await?;
            let theirs = |conflict: &operators::Conflict| {
                named
                    .as_ref()
                    .is_none_or(|named| *named == conflict.consumer)
            };
            let conflict = conflict.filter(theirs).ok_or(CliError::NoSuchConflict {
                id,
                consumer: named,
            })?;
            let key = MessageKey {
                consumer: &conflict.consumer,
                handler: &conflict.handler,
                message_id: &conflict.message_id,
            };
            let stored = operators::show(pool, &key).await?;
            out.emit(&ConflictDetail::new(conflict, stored))
        }
    }
}
