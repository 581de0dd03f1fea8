//! Many messages in one transaction: each is guarded exactly as on its own (claim, ordering
//! guard, handler), and one commit makes them all durable at once.
//!
//! The statements that do not need the handler run once for the whole batch ([`Batch::claim`]):
//! one claims every message's dedup row, one reads the rows that were there already (the
//! duplicates cost nothing more), and one advances every stream under monotonic ordering (the
//! stale cost one write to be marked so). What is left per message is its handler: the check
//! that no handler left the transaction aborted (PostgreSQL) runs once, before the commit. Where the
//! database has no such statements (MySQL), or for a message the bulk claim could not decide (a
//! retry that is due, strict ordering, a second message of one stream), the message is claimed
//! and placed on its own, inside the same transaction.
//!
//! The batch is optimistic: as long as every message is kept or found seen before, nothing needs
//! undoing. When a handler fails, the whole transaction is rolled back and the batch is
//! [`Abandoned::Failed`]: the caller records that message's failure ([`conclude`], its
//! handler is not run again for this attempt) and guards the others again, in a new batch. When
//! the database refuses a statement or the commit, or a handler left the transaction aborted
//! (found by the check before the commit, or by the next statement, refused with an error that
//! says so), the batch is [`Abandoned::Refused`] and each of its messages goes in a transaction
//! of its own, where the handler that left its transaction aborted is found out. So one message's failure neither commits nor
//! loses the others' work, and a batch costs no statement per message beyond the per-message
//! ones (a savepoint per message would cost two more round trips, and on PostgreSQL more than 64
//! written savepoints in one transaction overflow its subtransaction cache). The price: when a
//! message of a batch fails, the handlers that ran before it in the batch run again, their first
//! run rolled back and never committed.

use std::collections::HashSet;

use sqlx::Transaction;
use tracing::{Instrument, Span};

use crate::connection::Connect;
use crate::error::{Error, HandlerError};
use crate::guard::{self, Delivery, Found, Guarded, OpenCheck, Position, Received, Step};
use crate::handler::Handler;
use crate::keys::{Claim, Ordering};
use crate::message::Message;
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;
use crate::storage::messages::{self, Claimed};
use crate::storage::{Backend, bulk};

/// An open batch: one transaction that guarded messages join until it commits.
pub struct Batch<'c, DB: Backend> {
    tx: Transaction<'c, DB>,
}

/// One message of a batch as its claim takes it: for which handler, and as received.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    claimant: (&'static str, &'static str),
    ordering: Ordering,
    received: Received<'a>,
}

impl<'a> Entry<'a> {
    /// `received`, for `handler`.
    pub fn new<DB: Backend, H: Handler<DB>>(handler: &H, received: Received<'a>) -> Self {
        Self {
            claimant: (handler.name(), H::Message::TYPE),
            ordering: handler.ordering(),
            received,
        }
    }
}

/// What [`Batch::claim`] found for one message: hand it to [`Batch::guard`] with the message.
#[derive(Debug)]
pub struct Ticket {
    payload_hash: Vec<u8>,
    /// What is left out is looked up on its own: the claim, the place in the stream.
    found: Found,
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

impl<'c, DB: Backend> Batch<'c, DB> {
    /// Begins a batch on `connection`, at the isolation the guard is written for.
    pub async fn begin<C: Connect<DB> + ?Sized>(connection: &'c mut C) -> Result<Self, Error> {
        Ok(Self {
            tx: connection.begin().await?,
        })
    }

