//! `inbox gap skip`: skip a strict-ordering gap whose predecessor is known to be lost.

use inbox_core::storage::operators::{self, Operator};
use inbox_core::{Backend, DeadLetterFilter, DeadReason, StoredMessage, Stream};
use sqlx::Pool;

use crate::cli::{GapArgs, GapCommand};
use crate::consumer::{self, Holder};
use crate::error::CliError;
use crate::output::{GapSkipped, Output};
use crate::prompt;

/// Runs a gap command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: GapArgs,
    out: &Output,
) -> Result<(), CliError> {
    let GapCommand::Skip {
        handler,
        aggregate,
        operator,
        reason,
        confirm,
    } = args.command;
    let consumer = consumer_waiting(pool, args.consumer.consumer, &handler, &aggregate).await?;
    let stream = Stream {
        consumer: &consumer,
        handler: &handler,
        aggregate: &aggregate,
    };
    let question = format!(
        "Skip the gap in front of aggregate `{aggregate}` of handler `{handler}` (consumer \
         `{consumer}`)? Its missing messages will be skipped as stale if they ever arrive."
    );
    prompt::confirm(&question, &confirm).await?;
    let by = Operator {
        by: &operator.by,
        reason: &reason,
    };
    operators::open_gap(pool, &stream, Some(by)).await?;
    out.emit(&GapSkipped {
        consumer: consumer.clone(),
        handler: handler.clone(),
        aggregate: aggregate.clone(),
        by: operator.by,
        reason,
    })
}

/// The consumer whose stream of `aggregate` waits behind a gap: the one `--consumer` names, or
/// the only one whose does. Fails with [`CliError::NoGap`] when none does: skipping a gap on any
/// other stream would only create its row.
async fn consumer_waiting<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    handler: &str,
    aggregate: &str,
) -> Result<String, CliError> {
    let waits = async |consumer: &str| {
        let stream = Stream {
            consumer,
            handler,
            aggregate,
        };
        waiting(pool, &stream).await
    };
    match consumer::holding(pool, named, waits).await? {
        Holder::One(consumer) => Ok(consumer),
        Holder::Nobody(searched) => Err(CliError::NoGap {
            searched,
            handler: handler.to_owned(),
            aggregate: aggregate.to_owned(),
        }),
        Holder::Several(consumers) => Err(CliError::SeveralConsumers {
            what: format!("the gap of aggregate `{aggregate}` of handler `{handler}`"),
            consumers,
        }),
    }
}

/// Whether messages of `stream` are parked, or dead because their gap timed out.
async fn waiting<DB: Backend>(pool: &Pool<DB>, stream: &Stream<'_>) -> Result<bool, CliError> {
    if inbox_core::storage::streams::has_parked(pool, stream).await? {
        return Ok(true);
    }
    let filter = DeadLetterFilter::default().handler(stream.handler);
    let dead = operators::dead_letters(pool, stream.consumer, &filter).await?;
    let behind_gap = |message: &StoredMessage| {
        message.aggregate_id.as_deref() == Some(stream.aggregate)
            && message.dead_reason == Some(DeadReason::GapTimeout)
    };
    Ok(dead.iter().any(behind_gap))
}
