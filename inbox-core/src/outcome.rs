//! What the guard decided for one message.

use std::fmt;

/// The result of guarding one message for one handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The handler ran and its writes were committed with the dedup record.
    Processed,
    /// This message was already handled (or skipped) before; nothing ran.
    Duplicate,
    /// The message's sequence is not newer than the last one applied to its aggregate; it was
    /// recorded and skipped.
    Stale,
    /// A message with this id was seen before with a different payload; nothing ran. Such a
    /// delivery is never applied silently: it is kept, with its payload and headers, next to the
    /// stored message, for an operator (`inbox conflicts list`).
    Conflict,
    /// Strict ordering: the message is ahead of its aggregate's next sequence. It was stored with
    /// its payload and applies when its predecessor has; the delivery can be acknowledged.
    Parked,
    /// Strict ordering: a parked message applied once its predecessor had.
    Released,
    /// The handler failed; the failure is recorded and the message will be tried again.
    Retrying,
    /// The message was given up on (attempts exhausted, or a permanent error) and is kept, with
    /// its payload and errors, for an operator. A redelivery of it is `Dead` too: nothing runs.
    Dead,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Processed,
        Outcome::Duplicate,
        Outcome::Stale,
        Outcome::Conflict,
        Outcome::Parked,
        Outcome::Released,
        Outcome::Retrying,
        Outcome::Dead,
    ];

    /// A stable lower-case name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Conflict => "conflict",
            Outcome::Parked => "parked",
            Outcome::Released => "released",
            Outcome::Retrying => "retry",
            Outcome::Dead => "dead",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