    /// Claims every entry's dedup row, reads those already there and advances the streams of
    /// monotonic ordering, in one statement each; returns a ticket per entry, in order, to guard
    /// it with. A statement the database refuses rolls the batch back.
    pub async fn claim(
        &mut self,
        consumer: &str,
        entries: &[Entry<'_>],
    ) -> Result<Vec<Ticket>, Abandoned> {
        let hashes: Vec<Vec<u8>> = entries
            .iter()
            .map(|entry| guard::content_hash(entry.received.payload))
            .collect();
        let mut found: Vec<Found> = entries.iter().map(|_| Found::default()).collect();
        if bulk::supported::<DB>() {
            let claims: Vec<(usize, Claim<'_>)> = entries
                .iter()
                .zip(&hashes)
                .enumerate()
                .filter(|(_, (entry, _))| {
                    let identity = entry.received.identity;
                    identity.check_ordering(entry.ordering).is_ok()
                })
                .map(|(at, (entry, hash))| (at, claim_of(consumer, entry, hash)))
                .collect();
            let claimed = self.claim_all(consumer, &claims).await?;
            for ((at, _), claimed) in claims.iter().zip(claimed) {
                found[*at].claimed = claimed;
            }
            self.place_all(consumer, entries, &claims, &mut found)
                .await?;
        }
        let tickets = hashes.into_iter().zip(found);
        let ticket = |(payload_hash, found)| Ticket {
            payload_hash,
            found,
        };
        Ok(tickets.map(ticket).collect())
    }

    /// What the bulk claim found for each claim: `New`, `Seen`, or `None` for one to claim on
    /// its own (its row is a failure whose retry is due, or it vanished).
    async fn claim_all(
        &mut self,
        consumer: &str,
        claims: &[(usize, Claim<'_>)],
    ) -> Result<Vec<Option<Claimed>>, Abandoned> {
        let rows: Vec<Claim<'_>> = claims.iter().map(|(_, claim)| *claim).collect();
        let inserted = bulk::claim(&mut self.tx, consumer, &rows)
            .await
            .map_err(refused)?;
        let key = |claim: &Claim<'_>| (claim.handler.to_owned(), claim.message_id.to_owned());
        let there: Vec<(&str, &str)> = rows
            .iter()
            .filter(|claim| !inserted.contains(&key(claim)))
            .map(|claim| (claim.handler, claim.message_id))
            .collect();
        let mut seen = match there.is_empty() {
            true => Default::default(),
            false => bulk::seen(&mut self.tx, consumer, &there)
                .await
                .map_err(refused)?,
        };
        let claimed = rows.iter().map(|claim| {
            if inserted.contains(&key(claim)) {
                return Some(Claimed::New);
            }
            let found = seen.remove(&key(claim))?;
            (!found.retry_due_for(claim)).then_some(Claimed::Seen(found))
        });
        Ok(claimed.collect())
    }

    /// Advances, in one statement, the stream of every newly claimed message under monotonic
    /// ordering (the first message of each stream: a later one takes its place on its own), and
    /// marks each ticket `Next` or `Stale`.
    async fn place_all(
        &mut self,
        consumer: &str,
        entries: &[Entry<'_>],
        claims: &[(usize, Claim<'_>)],
        found: &mut [Found],
    ) -> Result<(), Abandoned> {
        let mut streams = HashSet::new();
        let placeable: Vec<(usize, (&str, &str, i64))> = claims
            .iter()
            .filter(|(at, _)| {
                let monotonic = matches!(entries[*at].ordering, Ordering::Monotonic);
                monotonic && matches!(found[*at].claimed, Some(Claimed::New))
            })
            .filter_map(|(at, claim)| {
                Some((*at, (claim.handler, claim.aggregate?, claim.sequence?)))
            })
            .filter(|(_, (handler, aggregate, _))| streams.insert((*handler, *aggregate)))
            .collect();
        if placeable.is_empty() {
            return Ok(());
        }
        let rows: Vec<(&str, &str, i64)> = placeable.iter().map(|(_, row)| *row).collect();
        let advanced = bulk::advance(&mut self.tx, consumer, &rows)
            .await
            .map_err(refused)?;
        for (at, (handler, aggregate, _)) in placeable {
            let moved = advanced.contains(&(handler.to_owned(), aggregate.to_owned()));
            found[at].placed = Some(if moved {
                Position::Next
            } else {
                Position::Stale
            });
        }
        Ok(())
    }

    /// Guards `message` (as `received`) with `handler` inside the batch, from what the batch's
    /// claim found for it (`ticket`). A message whose handler fails, or a statement the database
    /// refuses, rolls the whole batch back.
    pub async fn guard<H: Handler<DB>>(
        self,
        consumer: &'c str,
        handler: &H,
        message: H::Message,
        received: Received<'c>,
        retry: &'c RetryPolicy,
        ticket: Ticket,
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
        let claim = guard::claim_of(handler, &delivery, &ticket.payload_hash);
        let found = ticket.found;
        let check = OpenCheck::BeforeCommit;
        let attempt = guard::attempt(self.tx, handler, message, &delivery, &claim, found, check);
        let (tx, guarded) = match attempt.instrument(span.clone()).await {
            Ok(Step::Keep(tx, outcome)) => (tx, Ok(outcome)),
            Ok(Step::Undo(tx, seen)) => (tx, seen),
            Ok(Step::Failed(error)) => return Err(abandoned_by(error)),
            Err(_) => return Err(Abandoned::Refused),
        };
        Ok((Self { tx }, Staged { span, guarded }))
    }

    /// Commits every message the batch kept, once it made sure that no handler left the
    /// transaction aborted (which would turn the commit into a silent rollback).
    pub async fn commit(mut self) -> Result<(), Abandoned> {
        if let Err(error) = messages::check_open(&mut self.tx).await {
            tracing::warn!(
                %error,
                "a handler of a batch left its transaction aborted; its messages go one by one"
            );
            return Err(Abandoned::Refused);
        }
        self.tx.commit().await.map_err(|error| {
            tracing::warn!(%error, "a batch could not commit; its messages go one by one");
            Abandoned::Refused
        })
    }
}

/// The dedup row `entry` claims for `consumer`, with its payload's hash.
fn claim_of<'a>(consumer: &'a str, entry: &Entry<'a>, payload_hash: &'a [u8]) -> Claim<'a> {
    let identity = entry.received.identity;
    guard::claim_for(consumer, entry.claimant, identity, payload_hash)
}

/// What a handler's failure does to its batch: it is that message's failure, unless the
/// handler's statement was refused because an earlier handler of the batch had left the
/// transaction aborted; then each message goes in a transaction of its own, where the handler
/// that went on from its failed statement is found out.
fn abandoned_by(error: HandlerError) -> Abandoned {
    match messages::refused_as_aborted(error.get_ref()) {
        true => Abandoned::Refused,
        false => Abandoned::Failed(error),
    }
}

/// A bulk statement the database refused: the batch is rolled back.
fn refused(error: sqlx::Error) -> Abandoned {
    tracing::warn!(%error, "a batch's claim failed; its messages go one by one");
    Abandoned::Refused
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
pub async fn conclude<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
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
            let recorded = guard::record_attempt_failure(connection, handler, &delivery, error);
            (span.clone(), recorded.instrument(span).await)
        }
    };
    let concluded = guard::conclude(connection.pool(), handler, &delivery, &span, guarded);
    concluded.instrument(span.clone()).await
}
