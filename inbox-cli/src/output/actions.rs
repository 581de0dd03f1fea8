//! What a command that changes something did: the schema, an operator's decision on a dead
//! message, a skipped gap.

use serde::Serialize;

use super::Render;
use crate::cli::BackendKind;

/// The schema was applied.
#[derive(Debug, Serialize)]
pub struct Migrated {
    /// The database's name (`PostgreSQL`, `SQLite`).
    pub database: &'static str,
    /// Always `true`: a failed migration is an error instead.
    pub migrated: bool,
}

impl Render for Migrated {
    fn human(&self) -> String {
        format!("The inbox schema is up to date ({}).", self.database)
    }
}

/// The schema as plain DDL.
#[derive(Debug, Serialize)]
pub struct Schema {
    /// Which database's DDL.
    pub backend: BackendKind,
    /// The statements.
    pub ddl: &'static str,
}

impl Render for Schema {
    fn human(&self) -> String {
        self.ddl.trim_end().to_owned()
    }
}

/// What an operator can decide about a dead message.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Handle it again: the running consumer does, on its next sweep.
    ReplayRequested,
    /// Never handle it.
    Discarded,
}

/// What an operator decided about a dead message.
#[derive(Debug, Serialize)]
pub struct Resolved {
    /// The decision.
    pub action: Action,
    /// The consumer group.
    pub consumer: String,
    /// The handler.
    pub handler: String,
    /// The message.
    pub message_id: String,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

impl Render for Resolved {
    fn human(&self) -> String {
        let message = format!(
            "message `{}` of handler `{}` (consumer `{}`)",
            self.message_id, self.handler, self.consumer
        );
        match self.action {
            Action::ReplayRequested => format!(
                "Replay requested for {message} by {}: the running consumer handles it again on \
                 its next sweep.",
                self.by
            ),
            Action::Discarded => format!(
                "Discarded {message} by {}: it is kept, with the reason, but never handled.",
                self.by
            ),
        }
    }
}

/// A strict-ordering gap was skipped.
#[derive(Debug, Serialize)]
pub struct GapSkipped {
    /// The consumer group.
    pub consumer: String,
    /// The handler.
    pub handler: String,
    /// The aggregate.
    pub aggregate: String,
    /// Who skipped it.
    pub by: String,
    /// Why.
    pub reason: String,
}

impl Render for GapSkipped {
    fn human(&self) -> String {
        format!(
            "Skipped the gap of aggregate `{}` for handler `{}` (consumer `{}`) by {}: the \
             running consumer releases its parked messages on its next sweep.",
            self.aggregate, self.handler, self.consumer, self.by
        )
    }
}
