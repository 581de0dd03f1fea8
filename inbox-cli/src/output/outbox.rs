//! The outbox: its messages, and what a retry made pending again.

use inbox_core::outbox::{OutboxMessage, OutboxStatus};
use serde::Serialize;

use super::{Render, cell, shorten, table, utc};

/// A list of outbox messages, in the order they were written; as JSON, an array.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct OutboxList {
    /// The status listed (`None`: every message not published yet).
    #[serde(skip)]
    status: Option<OutboxStatus>,
    /// The most messages the list was allowed to hold.
    #[serde(skip)]
    limit: u32,
    messages: Vec<OutboxSummary>,
}

/// One outbox message in a list: everything but its payload and headers.
#[derive(Debug, Serialize)]
struct OutboxSummary {
    id: String,
    message_type: String,
    destination: Option<String>,
    aggregate_id: Option<String>,
    aggregate_sequence: Option<i64>,
    status: &'static str,
    attempts: i32,
    /// Those of its attempts the broker refused (the others found it out of reach).
    refusals: i32,
    last_error: Option<String>,
    /// UTC.
    created_at: String,
    /// UTC.
    published_at: Option<String>,
}

impl From<OutboxMessage> for OutboxSummary {
    fn from(message: OutboxMessage) -> Self {
        Self {
            id: message.id,
            message_type: message.message_type,
            destination: message.destination,
            aggregate_id: message.aggregate_id,
            aggregate_sequence: message.aggregate_sequence,
            status: message.status.as_str(),
            attempts: message.attempts,
            refusals: message.refusals,
            last_error: message.last_error,
            created_at: utc(message.created_at_ms),
            published_at: message.published_at_ms.map(utc),
        }
    }
}

impl OutboxList {
    /// The `messages` listed for `status`, at most `limit` of them.
    pub fn new(status: Option<OutboxStatus>, limit: u32, messages: Vec<OutboxMessage>) -> Self {
        Self {
            status,
            limit,
            messages: messages.into_iter().map(OutboxSummary::from).collect(),
        }
    }

    /// What the list holds, for a sentence: `failed`, `pending or failed`.
    fn what(&self) -> &'static str {
        self.status
            .map_or("pending or failed", OutboxStatus::as_str)
    }

    /// A line saying the list stopped at its limit, if it did.
    fn limit_note(&self) -> String {
        match self.messages.len() >= self.limit as usize {
            true => format!(
                "\n\nThe first {} {} messages: pass a larger --limit for more.",
                self.limit,
                self.what()
            ),
            false => String::new(),
        }
    }
}

impl Render for OutboxList {
    fn human(&self) -> String {
        if self.messages.is_empty() {
            return format!("No {} outbox messages.", self.what());
        }
        let header = [
            "ID",
            "TYPE",
            "AGGREGATE",
            "STATUS",
            "ATTEMPTS",
            "LAST ERROR",
            "CREATED",
        ];
        table(&header, self.messages.iter().map(row)) + &self.limit_note()
    }
}

/// The table row of `message`.
fn row(message: &OutboxSummary) -> Vec<String> {
    vec![
        message.id.clone(),
        message.message_type.clone(),
        aggregate(message),
        message.status.to_owned(),
        message.attempts.to_string(),
        cell(message.last_error.as_deref().map(shorten)),
        message.created_at.clone(),
    ]
}

/// A message's aggregate with its place in it, `a-1 #3`; `-` without one.
fn aggregate(message: &OutboxSummary) -> String {
    match (&message.aggregate_id, message.aggregate_sequence) {
        (Some(aggregate), Some(sequence)) => format!("{aggregate} #{sequence}"),
        (aggregate, _) => cell(aggregate.as_ref()),
    }
}

/// What `outbox retry` made pending again.
#[derive(Debug, Serialize)]
pub struct OutboxRetried {
    /// The message named (`None`: every failed message).
    id: Option<String>,
    /// How many messages are pending again.
    retried: u64,
}

impl OutboxRetried {
    /// The failed message `id` is pending again.
    pub fn one(id: &str) -> Self {
        Self {
            id: Some(id.to_owned()),
            retried: 1,
        }
    }

    /// `retried` failed messages, all there were, are pending again.
    pub fn all(retried: u64) -> Self {
        Self { id: None, retried }
    }
}

impl Render for OutboxRetried {
    fn human(&self) -> String {
        match (&self.id, self.retried) {
            (Some(id), _) => format!(
                "Outbox message `{id}` is pending again: the running relay publishes it in its \
                 next batch."
            ),
            (None, 0) => "No failed outbox messages: nothing to retry.".to_owned(),
            (None, retried) => format!(
                "{retried} failed outbox messages are pending again: the running relay \
                 publishes them in its next batches."
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(aggregate_id: Option<&str>, aggregate_sequence: Option<i64>) -> OutboxSummary {
        OutboxSummary {
            id: "m-1".into(),
            message_type: "t".into(),
            destination: None,
            aggregate_id: aggregate_id.map(str::to_owned),
            aggregate_sequence,
            status: "failed",
            attempts: 3,
            refusals: 1,
            last_error: Some("refused\nby the broker".into()),
            created_at: utc(0),
            published_at: None,
        }
    }

    #[test]
    fn a_row_shows_the_aggregate_with_its_sequence_and_the_first_line_of_the_error() {
        let row = row(&summary(Some("a-1"), Some(2)));
        assert_eq!(row[2], "a-1 #2");
        assert_eq!(row[5], "refused…");
        assert_eq!(aggregate(&summary(None, None)), "-");
    }

    #[test]
    fn a_full_list_says_there_may_be_more() {
        let list = |limit| OutboxList {
            status: Some(OutboxStatus::Failed),
            limit,
            messages: vec![summary(None, None)],
        };
        assert!(
            list(1)
                .human()
                .ends_with("The first 1 failed messages: pass a larger --limit for more.")
        );
        assert!(!list(2).human().contains("--limit"));
    }

    #[test]
    fn a_retry_says_how_many_are_pending_again() {
        assert!(
            OutboxRetried::one("m-1")
                .human()
                .contains("`m-1` is pending again")
        );
        assert!(OutboxRetried::all(0).human().contains("nothing to retry"));
        let all = OutboxRetried::all(3).human();
        assert!(
            all.starts_with("3 failed") && all.contains("publishes them"),
            "{all}"
        );
    }
}
