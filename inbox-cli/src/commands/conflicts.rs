//! `inbox conflicts ...`: the deliveries whose id was seen before with other content.

use inbox_core::storage::operators::{self, Conflict, Operator};
use inbox_core::{Backend, MessageKey};
use sqlx::Pool;

use crate::cli::{ConflictsArgs, ConflictsCommand, DiscardDecision};
use crate::consumer;
use crate::error::CliError;
use crate::output::{ConflictDetail, ConflictDiscarded, ConflictList, Output};
use crate::prompt;

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
        ConflictsCommand::Show(conflict) => {
            let conflict = find(pool, named, conflict.id).await?;
            let key = MessageKey {
                consumer: &conflict.consumer,
                handler: &conflict.handler,
                message_id: &conflict.message_id,
            };
            let stored = operators::show(pool, &key).await?;
            out.emit(&ConflictDetail::new(conflict, stored))
        }
        ConflictsCommand::Discard { conflict, decision } => {
            let conflict = find(pool, named, conflict.id).await?;
            discard(pool, &conflict, &decision, out).await
        }
    }
}

/// Conflict `id`, of the consumer named if one was, or [`CliError::NoSuchConflict`].
async fn find<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    id: i64,
) -> Result<Conflict, CliError> {
    let conflict = operators::conflict(pool, id).await?;
    let conflict = consumer::theirs(conflict, named.as_deref(), |c| c.consumer.as_str());
    conflict.ok_or(CliError::NoSuchConflict {
        id,
        consumer: named,
    })
}

/// Gives up on a conflict, once the operator confirms.
async fn discard<DB: Backend>(
    pool: &Pool<DB>,
    conflict: &Conflict,
    decision: &DiscardDecision,
    out: &Output,
) -> Result<(), CliError> {
    let question = format!(
        "Discard conflict {} (message `{}` of handler `{}`, consumer `{}`)? It will no longer be \
         listed.",
        conflict.id, conflict.message_id, conflict.handler, conflict.consumer
    );
    prompt::confirm(&question, &decision.confirm).await?;
    let operator = Operator {
        by: &decision.operator.by,
        reason: &decision.reason,
    };
    if !operators::discard_conflict(pool, conflict.id, operator).await? {
        return Err(CliError::ConflictResolved(conflict.id));
    }
    out.emit(&ConflictDiscarded::new(conflict, operator))
}
