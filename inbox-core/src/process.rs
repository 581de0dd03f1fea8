//! The guarded call without any runtime: `mark_paid.process(&pool, msg)`.

use futures::future::BoxFuture;
use sqlx::Pool;

use crate::error::Error;
use crate::guard::{RELEASES_PER_MESSAGE, Received, canonical_payload, process, release};
use crate::handler::{DEFAULT_CONSUMER, Handler};
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;
use crate::storage::Backend;

/// One guarded call of a handler, for code that has a message in hand and no runtime. Every
/// [`Handler`] has it; `use inbox::prelude::*` brings it into scope.
pub trait Process<DB: Backend>: Handler<DB> {
    /// Guards and handles one message in one transaction, for the [`DEFAULT_CONSUMER`]: dedup,
    /// ordering guard, the user's writes, then commit. Under strict ordering, the parked
    /// successors it unblocks are applied too, each in its own transaction, however many, before
    /// this returns.
    /// A failure is recorded under [`RetryPolicy::default`] and returned as [`Error::Handler`],
    /// which says when to call again, or that the message is now dead; calling again before then
    /// is [`Error::RetryNotDue`]. The message's content, for dedup, is its JSON encoding with
    /// keys in order.
    fn process<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        message: Self::Message,
    ) -> BoxFuture<'a, Result<Outcome, Error>>;
}

impl<DB: Backend, H: Handler<DB>> Process<DB> for H {
    fn process<'a>(
        &'a self,
        pool: &'a Pool<DB>,
        message: Self::Message,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move {
            let identity = self.identity(&message)?;
            let payload = canonical_payload(&message)?;
            let received = Received {
                payload: &payload,
                identity: &identity,
                headers: None,
                receipt: None,
            };
            let retry = RetryPolicy::default();
            let mut connection = pool.clone();
            let guarded = process(
                &mut connection,
                DEFAULT_CONSUMER,
                self,
                message,
                received,
                &retry,
            )
            .await?;
            if let (RELEASES_PER_MESSAGE.., Some(aggregate)) =
                (guarded.released, identity.aggregate())
            {
                release_the_rest(pool, self, aggregate, &retry).await;
            }
            Ok(guarded.outcome)
        })
    }
}

/// Releases the parked successors left after the guard released its first
/// [`RELEASES_PER_MESSAGE`]: without a runtime, no sweep comes to release them. A failed release
/// is recorded like any failure, and logged here, since the message itself was handled.
async fn release_the_rest<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
) {
    let released = release(pool, DEFAULT_CONSUMER, handler, aggregate, retry, u32::MAX);
    if let Err(error) = released.await {
        tracing::warn!(handler = handler.name(), aggregate, %error, "releasing a parked message failed");
    }
}
