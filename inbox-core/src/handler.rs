//! The handler trait that `#[inbox_handler]` implements.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::context::Context;
use crate::error::{Error, HandlerError};
use crate::identity::Identity;
use crate::keys::Ordering;
use crate::message::Message;
use crate::storage::Backend;

/// How long a parked message waits for its missing predecessor before it is marked dead, unless
/// the handler sets `gap_timeout`.
pub const DEFAULT_GAP_TIMEOUT: Duration = Duration::from_secs(3_600);

/// The consumer group used by [`Process::process`](crate::Process::process) when no runtime
/// names one.
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
