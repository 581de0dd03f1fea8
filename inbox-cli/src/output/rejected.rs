//! Rejected deliveries: the list, everything about one, and what an operator decided.

use inbox_core::storage::operators::{ActionRecord, KeptRejected, Operator, RejectedState};
use serde::Serialize;

use super::messages::{ActionView, actions_text};
use super::{Render, shorten, table};
use crate::consumer::Searched;

/// The rejected deliveries no operator has resolved; as JSON, an array.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct RejectedList {
    #[serde(skip)]
    searched: Searched,
    deliveries: Vec<RejectedSummary>,
}

/// One rejected delivery in a list.
#[derive(Debug, Serialize)]
struct RejectedSummary {
    id: i64,
    consumer: String,
    message_type: String,
    delivery_id: String,
    /// RFC 3339, UTC.
    received_at: String,
    /// `waiting` (for an operator) or `replay_requested` (for the running consumer); in `show`,
    /// also `replayed` or `discarded`.
    #[serde(serialize_with = "state")]
    state: RejectedState,
    reason: String,
}

/// A state as its name.
fn state<S: serde::Serializer>(state: &RejectedState, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(state.as_str())
}

impl RejectedSummary {
    fn new(kept: &KeptRejected) -> Self {
        Self {
            id: kept.delivery.id,
            consumer: kept.consumer.clone(),
            message_type: kept.delivery.message_type.clone(),
            delivery_id: kept.delivery.delivery_id.clone(),
            received_at: kept.received_at.clone(),
            state: kept.state,
            reason: kept.delivery.reason.clone(),
        }
    }
}

impl RejectedList {
    /// The deliveries found where `searched` says.
    pub fn new(searched: Searched, kept: Vec<KeptRejected>) -> Self {
        Self {
            searched,
            deliveries: kept.iter().map(RejectedSummary::new).collect(),
        }
    }
}

impl Render for RejectedList {
    fn human(&self) -> String {
        if self.deliveries.is_empty() {
            return format!("No rejected deliveries {}.", self.searched);
        }
        let header = [
            "ID",
            "CONSUMER",
            "TYPE",
            "DELIVERY ID",
            "RECEIVED AT",
            "STATE",
            "REASON",
        ];
        let rows = self.deliveries.iter().map(|delivery| {
            vec![
                delivery.id.to_string(),
                delivery.consumer.clone(),
                delivery.message_type.clone(),
                delivery.delivery_id.clone(),
                delivery.received_at.clone(),
                delivery.state.to_string(),
                shorten(&delivery.reason),
            ]
        });
        table(&header, rows)
    }
}

/// Everything kept about one rejected delivery.
#[derive(Debug, Serialize)]
pub struct RejectedDetail {
    #[serde(flatten)]
    summary: RejectedSummary,
    /// The delivery's headers, as stored (a JSON object).
    headers: serde_json::Value,
    /// The payload as UTF-8 text (invalid bytes replaced).
    payload: String,
    /// What operators did about it, oldest first.
    actions: Vec<ActionView>,
}

impl RejectedDetail {
    /// `kept`, in full, with what operators did about it.
    pub fn new(kept: KeptRejected, actions: Vec<ActionRecord>) -> Self {
        let headers = &kept.delivery.headers;
        Self {
            summary: RejectedSummary::new(&kept),
            headers: serde_json::from_str(headers)
                .unwrap_or_else(|_| serde_json::Value::String(headers.clone())),
            payload: String::from_utf8_lossy(&kept.delivery.payload).into_owned(),
            actions: actions.into_iter().map(ActionView::from).collect(),
        }
    }
}

impl Render for RejectedDetail {
    fn human(&self) -> String {
        let summary = &self.summary;
        let fields = [
            ("id", summary.id.to_string()),
            ("consumer", summary.consumer.clone()),
            ("type", summary.message_type.clone()),
            ("delivery id", summary.delivery_id.clone()),
            ("received at", summary.received_at.clone()),
            ("state", summary.state.to_string()),
            ("reason", summary.reason.clone()),
        ];
        let rows = fields
            .into_iter()
            .map(|(name, value)| vec![format!("{name}:"), value]);
        format!(
            "{}\n\noperator actions:\n{}\n\nheaders:\n{}\n\npayload:\n{}",
            table(&[], rows),
            actions_text(&self.actions),
            super::headers_text(Some(&self.headers)),
            self.payload
        )
    }
}

/// What an operator can decide about a rejected delivery.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectedAction {
    /// Dispatch it again: the running consumer does, on its next sweep.
    ReplayRequested,
    /// Never dispatch it.
    Discarded,
}

/// What an operator decided about a rejected delivery.
#[derive(Debug, Serialize)]
pub struct RejectedResolved {
    action: RejectedAction,
    id: i64,
    consumer: String,
    by: String,
    reason: String,
}

impl RejectedResolved {
    /// `operator` decided `action` about `kept`.
    pub fn new(action: RejectedAction, kept: &KeptRejected, operator: Operator<'_>) -> Self {
        Self {
            action,
            id: kept.delivery.id,
            consumer: kept.consumer.clone(),
            by: operator.by.to_owned(),
            reason: operator.reason.to_owned(),
        }
    }
}

impl Render for RejectedResolved {
    fn human(&self) -> String {
        let delivery = format!(
            "rejected delivery {} (consumer `{}`)",
            self.id, self.consumer
        );
        match self.action {
            RejectedAction::ReplayRequested => format!(
                "Replay requested for {delivery} by {}: the running consumer dispatches it again \
                 on its next sweep; refused again, it is back in `inbox rejected list` with the \
                 new reason.",
                self.by
            ),
            RejectedAction::Discarded => format!(
                "Discarded {delivery} by {}: it is kept, with the reason, but never dispatched.",
                self.by
            ),
        }
    }
}
