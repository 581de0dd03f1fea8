//! `inbox dead ...`: list, show, replay and discard dead letters.

use std::time::Duration;

use inbox_core::storage::operators;
use inbox_core::{Backend, DeadLetterFilter, MessageKey, StoredMessage};
use sqlx::Pool;

use crate::cli::{DeadArgs, DeadCommand, DiscardDecision, MessageArgs, Operator, Page};
use crate::consumer::{self, Holder, Searched};
use crate::error::CliError;
use crate::output::{Action, ListKind, MessageDetail, MessageList, Output, Resolved};
use crate::prompt;

/// Runs a dead-letter command.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: DeadArgs,
    out: &Output,
) -> Result<(), CliError> {
    let named = args.consumer.consumer;
    match args.command {
        DeadCommand::List {
            handler,
            message_type,
            failed_within,
            page,
        } => {
            let filter = filter(handler, message_type, failed_within, page);
            let dead_letters =
                async |consumer: &str| operators::dead_letters(pool, consumer, &filter).await;
            let (dead, searched) = consumer::gather(pool, named, dead_letters).await?;
            out.emit(&MessageList::new(ListKind::Dead, searched, dead))
        }
        DeadCommand::Show(message) => show(pool, named, &message, out).await,
        DeadCommand::Replay { message, decision } => {
            let consumer = consumer_of(pool, named, &message).await?;
            let key = key(&consumer, &message);
            replay(pool, &key, &decision.operator, &decision.reason, out).await
        }
        DeadCommand::Discard { message, decision } => {
            let consumer = consumer_of(pool, named, &message).await?;
            discard(pool, &key(&consumer, &message), &decision, out).await
        }
    }
}

/// Shows everything stored about the message named, whatever its status.
pub async fn show<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    message: &MessageArgs,
    out: &Output,
) -> Result<(), CliError> {
    let consumer = consumer_of(pool, named, message).await?;
    let stored = stored(pool, &key(&consumer, message)).await?;
    let actions = operators::history(pool, &consumer, &stored).await?;
    out.emit(&MessageDetail::new(&consumer, stored, actions))
}

/// The consumer of the message named: the one `--consumer` names, or the only one that stores
/// it.
pub async fn consumer_of<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    message: &MessageArgs,
) -> Result<String, CliError> {
    let stores = async |consumer: &str| {
        let stored = operators::show(pool, &key(consumer, message)).await?;
        Ok(stored.is_some())
    };
    match consumer::holding(pool, named, stores).await? {
        Holder::One(consumer) => Ok(consumer),
        Holder::Nobody(searched) => Err(CliError::NoSuchMessage {
            searched,
            handler: message.handler.clone(),
            message_id: message.message_id.clone(),
        }),
        Holder::Several(consumers) => Err(CliError::SeveralConsumers {
            what: format!(
                "message `{}` of handler `{}`",
                message.message_id, message.handler
            ),
            consumers,
        }),
    }
}

/// The filter of `dead list`.
fn filter(
    handler: Option<String>,
    message_type: Option<String>,
    failed_within: Option<Duration>,
    page: Page,
) -> DeadLetterFilter {
    let mut filter = DeadLetterFilter::default().offset(page.offset);
    if let Some(limit) = page.limit {
        filter = filter.limit(limit);
    }
    if let Some(handler) = handler {
        filter = filter.handler(handler);
    }
    if let Some(message_type) = message_type {
        filter = filter.message_type(message_type);
    }
    if let Some(age) = failed_within {
        filter = filter.failed_within(age);
    }
    filter
}

/// Asks the running consumer to handle a dead message again.
async fn replay<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    operator: &Operator,
    reason: &str,
    out: &Output,
) -> Result<(), CliError> {
    ensure_dead(pool, key).await?;
    inbox_core::request_replay(pool, key, (&operator.by, reason)).await?;
    out.emit(&resolved(Action::ReplayRequested, key, operator, reason))
}

/// Discards a dead message, once the operator confirms.
async fn discard<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    decision: &DiscardDecision,
    out: &Output,
) -> Result<(), CliError> {
    let (operator, reason) = (&decision.operator, decision.reason.as_str());
    ensure_dead(pool, key).await?;
    let question = format!(
        "Discard dead message `{}` of handler `{}` (consumer `{}`)? It will never be handled.",
        key.message_id, key.handler, key.consumer
    );
    prompt::confirm(&question, &decision.confirm).await?;
    inbox_core::discard(pool, key, (&operator.by, reason)).await?;
    out.emit(&resolved(Action::Discarded, key, operator, reason))
}

/// The stored message `key`, or [`CliError::NoSuchMessage`].
async fn stored<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
) -> Result<StoredMessage, CliError> {
    let stored = operators::show(pool, key).await?;
    stored.ok_or_else(|| CliError::NoSuchMessage {
        searched: Searched::Consumer {
            named: key.consumer.to_owned(),
            existing: vec![key.consumer.to_owned()],
        },
        handler: key.handler.to_owned(),
        message_id: key.message_id.to_owned(),
    })
}

/// Fails unless `key` is a dead message, saying what it is instead: checked before asking for
/// confirmation, and so that a typo reads "no such message" rather than "not dead".
async fn ensure_dead<DB: Backend>(pool: &Pool<DB>, key: &MessageKey<'_>) -> Result<(), CliError> {
    let message = stored(pool, key).await?;
    if message.status != inbox_core::MessageStatus::Dead {
        return Err(CliError::NotDead {
            handler: message.handler,
            message_id: message.message_id,
            status: message.status.to_string(),
        });
    }
    Ok(())
}

/// The primary key of the message named on the command line.
fn key<'a>(consumer: &'a str, message: &'a MessageArgs) -> MessageKey<'a> {
    MessageKey {
        consumer,
        handler: &message.handler,
        message_id: &message.message_id,
    }
}

/// The view of an operator's decision about `key`.
fn resolved(action: Action, key: &MessageKey<'_>, operator: &Operator, reason: &str) -> Resolved {
    Resolved {
        action,
        consumer: key.consumer.to_owned(),
        handler: key.handler.to_owned(),
        message_id: key.message_id.to_owned(),
        by: operator.by.clone(),
        reason: reason.to_owned(),
    }
}
