//! The guard: one transaction holding dedup, the ordering check, the user's writes and the
//! bookkeeping, committed before anything is acknowledged.

use sha2::{Digest, Sha256};
use sqlx::{Pool, Transaction};

use crate::backend::{Backend, Claim, Claimed};
use crate::context::Context;
use crate::error::Error;
use crate::handler::{Handler, Headers};
use crate::identity::Identity;
use crate::message::Message;
use crate::outcome::Outcome;

/// Guards and handles `message`, whose `identity` the handler has read, with `handler` for
/// `consumer`, in one transaction.
///
/// 1. claim the dedup row (a row already there is a `Duplicate`, or a `Conflict` if its payload
///    hash differs);
/// 2. if the handler names an aggregate, lock its stream row; with a sequence, skip as `Stale`
///    unless it is newer than the last applied one;
/// 3. run the handler; an error rolls everything back and leaves the message retryable;
/// 4. commit.
pub async fn process<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    message: H::Message,
    identity: &Identity,
    headers: Option<&Headers>,
) -> Result<Outcome, Error> {
    let payload_hash = payload_hash(&message)?;
    let claim = Claim {
        consumer,
        handler: handler.name(),
        message_id: identity.message_id(),
        message_type: H::Message::TYPE,
        aggregate: identity.aggregate(),
        sequence: identity.sequence(),
        payload_hash: &payload_hash,
    };
    let mut tx = DB::begin(pool).await?;
    if let Claimed::Seen { payload_hash } = DB::claim(&mut tx, &claim).await? {
        tx.rollback().await?;
        return Ok(seen_outcome(&payload_hash, claim.payload_hash));
    }
    if !in_order(&mut tx, &claim).await? {
        DB::mark_stale(&mut tx, &claim).await?;
        tx.commit().await?;
        return Ok(Outcome::Stale);
    }
    let mut ctx = Context::new(tx, consumer, handler.name(), identity, headers);
    let handled = handler.handle(&mut ctx, message).await;
    let tx = ctx.into_transaction();
    match handled {
        Ok(()) => {
            tx.commit().await?;
            Ok(Outcome::Processed)
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(%rollback, "rollback after a handler error failed");
            }
            Err(Error::Handler {
                handler: handler.name(),
                error,
            })
        }
    }
}

/// Takes the aggregate's stream lock and applies the sequence guard. `false` means stale.
async fn in_order<DB: Backend>(
    tx: &mut Transaction<'static, DB>,
    claim: &Claim<'_>,
) -> Result<bool, Error> {
    let Some(aggregate) = claim.aggregate else {
        return Ok(true);
    };
    match claim.sequence {
        Some(sequence) => Ok(DB::advance_stream(tx, claim, aggregate, sequence).await?),
        None => {
            DB::lock_stream(tx, claim, aggregate).await?;
            Ok(true)
        }
    }
}

fn seen_outcome(stored_hash: &[u8], delivered_hash: &[u8]) -> Outcome {
    if stored_hash == delivered_hash {
        Outcome::Duplicate
    } else {
        Outcome::Conflict
    }
}

/// SHA-256 of the message's canonical JSON encoding: the same content hashes the same whatever
/// the broker's formatting was.
fn payload_hash<M: Message>(message: &M) -> Result<Vec<u8>, Error> {
    let encoded = serde_json::to_vec(message).map_err(|e| Error::Encode(e.to_string()))?;
    Ok(Sha256::digest(&encoded).to_vec())
}
