//! `inbox status`: counts by status per handler, rejected deliveries, conflicts, the outbox
//! backlog, storage.

use inbox_core::outbox::OutboxBacklog;
use serde::Serialize;

use super::{Render, age, cell, size, table};

/// The state of an inbox database, over every consumer.
#[derive(Debug, Serialize)]
pub struct StatusView {
    /// Per consumer and handler.
    handlers: Vec<HandlerView>,
    /// Per consumer: rejected deliveries not resolved yet (waiting for an operator, or for the
    /// running consumer to replay them).
    rejected: Vec<RejectedView>,
    /// Per consumer and handler: conflicting deliveries (an id seen before with other content)
    /// waiting for an operator.
    conflicts: Vec<ConflictsView>,
    /// What the outbox has not published.
    outbox: BacklogView,
    /// The space the inbox takes.
    storage_bytes: i64,
}

/// The rows of one handler of one consumer, by status.
#[derive(Debug, Serialize)]
struct HandlerView {
    consumer: String,
    handler: String,
    processed: i64,
    stale: i64,
    parked: i64,
    failed: i64,
    dead: i64,
    discarded: i64,
    oldest_parked_secs: Option<f64>,
}

/// The rejected deliveries of one consumer.
#[derive(Debug, Serialize)]
struct RejectedView {
    consumer: String,
    deliveries: i64,
}

/// The conflicting deliveries of one handler of one consumer.
#[derive(Debug, Serialize)]
struct ConflictsView {
    consumer: String,
    handler: String,
    conflicts: i64,
}

/// What the outbox has not published: pending and failed messages, and how old the oldest is.
#[derive(Debug, Serialize)]
struct BacklogView {
    pending: i64,
    failed: i64,
    oldest_unpublished_secs: Option<f64>,
}

impl BacklogView {
    /// The `backlog` as of `now_ms` (Unix epoch milliseconds).
    fn new(backlog: OutboxBacklog, now_ms: i64) -> Self {
        // Never negative, should the writer's clock be ahead of this one.
        let age_secs = |created_at_ms: i64| (now_ms - created_at_ms).max(0) as f64 / 1000.0;
        Self {
            pending: backlog.pending,
            failed: backlog.failed,
            oldest_unpublished_secs: backlog.oldest_created_at_ms.map(age_secs),
        }
    }

    /// The backlog in one line.
    fn human(&self) -> String {
        let oldest = self.oldest_unpublished_secs.map(age);
        format!(
            "Outbox: {} pending, {} failed; oldest unpublished: {}",
            self.pending,
            self.failed,
            oldest.as_deref().unwrap_or("none")
        )
    }
}

impl StatusView {
    /// The inbox's `status` and the outbox's `backlog`, as of `now_ms` (Unix epoch milliseconds).
    pub fn new(status: inbox_core::Status, backlog: OutboxBacklog, now_ms: i64) -> Self {
        let handlers = status.handlers.into_iter().map(|handler| HandlerView {
            consumer: handler.consumer,
            handler: handler.handler,
            processed: handler.processed,
            stale: handler.stale,
            parked: handler.parked,
            failed: handler.failed,
            dead: handler.dead,
            discarded: handler.discarded,
            oldest_parked_secs: handler.oldest_parked_secs,
        });
        let rejected = status
            .rejected
            .into_iter()
            .map(|(consumer, deliveries)| RejectedView {
                consumer,
                deliveries,
            });
        let conflicts = status
            .conflicts
            .into_iter()
            .map(|(consumer, handler, conflicts)| ConflictsView {
                consumer,
                handler,
                conflicts,
            });
        Self {
            handlers: handlers.collect(),
            rejected: rejected.collect(),
            conflicts: conflicts.collect(),
            outbox: BacklogView::new(backlog, now_ms),
            storage_bytes: status.storage_bytes,
        }
    }
}

impl Render for StatusView {
    fn human(&self) -> String {
        let mut text = match self.handlers.is_empty() {
            true => "No messages recorded yet.".to_owned(),
            false => self.handlers_table(),
        };
        if !self.rejected.is_empty() {
            let rows = self
                .rejected
                .iter()
                .map(|rejected| vec![rejected.consumer.clone(), rejected.deliveries.to_string()]);
            text += "\n\nRejected deliveries not resolved yet: see `inbox rejected list`\n";
            text += &table(&["CONSUMER", "DELIVERIES"], rows);
        }
        if !self.conflicts.is_empty() {
            let rows = self.conflicts.iter().map(|conflicts| {
                let ConflictsView {
                    consumer,
                    handler,
                    conflicts,
                } = conflicts;
                vec![consumer.clone(), handler.clone(), conflicts.to_string()]
            });
            text += "\n\nConflicts (an id seen before with other content) waiting for an \
                     operator: see `inbox conflicts list`\n";
            text += &table(&["CONSUMER", "HANDLER", "CONFLICTS"], rows);
        }
        format!(
            "{text}\n\n{}\n\nStorage: {}",
            self.outbox.human(),
            size(self.storage_bytes)
        )
    }
}

impl StatusView {
    fn handlers_table(&self) -> String {
        let header = [
            "CONSUMER",
            "HANDLER",
            "PROCESSED",
            "STALE",
            "PARKED",
            "FAILED",
            "DEAD",
            "DISCARDED",
            "OLDEST PARKED",
        ];
        let rows = self.handlers.iter().map(|handler| {
            vec![
                handler.consumer.clone(),
                handler.handler.clone(),
                handler.processed.to_string(),
                handler.stale.to_string(),
                handler.parked.to_string(),
                handler.failed.to_string(),
                handler.dead.to_string(),
                handler.discarded.to_string(),
                cell(handler.oldest_parked_secs.map(age)),
            ]
        });
        table(&header, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_says_how_old_its_oldest_message_is_or_none() {
        let backlog = |oldest_created_at_ms| OutboxBacklog {
            pending: 2,
            failed: 1,
            oldest_created_at_ms,
        };
        let view = BacklogView::new(backlog(Some(1_000)), 126_000);
        assert_eq!(view.oldest_unpublished_secs, Some(125.0));
        assert_eq!(
            view.human(),
            "Outbox: 2 pending, 1 failed; oldest unpublished: 2m 5s"
        );
        let empty = BacklogView::new(OutboxBacklog::default(), 126_000);
        assert_eq!(
            empty.human(),
            "Outbox: 0 pending, 0 failed; oldest unpublished: none"
        );
        let ahead = BacklogView::new(backlog(Some(127_000)), 126_000);
        assert_eq!(
            ahead.oldest_unpublished_secs,
            Some(0.0),
            "a clock behind the writer's"
        );
    }
}
