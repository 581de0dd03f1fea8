//! Stored messages: the dead and parked lists, and everything about one message.

use inbox_core::StoredMessage;
use inbox_core::storage::operators::ActionRecord;
use serde::Serialize;

use super::{Render, cell, headers_text, shorten, table};
use crate::consumer::Searched;

/// Which messages a list holds, which decides its columns.
#[derive(Debug, Clone, Copy)]
pub enum ListKind {
    /// Dead letters: with attempts and the last error.
    Dead,
    /// Parked messages: by aggregate and sequence.
    Parked,
}

/// A list of stored messages, of one consumer or of all; as JSON, an array.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct MessageList {
    #[serde(skip)]
    kind: ListKind,
    #[serde(skip)]
    searched: Searched,
    messages: Vec<MessageSummary>,
}

/// One message in a list.
#[derive(Debug, Serialize)]
struct MessageSummary {
    consumer: String,
    handler: String,
    message_id: String,
    message_type: String,
    aggregate_id: Option<String>,
    sequence_number: Option<i64>,
    status: String,
    attempt_count: i32,
    last_error: Option<String>,
    /// RFC 3339, UTC.
    received_at: String,
    /// RFC 3339, UTC.
    failed_at: Option<String>,
}

impl MessageList {
    /// The `kind` messages found where `searched` says, each with its consumer.
    pub fn new(kind: ListKind, searched: Searched, messages: Vec<(String, StoredMessage)>) -> Self {
        let summary = |(consumer, message)| MessageSummary::new(consumer, message);
        Self {
            kind,
            searched,
            messages: messages.into_iter().map(summary).collect(),
        }
    }
}

impl MessageSummary {
    /// `message` of `consumer`.
    fn new(consumer: String, message: StoredMessage) -> Self {
        Self {
            consumer,
            handler: message.handler,
            message_id: message.message_id,
            message_type: message.message_type,
            aggregate_id: message.aggregate_id,
            sequence_number: message.sequence_number,
            status: message.status.to_string(),
            attempt_count: message.attempt_count,
            last_error: message.error_text,
            received_at: message.received_at,
            failed_at: message.failed_at,
        }
    }
}

impl Render for MessageList {
    fn human(&self) -> String {
        let (what, header): (_, &[&str]) = match self.kind {
            ListKind::Dead => (
                "dead",
                &[
                    "CONSUMER",
                    "HANDLER",
                    "MESSAGE ID",
                    "TYPE",
                    "AGGREGATE",
                    "SEQUENCE",
                    "ATTEMPTS",
                    "FAILED AT",
                    "ERROR",
                ],
            ),
            ListKind::Parked => (
                "parked",
                &[
                    "CONSUMER",
                    "HANDLER",
                    "AGGREGATE",
                    "SEQUENCE",
                    "MESSAGE ID",
                    "TYPE",
                    "RECEIVED AT",
                ],
            ),
        };
        if self.messages.is_empty() {
            return format!("No {what} messages {}.", self.searched);
        }
        let rows = self.messages.iter().map(|message| self.row(message));
        table(header, rows)
    }
}

impl MessageList {
    fn row(&self, message: &MessageSummary) -> Vec<String> {
        let (id, kind) = (message.message_id.clone(), message.message_type.clone());
        let aggregate = cell(message.aggregate_id.as_ref());
        let sequence = cell(message.sequence_number);
        match self.kind {
            ListKind::Dead => vec![
                message.consumer.clone(),
                message.handler.clone(),
                id,
                kind,
                aggregate,
                sequence,
                message.attempt_count.to_string(),
                cell(message.failed_at.as_ref()),
                cell(message.last_error.as_deref().map(shorten)),
            ],
            ListKind::Parked => {
                let received = message.received_at.clone();
                vec![
                    message.consumer.clone(),
                    message.handler.clone(),
                    aggregate,
                    sequence,
                    id,
                    kind,
                    received,
                ]
            }
        }
    }
}

/// Everything stored about one message, its payload as text.
#[derive(Debug, Serialize)]
pub struct MessageDetail {
    #[serde(flatten)]
    summary: MessageSummary,
    first_error: Option<String>,
    /// The payload as UTF-8 text (invalid bytes replaced), while it is kept.
    payload: Option<String>,
    /// The delivery's headers (correlation id, trace context, ...), kept with the payload: a JSON
    /// object, or the stored text if it is not one.
    headers: Option<serde_json::Value>,
    /// What operators did about it (and about the gaps of its aggregate), oldest first.
    actions: Vec<ActionView>,
}

/// One operator's action, and what came of it.
#[derive(Debug, Serialize)]
pub struct ActionView {
    action: String,
    by: String,
    reason: String,
    /// RFC 3339, UTC.
    at: String,
    /// Recorded once known; for the latest replay, what the message says so far.
    outcome: Option<String>,
    /// RFC 3339, UTC; `None` for an outcome read off the message as it stands.
    outcome_at: Option<String>,
}

impl From<ActionRecord> for ActionView {
    fn from(record: ActionRecord) -> Self {
        Self {
            action: record.action.to_string(),
            by: record.by,
            reason: record.reason,
            at: record.at,
            outcome: record.outcome,
            outcome_at: record.outcome_at,
        }
    }
}

/// Actions as a table, oldest first; `(none)` without any.
pub fn actions_text(actions: &[ActionView]) -> String {
    if actions.is_empty() {
        return "(none)".to_owned();
    }
    let rows = actions.iter().map(|action| {
        vec![
            action.at.clone(),
            action.action.clone(),
            action.by.clone(),
            action.reason.clone(),
            cell(action.outcome.as_deref()),
        ]
    });
    table(&["AT", "ACTION", "BY", "REASON", "OUTCOME"], rows)
}

impl MessageDetail {
    /// `message` of `consumer`, with what operators did about it.
    pub fn new(consumer: &str, mut message: StoredMessage, actions: Vec<ActionRecord>) -> Self {
        let payload = message.payload.take();
        let headers = message.headers.take().map(|headers| {
            serde_json::from_str(&headers).unwrap_or(serde_json::Value::String(headers))
        });
        Self {
            headers,
            payload: payload.map(|payload| String::from_utf8_lossy(&payload).into_owned()),
            first_error: message.first_error.take(),
            actions: actions.into_iter().map(ActionView::from).collect(),
            summary: MessageSummary::new(consumer.to_owned(), message),
        }
    }
}

impl Render for MessageDetail {
    fn human(&self) -> String {
        let summary = &self.summary;
        let fields = [
            ("consumer", Some(summary.consumer.clone())),
            ("handler", Some(summary.handler.clone())),
            ("message id", Some(summary.message_id.clone())),
            ("type", Some(summary.message_type.clone())),
            ("aggregate", summary.aggregate_id.clone()),
            ("sequence", summary.sequence_number.map(|n| n.to_string())),
            ("status", Some(summary.status.clone())),
            ("attempts", Some(summary.attempt_count.to_string())),
            ("received at", Some(summary.received_at.clone())),
            ("failed at", summary.failed_at.clone()),
            ("first error", self.first_error.clone()),
            ("last error", summary.last_error.clone()),
        ];
        let rows = fields
            .into_iter()
            .map(|(name, value)| vec![format!("{name}:"), cell(value)]);
        let payload = self.payload.as_deref().unwrap_or("(not kept)");
        format!(
            "{}\n\noperator actions:\n{}\n\nheaders:\n{}\n\npayload:\n{payload}",
            table(&[], rows),
            actions_text(&self.actions),
            headers_text(self.headers.as_ref())
        )
    }
}
