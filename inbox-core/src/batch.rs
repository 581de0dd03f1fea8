//! Many messages in one transaction: each is guarded exactly as on its own (claim, ordering
//! guard, handler), and one commit makes them all durable at once.
//!
//! The statements that do not need the handler run once for the whole batch ([`Batch::claim`]):
//! one claims every message's dedup row, one reads the rows that were there already (the
//! duplicates cost nothing more), and one advances every stream under monotonic ordering (the
//! stale cost one write to be marked so); on MySQL, which cannot say which rows a statement
//! wrote, the reads come before the writes, and the advance is three statements (see
//! [`BulkClaim`](crate::storage::BulkClaim) and [`BulkAdvance`](crate::storage::BulkAdvance)).
//! What is left per message is its handler: the check that no handler left the transaction
//! aborted (PostgreSQL) runs once, before the commit. For a message the bulk claim could not
//! decide (a retry that is due, strict ordering), the message is claimed and placed on its own,
//! inside the same transaction. A batch may hold several messages of one stream, one after the
//! other: they are placed in bulk too, as each would have been after the one before it; and a
//! copy of an earlier message of the batch is taken as seen from that one.
//!
//! The batch is optimistic: as long as every message is kept or found seen before, nothing needs
//! undoing. When a handler fails, the whole transaction is rolled back and the batch is
//! [`Abandoned::Failed`]: the caller records that message's failure ([`conclude`], its
//! handler is not run again for this attempt) and guards the others again: those before it in a
//! batch that commits before the failure is recorded (as one transaction per message would), then
//! those after it. When the database refuses a statement or the commit, or a handler left the
//! transaction aborted (found by the check before the commit, or by the next statement, refused
//! with an error that says so however the handler's error type wraps it; a handler that fails
//! after another with an error that names no database error is looked into with the same check),
//! or a handler's statement was chosen to end a deadlock or a serialization conflict, the batch
//! is [`Abandoned::Refused`] and each of its messages goes in a transaction of its own, where the
//! handler that left its transaction aborted is found out, and a conflict is the one message's
//! own. So one message's failure neither commits nor loses the others' work, and a batch costs
//! no statement per message beyond the per-message ones (a savepoint per message would cost two
//! more round trips, and on PostgreSQL more than 64 written savepoints in one transaction
//! overflow its subtransaction cache). The price: when a message of a batch fails, the handlers
//! that ran before it in the batch run again, their first run rolled back and never committed.

use std::collections::{HashMap, HashSet, hash_map};

use sqlx::Transaction;
use tracing::{Instrument, Span};

use crate::connection::Connect;
use crate::error::{Error, HandlerError};
use crate::guard::{self, Delivery, Found, Guarded, OpenCheck, Position, Received, Step};
use crate::handler::Handler;
use crate::keys::{Claim, MessageStatus, Ordering};
use crate::message::Message;
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;
use crate::storage::Backend;
use crate::storage::bulk::{self, StreamKey};
use crate::storage::messages::{self, Claimed, NotCommitted, Seen};

/// An open batch: one transaction that guarded messages join until it commits.
pub struct Batch<'c, DB: Backend> {
    tx: Transaction<'c, DB>,
    /// Whether a handler ran in the transaction: one that runs after it may find it aborted.
    handled: bool,
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
    /// The span the message is guarded in; a new one if none was given.
    span: Option<Span>,
}

impl Ticket {
    /// Guards the message in `span` (from [`crate::message_span`]), the span it keeps when its
    /// batch is abandoned and it runs again.
    pub fn in_span(self, span: Span) -> Self {
        Self {
            span: Some(span),
            ..self
        }
    }
}

/// A message guarded in a batch, its outcome waiting for the batch's commit: hand it to
/// [`conclude`] (as [`InBatch::Staged`]) once [`Batch::commit`] succeeded.
pub struct Staged {
    guarded: Result<Outcome, Error>,
}

/// Why a batch was rolled back, with everything it held.
#[derive(Debug)]
pub enum Abandoned {
    /// The handler of the message being guarded failed with this error: record it with
    /// [`conclude`] (as [`InBatch::Failed`]), and guard the batch's other messages again (those
    /// before it first, committed before the failure is recorded).
    Failed(HandlerError),
    /// The database refused a statement or the commit: handle each of the batch's messages again,
    /// each in a transaction of its own (with [`crate::process`]).
    Refused,
}

