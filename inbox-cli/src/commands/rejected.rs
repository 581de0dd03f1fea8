//! `inbox rejected ...`: list and show rejected deliveries, ask the running consumer to replay
//! one, or discard one.

use inbox_core::storage::operators::{self, KeptRejected, Operator, RejectedState};
use inbox_core::{Backend, Resolution};
use sqlx::Pool;

use crate::cli::{Confirm, RejectedArgs, RejectedCommand};
use crate::consumer;
use crate::error::CliError;
use crate::output::{Output, RejectedAction, RejectedDetail, RejectedList, RejectedResolved};
use crate::prompt;

/// Runs a rejected-delivery command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: RejectedArgs,
    out: &Output,
) -> Result<(), CliError> {
    let named = args.consumer.consumer;
    match args.command {
        RejectedCommand::List => {
            let kept = operators::kept_rejected(pool, named.as_deref()).await?;
            let (_, searched) = consumer::listed(pool, named).await?;
            out.emit(&RejectedList::new(searched, kept))
        }
        RejectedCommand::Show(delivery) => {
            let kept = find(pool, named, delivery.id).await?;
            let actions = operators::rejected_history(pool, delivery.id).await?;
            out.emit(&RejectedDetail::new(kept, actions))
        }
        RejectedCommand::Replay { delivery, decision } => {
            let kept = find(pool, named, delivery.id).await?;
            let by = Operator {
                by: &decision.operator.by,
                reason: &decision.reason,
            };
            replay(pool, &kept, by, out).await
        }
        RejectedCommand::Discard { delivery, decision } => {
            let kept = find(pool, named, delivery.id).await?;
            let by = Operator {
                by: &decision.operator.by,
                reason: &decision.reason,
            };
            discard(pool, &kept, by, &decision.confirm, out).await
        }
    }
}

/// Rejected delivery `id`, of the consumer named if one was, or [`CliError::NoSuchRejected`].
async fn find<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    id: i64,
) -> Result<KeptRejected, CliError> {
    let kept = operators::rejected_by_id(pool, id).await?;
    let kept = consumer::theirs(kept, named.as_deref(), |kept| kept.consumer.as_str());
    kept.ok_or(CliError::NoSuchRejected {
        id,
        consumer: named,
    })
}

/// Asks the running consumer to dispatch a waiting rejected delivery again.
async fn replay<DB: Backend>(
    pool: &Pool<DB>,
    kept: &KeptRejected,
    operator: Operator<'_>,
    out: &Output,
) -> Result<(), CliError> {
    let not_waiting = |state| CliError::RejectedNotWaiting {
        id: kept.delivery.id,
        state,
        what: "only a waiting delivery can be replayed",
    };
    if kept.state != RejectedState::Waiting {
        return Err(not_waiting(kept.state));
    }
    let (consumer, id) = (kept.consumer.as_str(), kept.delivery.id);
    if !operators::request_rejected_replay(pool, consumer, id, operator).await? {
        return Err(state_now(pool, id, not_waiting).await?);
    }
    out.emit(&RejectedResolved::new(
        RejectedAction::ReplayRequested,
        kept,
        operator,
    ))
}

/// Discards a rejected delivery (waiting, or whose replay was requested), once the operator
/// confirms.
async fn discard<DB: Backend>(
    pool: &Pool<DB>,
    kept: &KeptRejected,
    operator: Operator<'_>,
    confirm: &Confirm,
    out: &Output,
) -> Result<(), CliError> {
    let resolved = |state| CliError::RejectedNotWaiting {
        id: kept.delivery.id,
        state,
        what: "it is resolved already",
    };
    if matches!(
        kept.state,
        RejectedState::Replayed | RejectedState::Discarded
    ) {
        return Err(resolved(kept.state));
    }
    let question = format!(
        "Discard rejected delivery {} (`{}`, consumer `{}`)? It will never be dispatched.",
        kept.delivery.id, kept.delivery.message_type, kept.consumer
    );
    prompt::confirm(&question, confirm).await?;
    let resolution = Resolution {
        replay: false,
        by: operator.by,
        reason: operator.reason,
    };
    let (consumer, id) = (kept.consumer.as_str(), kept.delivery.id);
    if !operators::resolve_rejected(pool, consumer, id, &resolution).await? {
        return Err(state_now(pool, id, resolved).await?);
    }
    out.emit(&RejectedResolved::new(
        RejectedAction::Discarded,
        kept,
        operator,
    ))
}

/// The error for delivery `id`, which changed under the command: what `error` says of its
/// state now.
async fn state_now<DB: Backend>(
    pool: &Pool<DB>,
    id: i64,
    error: impl Fn(RejectedState) -> CliError,
) -> Result<CliError, CliError> {
    Ok(match operators::rejected_by_id(pool, id).await? {
        Some(kept) => error(kept.state),
        None => CliError::NoSuchRejected { id, consumer: None },
    })
}
