//! The words the guard, the handlers and the storage share: the keys of a dedup row and of an
//! ordering stream, what a claim records, the statuses a message moves through, how a handler
//! orders its sequences, and a delivery's headers. A leaf: it imports nothing of
//! the crate, so every other module can depend on it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What the guard records when it first sees a message.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The dedup key.
    pub message_id: &'a str,
    /// The message's type tag.
    pub message_type: &'a str,
    /// The aggregate, if any.
    pub aggregate: Option<&'a str>,
    /// The sequence, if any.
    pub sequence: Option<i64>,
    /// The SHA-256 of the message's payload, as delivered.
    pub payload_hash: &'a [u8],
    /// Now, in Unix epoch milliseconds: a failed message is retried only once its retry is due.
    pub now_ms: i64,
}

impl<'a> Claim<'a> {
    /// The dedup row this claim inserts.
    pub fn key(&self) -> MessageKey<'a> {
        MessageKey {
            consumer: self.consumer,
            handler: self.handler,
            message_id: self.message_id,
        }
    }

    /// The ordering stream of the message, if it names an aggregate.
    pub fn stream(&self) -> Option<Stream<'a>> {
        Some(Stream {
            consumer: self.consumer,
            handler: self.handler,
            aggregate: self.aggregate?,
        })
    }
}

/// The primary key of a dedup row.
#[derive(Debug, Clone, Copy)]
pub struct MessageKey<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The dedup key.
    pub message_id: &'a str,
}

/// The primary key of an ordering stream: one aggregate, for one handler of one consumer.
#[derive(Debug, Clone, Copy)]
pub struct Stream<'a> {
    /// The consumer group.
    pub consumer: &'a str,
    /// The handler's name.
    pub handler: &'a str,
    /// The aggregate.
    pub aggregate: &'a str,
}

/// A failed attempt, as recorded.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The payload as delivered, kept for the retry and for operators.
    pub payload: &'a [u8],
    /// The delivery's headers, as a JSON object.
    pub headers: &'a str,
    /// What went wrong.
    pub error: &'a str,
}

/// What an operator does about a dead message, by whom and why.
#[derive(Debug, Clone, Copy)]
pub struct Resolution<'a> {
    /// Replay it (`true`) or discard it (`false`).
    pub replay: bool,
    /// Who decided.
    pub by: &'a str,
    /// Why.
    pub reason: &'a str,
}

/// Where a dedup row stands, as stored in its `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageStatus {
    /// Handled: its writes committed with the row.
    Processed,
    /// Skipped: not newer than its aggregate's last applied sequence.
    Stale,
    /// Waiting for its predecessor (strict ordering), with its payload.
    Parked,
    /// Its handler failed; retried when `retry_at_ms` is due.
    Failed,
    /// Given up on, kept with its payload for an operator.
    Dead,
    /// A dead letter an operator discarded.
    Discarded,
}

impl MessageStatus {
    /// Every status, in the order operators see them.
    pub const ALL: [MessageStatus; 6] = [
        MessageStatus::Processed,
        MessageStatus::Stale,
        MessageStatus::Parked,
        MessageStatus::Failed,
        MessageStatus::Dead,
        MessageStatus::Discarded,
    ];

    /// The value stored in the column.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Processed => "processed",
            MessageStatus::Stale => "stale",
            MessageStatus::Parked => "parked",
            MessageStatus::Failed => "failed",
            MessageStatus::Dead => "dead",
            MessageStatus::Discarded => "discarded",
        }
    }

    /// The status a column value names, if it names one.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::MessageStatus;
    /// assert_eq!(MessageStatus::parse("parked"), Some(MessageStatus::Parked));
    /// assert_eq!(MessageStatus::parse("lost"), None);
    /// ```
    pub fn parse(value: &str) -> Option<MessageStatus> {
        MessageStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == value)
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a message is dead, kept in its own column (`dead_reason`) so that code acts on it rather
/// than on the error's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// Its strict ordering gap never filled; skipping the gap brings it back.
    GapTimeout,
    /// Its attempts ran out, or its error was permanent.
    GaveUp,
    /// Its stored payload no longer decodes.
    Undecodable,
}

impl DeadReason {
    const ALL: [DeadReason; 3] = [
        DeadReason::GapTimeout,
        DeadReason::GaveUp,
        DeadReason::Undecodable,
    ];

    /// The value stored in the column.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::GapTimeout => "gap_timeout",
            DeadReason::GaveUp => "gave_up",
            DeadReason::Undecodable => "undecodable",
        }
    }

    /// The reason a column value names, if it names one.
    pub fn parse(value: &str) -> Option<DeadReason> {
        DeadReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == value)
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the ordering guard treats sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Newer sequences apply, gaps are allowed; a sequence not newer than the last applied one is
    /// stale.
    Monotonic,
    /// Sequences apply contiguously, from 1: a message whose predecessor has not applied is parked
    /// until it has, or marked dead after `gap_timeout`.
    Strict {
        /// How long a parked message waits for its missing predecessor.
        gap_timeout: Duration,
    },
}

/// Headers of the delivery that carried a message, passed to the handler's [`Context`](crate::Context).
pub type Headers = BTreeMap<String, String>;

/// Headers as the JSON object they are stored as.
pub(crate) fn headers_to_json(headers: &Headers) -> String {
    // A map of strings always encodes; the fallback only keeps this total.
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}
