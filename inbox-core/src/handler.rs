//! The handler trait that `#[inbox_handler]` implements.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::Pool;

use crate::context::Context;
use crate::error::{Error, HandlerError};
use crate::identity::Identity;
use crate::message::Message;
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;
use crate::storage::Backend;

/// How long a parked message waits for its missing predecessor before it is marked dead, unless
/// the handler sets `gap_timeout`.
pub const DEFAULT_GAP_TIMEOUT: Duration = Duration::from_secs(3_600);

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

/// The consumer group used by [`Handler::process`] when no runtime names one.
pub const DEFAULT_CONSUMER: &str = "default";

/// A guarded message handler for the database `DB`.
///
/// `#[inbox_handler(...)]` implements this for the value it makes of an `async fn`; there is rarely
/// a reason to implement it by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an inbox handler for this database",
    note = "annotate an `async fn` with `#[inbox_handler(key = \"...\")]`, and check that its first parameter is a handle of the pool's database"
)]
pub trait Handler<DB: Backend>: Send + Sync + 'static {
    /// The message type this handler takes.
    type Message: Message;

    /// The handler's stable name: its dedup scope. Renaming it starts a new scope, in which every
    /// message is new again.
    fn name(&self) -> &'static str;

    /// How the ordering guard treats this handler's sequences.
    fn ordering(&self) -> Ordering {
        Ordering::Monotonic
    }

    /// Reads the dedup key, aggregate and sequence from the message.
    fn identity(&self, message: &Self::Message) -> Result<Identity, Error>;

    /// Runs the user's function inside the guarded transaction.
    fn handle<'c, 't>(
        &'c self,
        ctx: &'c mut Context<'t, DB>,
        message: Self::Message,
    ) -> BoxFuture<'c, Result<(), HandlerError>>;

    /// Guards and handles one message in one transaction, for the [`DEFAULT_CONSUMER`]: dedup,
    /// ordering guard, the user's writes, then commit. Under strict ordering, the parked
    /// successors it unblocks are applied too, each in its own transaction, before this returns.
    /// A failure is recorded under [`RetryPolicy::default`] and returned as [`Error::Handler`],
    /// which says when to call again, or that the message is now dead; calling again before then
    /// is [`Error::RetryNotDue`]. The message's content, for dedup, is its JSON encoding with
    /// keys in order.
    fn process<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        message: Self::Message,
    ) -> BoxFuture<'a, Result<Outcome, Error>>
    where
        Self: Sized,
    {
        Box::pin(async move {
            let identity = self.identity(&message)?;
            let payload = crate::guard::canonical_payload(&message)?;
            let received = crate::guard::Received {
                payload: &payload,
                identity: &identity,
                headers: None,
            };
            let retry = RetryPolicy::default();
            let guarded =
                crate::guard::process(pool, DEFAULT_CONSUMER, self, message, received, &retry)
                    .await?;
            Ok(guarded.outcome)
        })
    }
}

/// Headers of the delivery that carried a message, passed to the handler's [`Context`].
pub type Headers = BTreeMap<String, String>;

/// Headers as the JSON object they are stored as.
pub(crate) fn headers_to_json(headers: &Headers) -> String {
    // A map of strings always encodes; the fallback only keeps this total.
    serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned())
}

/// The return type of a handler function: `Result<(), E>` where `E` converts into
/// [`HandlerError`].
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "an inbox handler must return `Result<(), E>` where `E` converts into `HandlerError`",
    label = "this return type is not `Result<(), E>` with a convertible error",
    note = "return `Result<(), inbox::HandlerError>`, or a `Result<(), E>` whose `E` implements `std::error::Error + Send + Sync + 'static`"
)]
pub trait HandlerResult {
    /// Converts the handler's result.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl<E: Into<HandlerError>> HandlerResult for Result<(), E> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self.map_err(Into::into)
    }
}
