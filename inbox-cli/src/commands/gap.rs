//! `inbox gap skip`: skip a strict-ordering gap whose predecessor is known to be lost.

use inbox_core::{Backend, DeadLetterFilter, DeadReason, StoredMessage, Stream};
use sqlx::Pool;

use crate::cli::{GapArgs, GapCommand};
use crate::error::CliError;
use crate::output::{GapSkipped, Output};
use crate::prompt;

/// Runs a gap command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: GapArgs,
    out: &Output,
) -> Result<(), CliError> {
    let consumer = args.consumer.consumer;
    let GapCommand::Skip {
        handler,
        aggregate,
        confirm,
    } = args.command;
    let stream = Stream {
        consumer: &consumer,
        handler: &handler,
        aggregate: &aggregate,
    };
    ensure_waiting(pool, &stream).await?;
    let question = format!(
        "Skip the gap in front of aggregate `{aggregate}` of handler `{handler}` (consumer \
         `{consumer}`)? Its missing messages will be skipped as stale if they ever arrive."
    );
    prompt::confirm(&question, &confirm).await?;
    inbox_core::open_gap(pool, &stream).await?;
    out.emit(&GapSkipped {
        consumer: consumer.clone(),
        handler: handler.clone(),
        aggregate: aggregate.clone(),
    })
}

/// Fails with [`CliError::NoGap`] unless messages of `stream` are parked, or dead because their gap
/// timed out: skipping a gap on any other stream would only create its row.
async fn ensure_waiting<DB: Backend>(pool: &Pool<DB>, stream: &Stream<'_>) -> Result<(), CliError> {
    if inbox_core::storage::streams::has_parked(pool, stream).await? {
        return Ok(());
    }
    let filter = DeadLetterFilter::default().handler(stream.handler);
    let dead = inbox_core::storage::operators::dead_letters(pool, stream.consumer, &filter).await?;
    let behind_gap = |message: &StoredMessage| {
        message.aggregate_id.as_deref() == Some(stream.aggregate)
            && message.dead_reason == Some(DeadReason::GapTimeout)
    };
    if dead.iter().any(behind_gap) {
        return Ok(());
    }
    Err(CliError::NoGap {
        consumer: stream.consumer.to_owned(),
        handler: stream.handler.to_owned(),
        aggregate: stream.aggregate.to_owned(),
    })
}
