//! Conflicts: deliveries whose id was seen before with other content, listed, and one shown
//! next to the message stored under its id.

use inbox_core::StoredMessage;
use inbox_core::storage::operators::{Conflict, Operator};
use serde::Serialize;

use super::{Render, cell, headers_text, table};
use crate::consumer::Searched;

/// The conflicts waiting for an operator; as JSON, an array.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct ConflictList {
    #[serde(skip)]
    searched: Searched,
    conflicts: Vec<ConflictSummary>,
}

/// One conflict in a list.
#[derive(Debug, Serialize)]
struct ConflictSummary {
    id: i64,
    consumer: String,
    handler: String,
    message_id: String,
    message_type: String,
    /// How many times this content was delivered.
    deliveries: i64,
    /// RFC 3339, UTC.
    first_seen_at: String,
    /// RFC 3339, UTC.
    last_seen_at: String,
    /// The SHA-256 of the conflicting content, in hex.
    payload_hash: String,
    /// The SHA-256 of the stored message's content when the conflict was seen, in hex.
    stored_payload_hash: String,
}

impl ConflictSummary {
    fn new(conflict: &Conflict) -> Self {
        Self {
            id: conflict.id,
            consumer: conflict.consumer.clone(),
            handler: conflict.handler.clone(),
            message_id: conflict.message_id.clone(),
            message_type: conflict.message_type.clone(),
            deliveries: conflict.deliveries,
            first_seen_at: conflict.first_seen_at.clone(),
            last_seen_at: conflict.last_seen_at.clone(),
            payload_hash: hex(&conflict.payload_hash),
            stored_payload_hash: hex(&conflict.stored_payload_hash),
        }
    }
}

/// `bytes` in lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl ConflictList {
    /// The conflicts found where `searched` says.
    pub fn new(searched: Searched, conflicts: Vec<Conflict>) -> Self {
        Self {
            searched,
            conflicts: conflicts.iter().map(ConflictSummary::new).collect(),
        }
    }
}

impl Render for ConflictList {
    fn human(&self) -> String {
        if self.conflicts.is_empty() {
            return format!("No conflicts {}.", self.searched);
        }
        let header = [
            "ID",
            "CONSUMER",
            "HANDLER",
            "MESSAGE ID",
            "TYPE",
            "DELIVERIES",
            "LAST SEEN AT",
        ];
        let rows = self.conflicts.iter().map(|conflict| {
            vec![
                conflict.id.to_string(),
                conflict.consumer.clone(),
                conflict.handler.clone(),
                conflict.message_id.clone(),
                conflict.message_type.clone(),
                conflict.deliveries.to_string(),
                conflict.last_seen_at.clone(),
            ]
        });
        table(&header, rows)
    }
}

/// One conflict: the conflicting delivery next to the message stored under its id.
#[derive(Debug, Serialize)]
pub struct ConflictDetail {
    #[serde(flatten)]
    summary: ConflictSummary,
    /// The conflicting delivery's headers, as stored (a JSON object).
    headers: serde_json::Value,
    /// The conflicting payload, as UTF-8 text (invalid bytes replaced).
    payload: String,
    /// The message stored under the id (`None`: purged since).
    stored: Option<StoredView>,
    /// What an operator decided (`discarded`), who and why; `None` while it waits for one.
    resolution: Option<String>,
    resolved_by: Option<String>,
    resolved_reason: Option<String>,
}

/// The message stored under a conflict's id.
#[derive(Debug, Serialize)]
struct StoredView {
    status: String,
    /// RFC 3339, UTC.
    received_at: String,
    /// Its payload as UTF-8 text, while the inbox keeps it (parked, failed, dead, discarded).
    payload: Option<String>,
}

impl ConflictDetail {
    /// `conflict`, next to `stored`, the message under its id if it is still there.
    pub fn new(conflict: Conflict, stored: Option<StoredMessage>) -> Self {
        let headers = serde_json::from_str(&conflict.headers)
            .unwrap_or_else(|_| serde_json::Value::String(conflict.headers.clone()));
        let stored = stored.map(|message| StoredView {
            status: message.status.to_string(),
            received_at: message.received_at,
            payload: message.payload.map(|payload| text(&payload)),
        });
        let resolved = conflict.resolution.clone();
        Self {
            summary: ConflictSummary::new(&conflict),
            headers,
            payload: text(&conflict.payload),
            stored,
            resolution: resolved.as_ref().map(|r| r.resolution.clone()),
            resolved_by: resolved.as_ref().map(|r| r.by.clone()),
            resolved_reason: resolved.map(|r| r.reason),
        }
    }
}

/// Bytes as UTF-8 text, invalid bytes replaced.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Render for ConflictDetail {
    fn human(&self) -> String {
        let summary = &self.summary;
        let fields = [
            ("id", Some(summary.id.to_string())),
            ("consumer", Some(summary.consumer.clone())),
            ("handler", Some(summary.handler.clone())),
            ("message id", Some(summary.message_id.clone())),
            ("type", Some(summary.message_type.clone())),
            ("deliveries", Some(summary.deliveries.to_string())),
            ("first seen at", Some(summary.first_seen_at.clone())),
            ("last seen at", Some(summary.last_seen_at.clone())),
            (
                "stored status",
                self.stored.as_ref().map(|s| s.status.clone()),
            ),
            ("resolution", self.resolution.clone()),
            ("resolved by", self.resolved_by.clone()),
            ("reason given", self.resolved_reason.clone()),
        ];
        let rows = fields
            .into_iter()
            .map(|(name, value)| vec![format!("{name}:"), cell(value)]);
        format!(
            "{}\n\nconflicting payload (sha-256 {}):\n{}\n\nstored payload (sha-256 {}):\n{}\n\n\
             conflicting delivery's headers:\n{}",
            table(&[], rows),
            summary.payload_hash,
            self.payload,
            summary.stored_payload_hash,
            self.stored_payload(),
            headers_text(Some(&self.headers))
        )
    }
}

impl ConflictDetail {
    /// The stored message's payload, or why it is not there.
    fn stored_payload(&self) -> String {
        match &self.stored {
            None => "(not kept: the stored message was purged since)".to_owned(),
            Some(StoredView {
                payload: Some(payload),
                ..
            }) => payload.clone(),
            Some(StoredView { status, .. }) => format!(
                "(not kept: the stored message is `{status}`, and the inbox keeps a payload only \
                 while its message is parked, failed, dead or discarded)"
            ),
        }
    }
}

/// An operator gave up on a conflict.
#[derive(Debug, Serialize)]
pub struct ConflictDiscarded {
    /// Always `discarded`.
    action: &'static str,
    id: i64,
    consumer: String,
    by: String,
    reason: String,
}

impl ConflictDiscarded {
    /// `operator` gave up on `conflict`.
    pub fn new(conflict: &Conflict, operator: Operator<'_>) -> Self {
        Self {
            action: "discarded",
            id: conflict.id,
            consumer: conflict.consumer.clone(),
            by: operator.by.to_owned(),
            reason: operator.reason.to_owned(),
        }
    }
}

impl Render for ConflictDiscarded {
    fn human(&self) -> String {
        format!(
            "Discarded conflict {} (consumer `{}`) by {}: it is kept, with the reason, but no \
             longer listed.",
            self.id, self.consumer, self.by
        )
    }
}