impl<'c, DB: Backend> Batch<'c, DB> {
    /// Begins a batch on `connection`, at the isolation the guard is written for, each of its
    /// statements bounded by `timeout` where the database can bound them (the longest attempt
    /// timeout of its handlers: see [`Backend::begin_within`]).
    pub async fn begin<C: Connect<DB> + ?Sized>(
        connection: &'c mut C,
        timeout: std::time::Duration,
    ) -> Result<Self, Error> {
        Ok(Self {
            tx: connection.begin(timeout).await?,
            handled: false,
        })
    }

    /// Claims every entry's dedup row, reads those already there and advances the streams of
    /// monotonic ordering, in a statement or two each; returns a ticket per entry, in order, to guard
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
        let (claims, copies) = distinct_claims(consumer, entries, &hashes);
        let claimed = self.claim_all(consumer, &claims).await?;
        for ((at, _), claimed) in claims.iter().zip(claimed) {
            found[*at].claimed = claimed;
        }
        for (copy, original) in copies {
            found[copy].claimed = copy_found(&found[original].claimed, &hashes[original]);
        }
        self.place_all(consumer, entries, &claims, &mut found)
            .await?;
        let tickets = hashes.into_iter().zip(found);
        let ticket = |(payload_hash, found)| Ticket {
            payload_hash,
            found,
            span: None,
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
        let bulk::Claims { inserted, mut seen } = bulk::claim(&mut self.tx, consumer, &rows)
            .await
            .map_err(refused)?;
        let key = |claim: &Claim<'_>| (claim.handler.to_owned(), claim.message_id.to_owned());
        let claimed = rows.iter().map(|claim| {
            if inserted.contains(&key(claim)) {
                return Some(Claimed::New);
            }
            let found = seen.remove(&key(claim))?;
            (!found.retry_due_for(claim)).then_some(Claimed::Seen(found))
        });
        Ok(claimed.collect())
    }

