//! `inbox status`: counts by status per handler, rejected deliveries, storage.

use serde::Serialize;

use super::{Render, age, cell, size, table};

/// The state of an inbox database, over every consumer.
#[derive(Debug, Serialize)]
pub struct StatusView {
    /// Per consumer and handler.
    handlers: Vec<HandlerView>,
    /// Per consumer: rejected deliveries waiting for an operator.
    rejected: Vec<RejectedView>,
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

impl From<inbox_core::Status> for StatusView {
    fn from(status: inbox_core::Status) -> Self {
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
        Self {
            handlers: handlers.collect(),
            rejected: rejected.collect(),
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
            text += "\n\nRejected deliveries waiting for an operator:\n";
            text += &table(&["CONSUMER", "DELIVERIES"], rows);
        }
        text + &format!("\n\nStorage: {}", size(self.storage_bytes))
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
