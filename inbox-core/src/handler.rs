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
    note = "annotate an `async fn` with `#[inbox_handler(key = \"...\")]`, and check that its first parameter is a handle of the pool's database",
    note = "a handler that takes `State<T>` is bound to its state first: `handler.with_state(state)`"
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

/// The return types a handler function may have: `Result<(), E>` where `E` is
/// [`HandlerError`], any `std::error::Error + Send + Sync + 'static` (the user's own, which may
/// implement [`Permanence`](crate::Permanence)), `anyhow::Error`, or anything else that converts
/// into `Box<dyn std::error::Error + Send + Sync>`.
#[diagnostic::on_unimplemented(
    message = "an inbox handler must return `Result<(), E>` where `E` is an error",
    label = "this return type is not `Result<(), E>` with an error type",
    note = "return `Result<(), inbox::HandlerError>`, `anyhow::Result<()>`, or a `Result<(), E>` whose `E` implements `std::error::Error + Send + Sync + 'static`"
)]
pub trait HandlerResult {
    /// The error type.
    type Error;

    /// The result, its error ready to become a [`HandlerError`].
    fn into_result(self) -> Result<(), crate::error::classify::Failure<Self::Error>>;
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>> HandlerResult for Result<(), E> {
    type Error = E;

    fn into_result(self) -> Result<(), crate::error::classify::Failure<E>> {
        self.map_err(|error| crate::error::classify::Failure::new(error, Into::into))
    }
}