    /// Places in bulk the newly claimed messages of monotonic ordering: one statement advances
    /// each stream to its first message's sequence (or finds it stale), one reads where the
    /// streams that did not move stand, and each stream's messages of the batch are placed after
    /// that (newer than the last applied: next; else stale); the same advance once more moves the
    /// streams to the last ones applied, and one statement settles every stale one. A stream's
    /// messages after one the bulk claim did not decide (a retry that is due) take their place
    /// on their own.
    async fn place_all(
        &mut self,
        consumer: &str,
        entries: &[Entry<'_>],
        claims: &[(usize, Claim<'_>)],
        found: &mut [Found],
    ) -> Result<(), Abandoned> {
        let monotonic = |at: usize| matches!(entries[at].ordering, Ordering::Monotonic);
        let runs = runs(claims, found, monotonic);
        if runs.is_empty() {
            return Ok(());
        }
        let firsts: Vec<(&str, &str, i64)> = runs.iter().map(Run::first).collect();
        let advanced = bulk::advance(&mut self.tx, consumer, &firsts)
            .await
            .map_err(refused)?;
        let behind = self.behind(consumer, &runs, &advanced).await?;
        let mut extended = Vec::new();
        for run in &runs {
            let (handler, aggregate, first) = run.first();
            let stream = run.stream();
            // Where the stream stood before the run, and where it stands now: moved to the first
            // message, or at or past it (where it stands is read only for a run of several).
            let (before, now) = match (advanced.contains(&stream), behind.get(&stream)) {
                (true, _) => (i64::MIN, first),
                (false, Some(&last)) => (last, last),
                (false, None) => (first, first),
            };
            let last = run.place(found, before);
            if last > now {
                extended.push((handler, aggregate, last));
            }
        }
        if !extended.is_empty() {
            let moved = bulk::advance(&mut self.tx, consumer, &extended)
                .await
                .map_err(refused)?;
            if moved.len() != extended.len() {
                // A stream moved from under its lock: the database did not keep its promise.
                return Err(refused(sqlx::Error::RowNotFound));
            }
        }
        self.settle_stale(consumer, claims, found).await
    }

    /// The last applied sequence of each stream of `runs` that the bulk advance did not move (its
    /// first message was stale) and that has more messages in the batch: the row is there,
    /// locked by the advance.
    async fn behind(
        &mut self,
        consumer: &str,
        runs: &[Run<'_>],
        advanced: &HashSet<StreamKey>,
    ) -> Result<HashMap<StreamKey, i64>, Abandoned> {
        let behind: Vec<(&str, &str)> = runs
            .iter()
            .filter(|run| run.messages.len() > 1 && !advanced.contains(&run.stream()))
            .map(|run| (run.handler, run.aggregate))
            .collect();
        if behind.is_empty() {
            return Ok(HashMap::new());
        }
        let lasts = bulk::last_sequences(&mut self.tx, consumer, &behind)
            .await
            .map_err(refused)?;
        match lasts.len() == behind.len() {
            true => Ok(lasts),
            // A stream row gone from under its lock: the database did not keep its promise.
            false => Err(refused(sqlx::Error::RowNotFound)),
        }
    }

    /// Settles in one statement the messages that bulk placing found stale (the guard leaves
    /// them as they are).
    async fn settle_stale(
        &mut self,
        consumer: &str,
        claims: &[(usize, Claim<'_>)],
        found: &[Found],
    ) -> Result<(), Abandoned> {
        let stale: Vec<(&str, &str)> = claims
            .iter()
            .filter(|(at, _)| found[*at].placed == Some(Position::Stale))
            .map(|(_, claim)| (claim.handler, claim.message_id))
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        bulk::settle_stale(&mut self.tx, consumer, &stale)
            .await
            .map_err(refused)
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
        let span = ticket
            .span
            .unwrap_or_else(|| guard::message_span(consumer, handler, &received));
        let delivery = Delivery::new(consumer, received, retry);
        if received
            .identity
            .check_ordering(handler.ordering())
            .is_err()
        {
            return Err(Abandoned::Refused);
        }
        let claim = guard::claim_of(handler, &delivery, &ticket.payload_hash);
        let found = ticket.found;
        let mut handled = self.handled;
        let check = OpenCheck::BeforeCommit {
            after_others: handled,
        };
        let attempt = guard::attempt(self.tx, handler, message, &delivery, &claim, found, check);
        let (tx, guarded) = match attempt.instrument(span).await {
            Ok(Step::Keep(tx, outcome)) => {
                handled |= outcome == Outcome::Processed;
                (tx, Ok(outcome))
            }
            Ok(Step::Undo(tx, seen)) => (tx, seen),
            Ok(Step::Failed(error)) => return Err(abandoned_by(error)),
            Err(_) => return Err(Abandoned::Refused),
        };
        Ok((Self { tx, handled }, Staged { guarded }))
    }

    /// Commits every message the batch kept, once it made sure that no handler left the
    /// transaction aborted (which would turn the commit into a silent rollback).
    /// The check and the commit take one round trip where the database can
    /// ([`messages::commit_checked`]).
    pub async fn commit(self) -> Result<(), Abandoned> {
        match messages::commit_checked(self.tx).await {
            Ok(()) => Ok(()),
            Err(NotCommitted::Aborted(error)) => {
                tracing::warn!(
                    %error,
                    "a handler of a batch left its transaction aborted; its messages go one by one"
                );
                Err(Abandoned::Refused)
            }
            Err(NotCommitted::Failed(error)) => {
                tracing::warn!(%error, "a batch could not commit; its messages go one by one");
                Err(Abandoned::Refused)
            }
        }
    }
}

/// A copy of an earlier message of a batch: its place in the batch, and the original's.
type Copied = (usize, usize);

/// The claims of a batch's entries that the bulk claim takes (each with its place in the
/// batch), and the copies of an earlier message of the batch, which are claimed after it, from
/// it. Entries whose sequence strict ordering refuses are in neither.
fn distinct_claims<'a>(
    consumer: &'a str,
    entries: &[Entry<'a>],
    hashes: &'a [Vec<u8>],
) -> (Vec<(usize, Claim<'a>)>, Vec<Copied>) {
    let mut originals = HashMap::new();
    let mut copies = Vec::new();
    let claims = entries
        .iter()
        .zip(hashes)
        .enumerate()
        .filter(|(_, (entry, _))| {
            let identity = entry.received.identity;
            identity.check_ordering(entry.ordering).is_ok()
        })
        .map(|(at, (entry, hash))| (at, claim_of(consumer, entry, hash)))
        .filter(
            |(at, claim)| match originals.entry((claim.handler, claim.message_id)) {
                hash_map::Entry::Occupied(original) => {
                    copies.push((*at, *original.get()));
                    false
                }
                hash_map::Entry::Vacant(slot) => {
                    slot.insert(*at);
                    true
                }
            },
        )
        .collect();
    (claims, copies)
}

/// The messages of one stream that a batch places in bulk, in batch order.
struct Run<'a> {
    handler: &'a str,
    aggregate: &'a str,
    /// Each message's place in the batch, and its sequence.
    messages: Vec<(usize, i64)>,
}

impl<'a> Run<'a> {
    /// The stream, and the sequence of its first message in the batch.
    fn first(&self) -> (&'a str, &'a str, i64) {
        (self.handler, self.aggregate, self.messages[0].1)
    }

    /// The stream's key.
    fn stream(&self) -> StreamKey {
        (self.handler.to_owned(), self.aggregate.to_owned())
    }

    /// Places each message after the stream's last applied sequence `last` (`i64::MIN` where the
    /// first message advanced the stream): next if it is newer than the last one applied, else
    /// stale, as one after the other on their own. Returns the sequence of the last one applied.
    fn place(&self, found: &mut [Found], mut last: i64) -> i64 {
        for &(at, sequence) in &self.messages {
            let newer = sequence > last;
            found[at].placed = Some(match newer {
                true => Position::Next,
                false => Position::Stale,
            });
            last = last.max(sequence);
        }
        last
    }
}

/// Each stream's run of messages to place in bulk: in batch order, those newly claimed under
/// monotonic ordering, up to the first message of the stream that is neither that nor seen
/// before (seen ones and copies of an earlier message of the batch never touch the stream).
/// `monotonic` says whether the message at a place in the batch is under monotonic ordering.
fn runs<'a>(
    claims: &[(usize, Claim<'a>)],
    found: &[Found],
    monotonic: impl Fn(usize) -> bool,
) -> Vec<Run<'a>> {
    let mut runs: Vec<Run<'a>> = Vec::new();
    // Each stream's run, or `None` once a message of the stream was not placeable.
    let mut streams: HashMap<(&str, &str), Option<usize>> = HashMap::new();
    for (at, claim) in claims {
        let (Some(aggregate), Some(sequence)) = (claim.aggregate, claim.sequence) else {
            continue;
        };
        let placeable = match &found[*at].claimed {
            Some(Claimed::Seen(_)) => continue,
            Some(Claimed::New) => monotonic(*at),
            _ => false,
        };
        let stream = (claim.handler, aggregate);
        match (streams.get(&stream), placeable) {
            (Some(Some(run)), true) => runs[*run].messages.push((*at, sequence)),
            (None, true) => {
                streams.insert(stream, Some(runs.len()));
                runs.push(Run {
                    handler: claim.handler,
                    aggregate,
                    messages: vec![(*at, sequence)],
                });
            }
            (_, false) => {
                streams.insert(stream, None);
            }
            (Some(None), true) => {}
        }
    }
    runs
}

/// How a copy of an earlier message of the batch is claimed, from how that message was: seen
/// before as it was, or, where the batch claimed it new, seen as the batch has it (its row is
/// there by the time the copy's turn comes: a failure abandons the whole batch). What the bulk
/// claim left undecided is claimed on its own, after the earlier message.
fn copy_found(original: &Option<Claimed>, original_hash: &[u8]) -> Option<Claimed> {
    match original {
        Some(Claimed::New) => Some(Claimed::Seen(Seen {
            payload_hash: original_hash.to_vec(),
            status: MessageStatus::Processed,
            retry_at_ms: None,
        })),
        Some(Claimed::Seen(seen)) => Some(Claimed::Seen(seen.clone())),
        _ => None,
    }
}

/// The dedup row `entry` claims for `consumer`, with its payload's hash.
fn claim_of<'a>(consumer: &'a str, entry: &Entry<'a>, payload_hash: &'a [u8]) -> Claim<'a> {
    let identity = entry.received.identity;
    guard::claim_for(consumer, entry.claimant, identity, payload_hash)
}

/// What a handler's failure does to its batch: it is that message's failure, unless the
/// handler's statement was refused for the batch's transaction: left aborted by an earlier
/// handler of the batch, or chosen to end a deadlock or serialization conflict over the locks the
/// batch holds. Then each message goes in a transaction of its own, where the handler that went
/// on from its failed statement is found out, and a conflict is one message's own.
fn abandoned_by(error: HandlerError) -> Abandoned {
    match messages::refused_for_its_transaction(error.get_ref()) {
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
/// the metrics, in `span` (the one its ticket was given, [`Ticket::in_span`]), and under strict
/// ordering its parked successors are released.
pub async fn conclude<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    consumer: &str,
    handler: &H,
    received: Received<'_>,
    retry: &RetryPolicy,
    in_batch: InBatch,
    span: &Span,
) -> Result<Guarded, Error> {
    let delivery = Delivery::new(consumer, received, retry);
    let guarded = match in_batch {
        InBatch::Staged(staged) => staged.guarded,
        InBatch::Failed(error) => {
            let recorded = guard::record_attempt_failure(connection, handler, &delivery, error);
            recorded.instrument(span.clone()).await
        }
    };
    let concluded = guard::conclude(connection.pool(), handler, &delivery, span, guarded);
    concluded.instrument(span.clone()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(message_id: &'static str, aggregate: &'static str, sequence: i64) -> Claim<'static> {
        Claim {
            consumer: "billing",
            handler: "credit",
            message_id,
            message_type: "credited",
            aggregate: Some(aggregate),
            sequence: Some(sequence),
            payload_hash: &[],
            now_ms: 0,
        }
    }

    fn found(claimed: Option<Claimed>) -> Found {
        Found {
            claimed,
            placed: None,
        }
    }

    fn seen() -> Option<Claimed> {
        Some(Claimed::Seen(Seen {
            payload_hash: Vec::new(),
            status: MessageStatus::Processed,
            retry_at_ms: None,
        }))
    }

    #[test]
    fn a_streams_run_skips_what_was_seen_and_ends_at_what_the_bulk_claim_left_undecided() {
        let claims: Vec<(usize, Claim<'static>)> = [
            claim("a1", "a", 1),
            claim("b1", "b", 1),
            claim("a0", "a", 5),
            claim("a3", "a", 3),
            claim("b2", "b", 2),
            claim("a2", "a", 2),
            claim("b3", "b", 3),
        ]
        .into_iter()
        .enumerate()
        .collect();
        let new = || Some(Claimed::New);
        let mut found = [new(), new(), seen(), new(), None, new(), new()].map(found);

        let monotonic = runs(&claims, &found, |_| true);
        let placed: Vec<(&str, Vec<usize>)> = monotonic
            .iter()
            .map(|run| (run.aggregate, run.messages.iter().map(|m| m.0).collect()))
            .collect();
        assert_eq!(
            placed,
            [("a", vec![0, 3, 5]), ("b", vec![1])],
            "a's seen message is no part of its run; b's run ends at the retry left undecided"
        );
        let positions = |found: &[Found]| [0, 3, 5].map(|at| found[at].placed);
        assert_eq!(monotonic[0].place(&mut found, i64::MIN), 3);
        assert_eq!(
            positions(&found),
            [Position::Next, Position::Next, Position::Stale].map(Some),
            "after the first one, which moved the stream"
        );
        assert_eq!(monotonic[0].place(&mut found, 2), 3);
        assert_eq!(
            positions(&found),
            [Position::Stale, Position::Next, Position::Stale].map(Some),
            "after a stream that stood at 2"
        );
        assert!(
            runs(&claims, &found, |_| false).is_empty(),
            "strict ordering"
        );
    }
}
