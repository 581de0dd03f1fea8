//! Many messages in one transaction: each is guarded exactly as on its own (claim, ordering
//! guard, handler), and one commit makes them all durable at once.
//!
//! The batch is optimistic: as long as every message is kept or found seen before, nothing needs
//! undoing. When a handler fails, the whole transaction is rolled back and the batch is
//! [`Abandoned::Failed`]: the caller records that message's failure ([`conclude`], its
//! handler is not run again for this attempt) and guards the others again, in a new batch. When
//! the database refuses a statement or the commit, the batch is [`Abandoned::Refused`] and each of
//! its messages goes in a transaction of its own. So one message's failure neither commits nor
//! loses the others' work, and a batch costs no statement per message beyond the per-message
//! ones (a savepoint per message would cost two more round trips, and on PostgreSQL more than 64
//! written savepoints in one transaction overflow its subtransaction cache). The price: when a
//! message of a batch fails, the handlers that ran before it in the batch run again, their first
//! run rolled back and never committed.

use sqlx::{Pool, Transaction};
use tracing::{Instrument, Span};

use crate::error::{Error, HandlerError};
use crate::guard::{self, Delivery, Guarded, Received, Step};
use crate::handler::Handler;
use crate::message::Message;
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;
use crate::storage::Backend;

/// An open batch: one transaction that guarded messages join until it commits.
pub struct Batch<DB: Backend> {
    tx: Transaction<'static, DB>,
}

/// A message guarded in a batch, its outcome waiting for the batch's commit: hand it to
/// [`conclude`] (as [`InBatch::Staged`]) once [`Batch::commit`] succeeded.
pub struct Staged {
    span: Span,
    guarded: Result<Outcome, Error>,
}

/// Why a batch was rolled back, with everything it held.
#[derive(Debug)]
pub enum Abandoned {
    /// The handler of the message being guarded failed with this error: record it with
    /// [`conclude`] (as [`InBatch::Failed`]), and guard the batch's other messages again.
    Failed(HandlerError),
    /// The database refused a statement or the commit: handle each of the batch's messages again,
    /// each in a transaction of its own (with [`crate::process`]).
    Refused,
}

impl<DB: Backend> Batch<DB> {
    /// Begins a batch, at the isolation the guard is written for.
    pub async fn begin(pool: &Pool<DB>) -> Result<Self, Error> {
        Ok(Self {
            tx: DB::begin(pool).await?,
        })
    }

    /// Guards `message` (as `received`) with `handler` inside the batch. A message whose handler
    /// fails, or a statement the database refuses, rolls the whole batch back.
    pub async fn guard<H: Handler<DB>>(
        self,
        consumer: &str,
        handler: &H,
        message: H::Message,
        received: Received<'_>,
        retry: &RetryPolicy,
    ) -> Result<(Self, Staged), Abandoned> {
        let delivery = Delivery::new(consumer, received, retry);
        let span = guard::message_span(&delivery, handler.name(), H::Message::TYPE);
        if received
            .identity
            .check_ordering(handler.ordering())
            .is_err()
        {
            return Err(Abandoned::Refused);
        }
        let payload_hash = guard::content_hash(received.payload);
        let claim = guard::claim_of(handler, &delivery, &payload_hash);
        let attempt = guard::attempt(self.tx, handler, message, &delivery, &claim);
        let (tx, guarded) = match attempt.instrument(span.clone()).await {
            Ok(Step::Keep(tx, outcome)) => (tx, Ok(outcome)),
            Ok(Step::Undo(tx, seen)) => (tx, seen),
            Ok(Step::Failed(error)) => return Err(Abandoned::Failed(error)),
            Err(_) => return Err(Abandoned::Refused),
        };
        Ok((Self { tx }, Staged { span, guarded }))
    }

    /// Commits every message the batch kept.
    pub async fn commit(self) -> Result<(), Abandoned> {
        self.tx.commit().await.map_err(|error| {
            tracing::warn!(%error, "a batch could not commit; its messages go one by one");
            Abandoned::Refused
        })
    }
}

/// Where a message stands once its batch ended.
pub enum InBatch {
    /// Guarded in a batch that committed.
    Staged(Staged),
    /// Its handler failed with this error, and the batch was abandoned ([`Abandoned::Failed`]).
    Failed(HandlerError),
}

/// After the batch: what a message came to, as [`crate::process`] would have returned it. A
/// staged message's outcome stands; a failed one's failure is recorded in a transaction of its
/// own (its handler is not run again for this attempt): [`Error::Handler`] says when the message
/// is due again or that it is dead. Then the outcome is recorded on the message's span and in
/// the metrics, and under strict ordering its parked successors are released.
pub async fn conclude<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    received: Received<'_>,
    retry: &RetryPolicy,
    in_batch: InBatch,
) -> Result<Guarded, Error> {
    let delivery = Delivery::new(consumer, received, retry);
    let (span, guarded) = match in_batch {
        InBatch::Staged(staged) => (staged.span, staged.guarded),
        InBatch::Failed(error) => {
            let span = guard::message_span(&delivery, handler.name(), H::Message::TYPE);
            let recorded = guard::record_attempt_failure(pool, handler, &delivery, error);
            (span.clone(), recorded.instrument(span).await)
        }
    };
    let concluded = guard::conclude(pool, handler, &delivery, &span, guarded);
    concluded.instrument(span.clone()).await
}
