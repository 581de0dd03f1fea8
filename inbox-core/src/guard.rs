//! The guard: one transaction holding dedup, the ordering check, the user's writes and the
//! bookkeeping, committed before anything is acknowledged; and, under strict ordering, the release
//! of parked successors, each in a transaction of its own.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::{Instrument, Span};

use sha2::{Digest, Sha256};
use sqlx::{Pool, Transaction};

use crate::connection::Connect;
use crate::context::Context;
use crate::envelope::{decode_payload, panic_text};
use crate::error::{Error, HandlerError};
use crate::handler::Handler;
use crate::identity::Identity;
use crate::keys::{
    Claim, Failure, Headers, MessageKey, MessageStatus, Ordering, Resolution, Stream,
};
use crate::message::Message;
use crate::outcome::Outcome;
use crate::queue::QueueReceipt;
use crate::retry::RetryPolicy;
use crate::storage::messages::{self, Claimed, NotCommitted, Seen};
use crate::storage::operators::{ActionKind, Operator, Subject};
use crate::storage::{Backend, operators, streams};

/// What guarding one message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded {
    /// The outcome of the message itself.
    pub outcome: Outcome,
    /// How many parked successors it released (strict ordering).
    pub released: u32,
}

/// One message as the guard takes it, besides its decoded value: the bytes it was delivered as
/// (their hash is its content for dedup, and they are what is kept for a retry or a replay), its
/// identity and its delivery's headers.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// The payload exactly as delivered.
    pub payload: &'a [u8],
    /// What the handler read from the message: key, aggregate and sequence.
    pub identity: &'a Identity,
    /// The delivery's headers, if it came with any.
    pub headers: Option<&'a Headers>,
    /// The PostgreSQL queue row it was claimed from, deleted in the transaction that commits
    /// its handling (see [`crate::queue`]).
    pub receipt: Option<&'a QueueReceipt>,
}

/// Guards and handles `message`, as `received`, with `handler` for `consumer`.
///
/// In one transaction:
/// 1. claim the dedup row (a row already there is a `Duplicate`, or a `Conflict` if its payload
///    hash differs, the delivery then kept with its payload in `inbox_conflicts`; a failed
///    message is retried only once its retry is due, else [`Error::RetryNotDue`]);
/// 2. if the handler names an aggregate, lock its stream row; with a sequence, skip the message as
///    `Stale` unless it is newer than the last applied one, and under strict ordering park it if it
///    is ahead of the next one;
/// 3. run the handler; an error, a panic, a timeout or a transaction the handler left aborted
///    rolls everything back, and the failure is recorded in a transaction of its own (attempt
///    count, error, payload): the message is retried after the policy's delay, or dead once
///    attempts are exhausted or the error is permanent;
/// 4. commit.
///
/// Then, under strict ordering, release the parked successors that can now apply, in order.
pub async fn process<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    consumer: &str,
    handler: &H,
    message: H::Message,
    received: Received<'_>,
    retry: &RetryPolicy,
) -> Result<Guarded, Error> {
    let span = message_span(consumer, handler, &received);
    process_in(
        connection, consumer, handler, message, received, retry, &span,
    )
    .await
}

/// [`process`], in `span` (from [`message_span`]): a message that ran in a batch that was
/// abandoned, then runs again, stays in the one span it was first given.
pub async fn process_in<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    consumer: &str,
    handler: &H,
    message: H::Message,
    received: Received<'_>,
    retry: &RetryPolicy,
    span: &Span,
) -> Result<Guarded, Error> {
    let delivery = Delivery::new(consumer, received, retry);
    let guarded = guard(connection, handler, message, &delivery)
        .instrument(span.clone())
        .await;
    conclude(connection.pool(), handler, &delivery, span, guarded).await
}

/// After the commit: records the outcome on the message's span and in the metrics, and under
/// strict ordering releases the parked successors that can now apply.
pub(crate) async fn conclude<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    handler: &H,
    delivery: &Delivery<'_>,
    span: &Span,
    guarded: Result<Outcome, Error>,
) -> Result<Guarded, Error> {
    let (consumer, retry) = (delivery.consumer, delivery.retry);
    let label = outcome_label(&guarded);
    span.record("inbox.outcome", label);
    count_outcome(consumer, handler.name(), label);
    let outcome = guarded?;
    let released = match (handler.ordering(), delivery.identity.aggregate()) {
        (Ordering::Strict { .. }, Some(aggregate)) => {
            release_logged(pool, consumer, handler, aggregate, retry).await
        }
        _ => 0,
    };
    Ok(Guarded { outcome, released })
}

/// `inbox_messages_total{consumer, handler, outcome}`: every outcome, failures included.
fn count_outcome(consumer: &str, handler: &'static str, outcome: &'static str) {
    let labels = [
        ("consumer", consumer.to_owned()),
        ("handler", handler.to_owned()),
        ("outcome", outcome.to_owned()),
    ];
    metrics::counter!("inbox_messages_total", &labels).increment(1);
}

/// What the guard knows about one delivery besides the message.
pub(crate) struct Delivery<'a> {
    consumer: &'a str,
    identity: &'a Identity,
    payload: &'a [u8],
    headers: Option<&'a Headers>,
    receipt: Option<&'a QueueReceipt>,
    retry: &'a RetryPolicy,
}

impl<'a> Delivery<'a> {
    pub(crate) fn new(consumer: &'a str, received: Received<'a>, retry: &'a RetryPolicy) -> Self {
        Self {
            consumer,
            identity: received.identity,
            payload: received.payload,
            headers: received.headers,
            receipt: received.receipt,
            retry,
        }
    }
}

/// Guards one message in a transaction of its own: commits what the attempt kept, rolls back
/// what it only read, and records a failure after rolling it back.
async fn guard<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    handler: &H,
    message: H::Message,
    delivery: &Delivery<'_>,
) -> Result<Outcome, Error> {
    delivery.identity.check_ordering(handler.ordering())?;
    let payload_hash = content_hash(delivery.payload);
    let claim = claim_of(handler, delivery, &payload_hash);
    let tx = connection.begin(delivery.retry.timeout()).await?;
    let found = Found::default();
    let check = own_check::<DB>(delivery);
    let attempted = attempt(tx, handler, message, delivery, &claim, found, check);
    let failed = match attempted.await? {
        Step::Keep(tx, outcome) if check == OpenCheck::AtCommit => {
            match messages::commit_checked(tx).await {
                Ok(()) => return Ok(outcome),
                Err(NotCommitted::Aborted(error)) => aborted(error).charged_to_the_handler(),
                Err(NotCommitted::Failed(error)) => return Err(error.into()),
            }
        }
        Step::Keep(tx, outcome) => {
            tx.commit().await?;
            return Ok(outcome);
        }
        Step::Undo(tx, seen) if check == OpenCheck::AtCommit => {
            // It wrote nothing: its rollback goes with the connection's next statement.
            drop(tx);
            return seen;
        }
        Step::Undo(tx, seen) => {
            tx.rollback().await?;
            return seen;
        }
        Step::Failed(error) => error,
    };
    record_attempt_failure(connection, handler, delivery, failed).await
}

/// When the guard checks the transaction of a message on its own: with the commit where the
/// database can, unless a statement runs after the handler (a queue's dequeue), which a
/// transaction the handler left aborted would refuse as the guard's own failure.
fn own_check<DB: Backend>(delivery: &Delivery<'_>) -> OpenCheck {
    match DB::SQL.messages.check_and_commit.is_some() && delivery.receipt.is_none() {
        true => OpenCheck::AtCommit,
        false => OpenCheck::AfterHandler,
    }
}

/// Records that an attempt at a message failed with `error` (its transaction rolled back): see
/// [`record_failure`].
pub(crate) async fn record_attempt_failure<DB: Backend, H: Handler<DB>, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    handler: &H,
    delivery: &Delivery<'_>,
    error: HandlerError,
) -> Result<Outcome, Error> {
    let payload_hash = content_hash(delivery.payload);
    let claim = claim_of(handler, delivery, &payload_hash);
    let failure = Failure {
        payload: delivery.payload,
        headers: &headers_json(delivery.headers),
        error: &error.to_string(),
    };
    let retry = delivery.retry;
    record_failure(connection, handler.name(), &claim, &failure, error, retry).await
}

/// The dedup row a delivery claims for `handler`.
pub(crate) fn claim_of<'a, DB: Backend, H: Handler<DB>>(
    handler: &H,
    delivery: &Delivery<'a>,
    payload_hash: &'a [u8],
) -> Claim<'a> {
    let claimant = (handler.name(), H::Message::TYPE);
    claim_for(delivery.consumer, claimant, delivery.identity, payload_hash)
}

/// The dedup row a message of `identity` claims for `consumer` and a (handler, message type).
pub(crate) fn claim_for<'a>(
    consumer: &'a str,
    (handler, message_type): (&'static str, &'static str),
    identity: &'a Identity,
    payload_hash: &'a [u8],
) -> Claim<'a> {
    Claim {
        consumer,
        handler,
        message_id: identity.message_id(),
        message_type,
        aggregate: identity.aggregate(),
        sequence: identity.sequence(),
        payload_hash,
        now_ms: now_ms(),
    }
}

/// What a batch found out about a message before its turn; nothing, on its own.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// How the message is claimed.
    pub(crate) claimed: Option<Claimed>,
    /// Where it stands in its stream. A batch records the messages it places stale itself, all
    /// in one statement.
    pub(crate) placed: Option<Position>,
}

/// When the guard makes sure that a handler that returned `Ok` left its transaction able to
/// commit ([`messages::check_open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenCheck {
    /// Right after the handler: a message in a transaction of its own.
    AfterHandler,
    /// With the commit, in its round trip ([`messages::commit_checked`]): a message in a
    /// transaction of its own where the database can, and no statement runs after the handler.
    AtCommit,
    /// Once, before the transaction commits: a batch's. Until then, the next statement in an
    /// aborted transaction fails, with an error that says so ([`messages::refused_for_its_transaction`]).
    /// `after_others` says whether other handlers ran in the transaction before this one: one of
    /// them may have left it aborted, and a failure that does not say why is looked into.
    BeforeCommit {
        /// Whether another handler ran in the transaction before this one.
        after_others: bool,
    },
}

/// What one attempt at a message left in its transaction.
pub(crate) enum Step<'c, DB: Backend> {
    /// Its writes are done: commit them, with this outcome.
    Keep(Transaction<'c, DB>, Outcome),
    /// It was seen before and nothing was written: this is what it is.
    Undo(Transaction<'c, DB>, Result<Outcome, Error>),
    /// The handler failed, and the transaction is rolled back: record the failure.
    Failed(HandlerError),
}

/// Claims the message, applies the ordering guard and runs the handler, in `tx`: the guard
/// algorithm, the same whether the transaction is the message's own or a batch's. What a batch
/// already found (`found`: how the message is claimed, its place in its stream) is not looked up
/// again. A database error drops (rolls back) the transaction.
pub(crate) async fn attempt<'c, DB: Backend, H: Handler<DB>>(
    mut tx: Transaction<'c, DB>,
    handler: &H,
    message: H::Message,
    delivery: &Delivery<'c>,
    claim: &Claim<'_>,
    found: Found,
    check: OpenCheck,
) -> Result<Step<'c, DB>, Error> {
    let (claimed, placed) = match found.claimed {
        Some(claimed) => (claimed, found.placed),
        None => claim_placing(&mut tx, claim, handler.ordering()).await?,
    };
    // A stale message its batch placed is recorded already.
    let settled = found.placed == Some(Position::Stale);
    let attempt = match claimed {
        Claimed::New => 1,
        Claimed::Retry { attempt } => attempt,
        Claimed::Seen(seen) => return seen_step(tx, claim, delivery, &seen).await,
    };
    tracing::Span::current().record("inbox.attempt", attempt);
    let position = match placed {
        Some(position) => position,
        None => position(&mut tx, claim, handler.ordering()).await?,
    };
    let outcome = match position {
        Position::Stale => {
            if !settled {
                messages::settle(&mut tx, &claim.key(), MessageStatus::Stale).await?;
            }
            Outcome::Stale
        }
        Position::Ahead => {
            let headers = headers_json(delivery.headers);
            streams::park(&mut tx, &claim.key(), delivery.payload, &headers).await?;
            Outcome::Parked
        }
        Position::Next => {
            let attempted = Attempt {
                consumer: delivery.consumer,
                identity: delivery.identity,
                headers: delivery.headers,
                number: attempt,
                timeout: delivery.retry.timeout(),
                check,
            };
            match run_handler(tx, handler, &attempted, message).await {
                Ok(done) => tx = done,
                Err(error) if error.lost_connection() => {
                    let handler = handler.name();
                    return Err(Error::ConnectionLost { handler, error });
                }
                Err(error) => return Ok(Step::Failed(error)),
            }
            Outcome::Processed
        }
    };
    if let Some(receipt) = delivery.receipt {
        DB::dequeue(&mut tx, receipt).await?;
    }
    Ok(Step::Keep(tx, outcome))
}

/// What a delivery whose dedup row is there already comes to: nothing is written and its
/// transaction is undone, except for a conflict (same id, other content), which is kept in the
/// transaction, with the delivery's payload and headers, for an operator.
async fn seen_step<'c, DB: Backend>(
    mut tx: Transaction<'c, DB>,
    claim: &Claim<'_>,
    delivery: &Delivery<'_>,
    seen: &Seen,
) -> Result<Step<'c, DB>, Error> {
    let outcome = seen_outcome(claim, seen);
    if !matches!(outcome, Ok(Outcome::Conflict)) {
        return Ok(Step::Undo(tx, outcome));
    }
    let headers = headers_json(delivery.headers);
    let stored = &seen.payload_hash;
    messages::keep_conflict(&mut tx, claim, stored, delivery.payload, &headers).await?;
    Ok(Step::Keep(tx, Outcome::Conflict))
}

/// Now, in Unix epoch milliseconds, the clock retries are scheduled by.
fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// The content of a payload, for dedup: the SHA-256 of its canonical JSON form (objects' keys in
/// order, no whitespace; numbers as parsed), so that a redelivery of the same bytes, or the same
/// document encoded with its keys in another order (a `HashMap` field), is the same content. It is
/// taken over what was delivered, never over a re-encoding of the decoded message: a field added
/// with `#[serde(default)]` does not change the content of what was sent before the deploy.
/// Bytes that are not JSON are hashed as they are. The numbers a parsed document does not hold
/// exactly (an integer past 64 bits, a decimal with more digits than an `f64` keeps) are hashed
/// too, as written, so that two documents differing only there are two contents, not a
/// duplicate; a document without any is hashed as its canonical form alone.
pub(crate) fn content_hash(payload: &[u8]) -> Vec<u8> {
    let Ok(document) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return Sha256::digest(payload).to_vec();
    };
    let inexact = crate::numbers::inexact(&document, payload);
    let mut hash = Sha256::new();
    hash.update(canonical_json(document));
    for literal in inexact {
        hash.update(b"\n");
        hash.update(literal);
    }
    hash.finalize().to_vec()
}

/// The bytes [`Process::process`](crate::Process::process) guards a message by, when it was not
/// delivered as bytes: its canonical JSON form, as [`content_hash`] takes it.
pub(crate) fn canonical_payload<M: Message>(message: &M) -> Result<Vec<u8>, Error> {
    let document = serde_json::to_value(message).map_err(|e| Error::Encode(e.to_string()))?;
    Ok(canonical_json(document))
}

/// `document` encoded with every object's keys in order, however `serde_json` orders its maps.
fn canonical_json(document: serde_json::Value) -> Vec<u8> {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|(a, _), (b, _)| a.cmp(b));
                entries.into_iter().map(|(k, v)| (k, sorted(v))).collect()
            }
            serde_json::Value::Array(items) => items.into_iter().map(sorted).collect(),
            other => other,
        }
    }
    // A `Value` always encodes: its keys are strings and its numbers finite.
    serde_json::to_vec(&sorted(document)).unwrap_or_default()
}

/// The span of one message handled by `handler` for `consumer`, named and attributed after the
/// OpenTelemetry messaging conventions, plus the inbox's own `inbox.*` fields.
/// `messaging.destination.name` and the conversation id come from the `destination` and
/// correlation id headers when present; `inbox.attempt` and `inbox.outcome` are recorded as they
/// become known. One span per delivery and handler, whether the message runs once or, after its
/// batch was abandoned, again ([`process_in`], [`crate::batch::Ticket::in_span`],
/// [`crate::batch::conclude`]).
pub fn message_span<DB: Backend, H: Handler<DB>>(
    consumer: &str,
    handler: &H,
    received: &Received<'_>,
) -> Span {
    let (handler, message_type) = (handler.name(), H::Message::TYPE);
    let headers = received.headers;
    let header = |name: &str| {
        headers
            .and_then(|headers| headers.get(name))
            .map(String::as_str)
    };
    let identity = received.identity;
    let span = tracing::info_span!(
        "inbox.process",
        otel.kind = "consumer",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.message.id = identity.message_id(),
        messaging.consumer.group.name = consumer,
        messaging.destination.name = header("destination"),
        messaging.message.conversation_id = headers.and_then(crate::envelope::correlation_id),
        inbox.handler = handler,
        inbox.message_type = message_type,
        inbox.aggregate = identity.aggregate(),
        inbox.sequence = identity.sequence(),
        inbox.attempt = tracing::field::Empty,
        inbox.outcome = tracing::field::Empty,
    );
    crate::trace_context::adopt_parent(&span, headers);
    span
}

/// The `inbox.outcome` of a guarded message, failures included.
fn outcome_label(guarded: &Result<Outcome, Error>) -> &'static str {
    match guarded {
        Ok(outcome) => outcome.as_str(),
        Err(error) => failure_label(error),
    }
}

/// The `inbox.outcome` of a message whose guarding failed: dead, to be retried, or an error
/// that left it as it was.
fn failure_label(error: &Error) -> &'static str {
    match error {
        Error::Handler {
            retry_after: None, ..
        } => Outcome::Dead.as_str(),
        Error::Handler { .. } | Error::RetryNotDue { .. } => Outcome::Retrying.as_str(),
        _ => "error",
    }
}

fn headers_json(headers: Option<&Headers>) -> String {
    headers
        .map(crate::keys::headers_to_json)
        .unwrap_or_else(|| "{}".to_owned())
}

/// Records a failed attempt in a transaction of its own, after the attempt's rolled back, and
/// decides what comes next: returns [`Error::Handler`], saying when the message is due again or
/// that it is dead. If the row was settled meanwhile, or holds another content of the same id,
/// that is the outcome instead. If the failure cannot be recorded, the database error is returned,
/// so that the delivery is not acknowledged.
async fn record_failure<DB: Backend, C: Connect<DB> + ?Sized>(
    connection: &mut C,
    handler: &'static str,
    claim: &Claim<'_>,
    failure: &Failure<'_>,
    error: HandlerError,
    retry: &RetryPolicy,
) -> Result<Outcome, Error> {
    let key = claim.key();
    let recorded = async {
        let mut tx = connection.begin(retry.timeout()).await?;
        let Some(failed) = messages::record_failure(&mut tx, claim, failure).await? else {
            return Ok(Recorded::Superseded(superseded(tx, claim, failure).await?));
        };
        let retry_after = match error.is_permanent() {
            true => None,
            false => retry.delay_after(failed),
        };
        match retry_after {
            None => messages::bury(&mut tx, &key, None).await?,
            Some(delay) => {
                let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
                let due = now_ms().saturating_add(delay_ms);
                messages::schedule_retry(&mut tx, &key, due).await?
            }
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(Recorded::Attempt(failed, retry_after))
    };
    match recorded.await {
        Ok(Recorded::Attempt(attempt, retry_after)) => {
            if retry_after.is_none() {
                tracing::warn!(handler = claim.handler, message_id = claim.message_id, attempt, %error, "message is dead");
            }
            Err(Error::Handler {
                handler,
                error,
                attempt,
                retry_after,
            })
        }
        Ok(Recorded::Superseded(Some(seen))) => seen_outcome(claim, &seen),
        Ok(Recorded::Superseded(None)) => Err(Error::Database(sqlx::Error::RowNotFound)),
        Err(database) => {
            tracing::error!(handler = claim.handler, message_id = claim.message_id, %error, %database, "could not record a failure; the delivery stays unacknowledged");
            Err(Error::Database(database))
        }
    }
}

/// Ends the transaction of a failure that could not be recorded: its row was settled meanwhile,
/// or holds another content of the same id, and then the failed delivery is kept as a conflict.
/// Returns the row as it is.
async fn superseded<DB: Backend>(
    mut tx: Transaction<'_, DB>,
    claim: &Claim<'_>,
    failure: &Failure<'_>,
) -> Result<Option<Seen>, sqlx::Error> {
    let seen = messages::seen(&mut tx, &claim.key()).await?;
    match seen
        .as_ref()
        .filter(|seen| seen.payload_hash != claim.payload_hash)
    {
        Some(other) => {
            let (payload, headers) = (failure.payload, failure.headers);
            messages::keep_conflict(&mut tx, claim, &other.payload_hash, payload, headers).await?;
            tx.commit().await?;
        }
        None => tx.rollback().await?,
    }
    Ok(seen)
}

/// What recording a failure found.
enum Recorded {
    /// The failed attempt `n` is recorded, due again after the delay (`None`: dead).
    Attempt(u32, Option<Duration>),
    /// The row holds another state or another content (as seen), so nothing was recorded.
    Superseded(Option<Seen>),
}

/// Where a claimed message stands in its aggregate's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// Apply it now.
    Next,
    /// Not newer than the last applied one: skip it.
    Stale,
    /// Strict ordering, and its predecessor has not applied yet: park it.
    Ahead,
}

impl Position {
    /// Where a message is under monotonic ordering once its stream was advanced to it: next if
    /// the stream moved, stale if it was at this sequence or past it already.
    pub(crate) fn after_advance(moved: bool) -> Self {
        match moved {
            true => Position::Next,
            false => Position::Stale,
        }
    }
}

/// Claims `claim`'s dedup row; under monotonic ordering, where the database can, a new
/// message's stream is advanced by the same statement and its position comes with the claim.
async fn claim_placing<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    ordering: Ordering,
) -> Result<(Claimed, Option<Position>), Error> {
    let in_stream = claim.stream().is_some() && claim.sequence.is_some();
    if !(in_stream && matches!(ordering, Ordering::Monotonic)) {
        return Ok((messages::claim(tx, claim).await?, None));
    }
    let (claimed, moved) = messages::claim_advancing(tx, claim).await?;
    Ok((claimed, moved.map(Position::after_advance)))
}

/// Takes the aggregate's stream lock and applies the sequence guard.
async fn position<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    ordering: Ordering,
) -> Result<Position, Error> {
    let Some(stream) = claim.stream() else {
        return Ok(Position::Next);
    };
    let Some(sequence) = claim.sequence else {
        streams::lock(tx, &stream).await?;
        return Ok(Position::Next);
    };
    if let Ordering::Monotonic = ordering {
        let advanced = streams::advance(tx, &stream, sequence).await?;
        return Ok(Position::after_advance(advanced));
    }
    let last = streams::lock(tx, &stream).await?;
    Ok(match sequence.saturating_sub(last) {
        ..=0 => Position::Stale,
        1 => {
            streams::set(tx, &stream, sequence).await?;
            Position::Next
        }
        _ => Position::Ahead,
    })
}

/// One attempt to run a handler: for whom, on what, which attempt, and for how long at most.
struct Attempt<'a> {
    consumer: &'a str,
    identity: &'a Identity,
    headers: Option<&'a Headers>,
    number: u32,
    timeout: Duration,
    check: OpenCheck,
}

/// Runs the handler inside `tx`. An error, a panic, running past the attempt's timeout, or
/// leaving the transaction aborted (a failed statement the handler went on from; checked here
/// unless the attempt's check is before its batch commits) rolls back and returns the error.
async fn run_handler<'c, DB: Backend, H: Handler<DB>>(
    tx: Transaction<'c, DB>,
    handler: &H,
    attempt: &Attempt<'c>,
    message: H::Message,
) -> Result<Transaction<'c, DB>, HandlerError> {
    let (identity, headers) = (attempt.identity, attempt.headers);
    let mut ctx = Context::guarded(
        tx,
        attempt.consumer,
        handler.name(),
        identity,
        headers,
        attempt.number,
    );
    let started = Instant::now();
    let handling = AssertUnwindSafe(handler.handle(&mut ctx, message)).catch_unwind();
    let handled = match tokio::time::timeout(attempt.timeout, handling).await {
        Ok(finished) => {
            finished.unwrap_or_else(|panic| Err(HandlerError::msg(panic_message(&*panic))))
        }
        Err(_) => Err(HandlerError::msg(format!(
            "handler timed out after {:?}",
            attempt.timeout
        ))),
    };
    metrics::histogram!("inbox_handler_duration_seconds", "handler" => handler.name())
        .record(started.elapsed().as_secs_f64());
    let mut tx = ctx.into_transaction();
    let handled = match handled {
        Ok(()) if attempt.check == OpenCheck::AfterHandler || messages::ends_whole::<DB>() => {
            messages::check_open(&mut tx).await.map_err(aborted)
        }
        Ok(()) => Ok(()),
        Err(error) if attempt.check == (OpenCheck::BeforeCommit { after_others: true }) => {
            Err(blame(&mut tx, error).await)
        }
        Err(error) => Err(error),
    };
    match handled {
        Ok(()) => Ok(tx),
        Err(error) => match tx.rollback().await {
            Ok(()) => Err(error.charged_to_the_handler()),
            Err(rollback) => {
                tracing::warn!(%rollback, "rollback after a handler error failed");
                Err(error)
            }
        },
    }
}

/// The failure of a handler that returned `Ok` on a transaction it left unable to commit, or
/// the connection lost under it (which is no failure of the handler's: see
/// [`HandlerError::lost_connection`]).
fn aborted(error: sqlx::Error) -> HandlerError {
    if crate::error::connection_lost(&error) {
        return HandlerError::from(error);
    }
    if matches!(&error, sqlx::Error::AnyDriverError(cause) if cause.is::<messages::RolledBack>()) {
        return HandlerError::msg(format!(
            "the handler returned Ok, but {error}: a handler must return the error of a statement \
             the server ended its transaction for (a deadlock), and the message is tried again"
        ));
    }
    HandlerError::msg(format!(
        "the handler returned Ok, but its transaction can no longer commit ({error}); a statement \
         that may fail must run in a savepoint (`tx.begin()`) for the handler to go on after it"
    ))
}

/// The failure of a handler that ran after others in its batch's transaction. An error that
/// names no database error (a message made of a `sqlx` error's text, say) cannot tell whether
/// the handler's statement failed for itself or was refused because an earlier handler left the
/// transaction aborted: then, if the transaction is aborted, the error is that refusal, and the
/// batch's messages go one by one, where the one to blame is found out.
async fn blame<DB: Backend>(tx: &mut Transaction<'_, DB>, error: HandlerError) -> HandlerError {
    if crate::error::database_causes(error.get_ref())
        .next()
        .is_some()
    {
        return error;
    }
    match messages::check_open(tx).await {
        Ok(()) => error,
        Err(refusal) => {
            tracing::debug!(%error, %refusal, "a handler failed in an aborted batch");
            HandlerError::from(refusal)
        }
    }
}

/// What a handler's panic said, as an error message.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    format!("handler panicked: {}", panic_text(panic))
}

/// The least time a delivery that came before its message's retry was due is handed back for.
/// A batch decides which retries are due when it claims its messages; one that came due while
/// the batch ran is still not due for it, and without this floor its delivery would be handed
/// back to come again at once.
const NOT_DUE_AT_LEAST: Duration = Duration::from_millis(100);

/// The outcome of a message seen before: a `Conflict` if its content differs (logged, kept for an
/// operator by the caller, never applied), `Dead` if it was given up on, [`Error::RetryNotDue`]
/// if it failed and its retry is not due yet, else a `Duplicate`.
fn seen_outcome(claim: &Claim<'_>, seen: &Seen) -> Result<Outcome, Error> {
    if seen.payload_hash != claim.payload_hash {
        tracing::warn!(
            consumer = claim.consumer,
            handler = claim.handler,
            message_id = claim.message_id,
            "conflict: a message with this id was seen before with different content; not applied"
        );
        return Ok(Outcome::Conflict);
    }
    match seen.status {
        MessageStatus::Dead => Ok(Outcome::Dead),
        MessageStatus::Failed => {
            let wait_ms = seen.retry_at_ms.unwrap_or(0).saturating_sub(claim.now_ms);
            let wait = Duration::from_millis(wait_ms.max(0).unsigned_abs());
            Err(Error::RetryNotDue {
                handler: claim.handler.to_owned(),
                message_id: claim.message_id.to_owned(),
                retry_after: wait.max(NOT_DUE_AT_LEAST),
            })
        }
        _ => Ok(Outcome::Duplicate),
    }
}

/// How many parked successors a guarded message releases before its delivery is settled; the
/// rest are released by the runtime's next sweep ([`resume`]), so that a long chain does not
/// outlast the broker's ack deadline.
pub const RELEASES_PER_MESSAGE: u32 = 100;

/// Releases the parked successors of `aggregate` that can apply now, each in its own transaction,
/// in sequence order, until one fails or `limit` have been released. Returns how many applied.
///
/// A released message that fails goes the way of any failure: recorded with its attempt and
/// error, retried by `retry` (from the store, see [`retry_due`]) or dead; its successors wait
/// behind it. One whose handler lost its database connection stays parked, for the next
/// release ([`Error::ConnectionLost`]). A crash between two releases loses nothing: what was
/// released is committed, the rest stays parked, and the next delivery for the aggregate (or
/// [`resume`]) carries on.
pub async fn release<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
    limit: u32,
) -> Result<u32, Error> {
    let mut released = 0;
    while released < limit {
        match release_next(pool, consumer, handler, aggregate, retry).await? {
            Some(outcome) => released += u32::from(outcome == Outcome::Released),
            None => break,
        }
    }
    Ok(released)
}

/// [`release`] after a message was guarded, if anything is parked for its aggregate: a failure
/// stops the chain and is logged (a failed release is recorded like any failure), since the
/// message itself is settled.
async fn release_logged<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
) -> u32 {
    let stream = Stream {
        consumer,
        handler: handler.name(),
        aggregate,
    };
    match streams::has_parked(pool, &stream).await {
        Ok(false) => return 0,
        Ok(true) => {}
        Err(error) => {
            tracing::warn!(%error, "could not check for parked messages; trying to release")
        }
    }
    let mut released = 0;
    while released < RELEASES_PER_MESSAGE {
        match release_next(pool, consumer, handler, aggregate, retry).await {
            Ok(Some(outcome)) => released += u32::from(outcome == Outcome::Released),
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(handler = handler.name(), aggregate, %error, "releasing a parked message failed");
                break;
            }
        }
    }
    released
}

/// Applies the lowest parked message of the stream if it is the next one (`Released`), or settles
/// it as `Stale` if its sequence was applied meanwhile. `None` when nothing can be released. A
/// parked message that no longer decodes is marked dead with the reason. Whatever came of it is
/// counted in `inbox_messages_total`, whoever released it (a delivery, a sweep, an operator).
async fn release_next<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
) -> Result<Option<Outcome>, Error> {
    let released = release_parked(pool, consumer, handler, aggregate, retry).await;
    let label = match &released {
        Ok(None) => None,
        Ok(Some(outcome)) => Some(outcome.as_str()),
        Err(error) => Some(failure_label(error)),
    };
    if let Some(label) = label {
        count_outcome(consumer, handler.name(), label);
    }
    released
}

/// [`release_next`], uncounted.
async fn release_parked<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
) -> Result<Option<Outcome>, Error> {
    let stream = Stream {
        consumer,
        handler: handler.name(),
        aggregate,
    };
    let mut tx = pool.begin_with(DB::begin_within(retry.timeout())).await?;
    let last = streams::lock(&mut tx, &stream).await?;
    let Some(parked) = streams::next_parked(&mut tx, &stream, last.saturating_add(1)).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    let key = MessageKey {
        consumer,
        handler: handler.name(),
        message_id: &parked.message_id,
    };
    if parked.sequence_number <= last {
        messages::settle(&mut tx, &key, MessageStatus::Stale).await?;
        tx.commit().await?;
        return Ok(Some(Outcome::Stale));
    }
    let (message, headers, identity) =
        match decode_stored(handler, &parked.payload, parked.headers.as_deref()) {
            Ok(decoded) => decoded,
            Err(error) => {
                tx.rollback().await?;
                bury_undecodable(pool, &key, "released", &error).await?;
                return Ok(Some(Outcome::Dead));
            }
        };
    streams::set(&mut tx, &stream, parked.sequence_number).await?;
    let received = Received {
        payload: &parked.payload,
        identity: &identity,
        headers: Some(&headers),
        receipt: None,
    };
    let span = message_span(consumer, handler, &received);
    let applied = apply_released(pool, tx, handler, &key, &received, message, retry);
    let applied = applied.instrument(span.clone()).await;
    span.record("inbox.outcome", outcome_label(&applied));
    applied.map(Some)
}

/// Runs the handler of a released message in `tx`, where its stream was advanced to it, and
/// settles it as processed; a failure is recorded like a delivery's.
async fn apply_released<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    tx: Transaction<'_, DB>,
    handler: &H,
    key: &MessageKey<'_>,
    received: &Received<'_>,
    message: H::Message,
    retry: &RetryPolicy,
) -> Result<Outcome, Error> {
    let consumer = key.consumer;
    let attempt = Attempt {
        consumer,
        identity: received.identity,
        headers: received.headers,
        number: 1,
        timeout: retry.timeout(),
        check: OpenCheck::AfterHandler,
    };
    tracing::Span::current().record("inbox.attempt", 1);
    match run_handler(tx, handler, &attempt, message).await {
        Ok(mut tx) => {
            messages::settle(&mut tx, key, MessageStatus::Processed).await?;
            tx.commit().await?;
            Ok(Outcome::Released)
        }
        Err(error) if error.lost_connection() => {
            let handler = handler.name();
            Err(Error::ConnectionLost { handler, error })
        }
        Err(error) => {
            let payload_hash = content_hash(received.payload);
            let claim = Claim {
                consumer,
                handler: handler.name(),
                message_id: key.message_id,
                message_type: H::Message::TYPE,
                aggregate: received.identity.aggregate(),
                sequence: received.identity.sequence(),
                payload_hash: &payload_hash,
                now_ms: now_ms(),
            };
            let failure = Failure {
                payload: received.payload,
                headers: &headers_json(received.headers),
                error: &error.to_string(),
            };
            let handler = handler.name();
            record_failure(&mut pool.clone(), handler, &claim, &failure, error, retry).await
        }
    }
}

/// Releases what can be released for every aggregate of `handler`: what a failed, bounded or
/// crashed release chain left parked behind an applied predecessor. An aggregate whose release
/// fails is logged and left for the next attempt; the others go on.
pub async fn resume<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    retry: &RetryPolicy,
) -> Result<u32, Error> {
    let mut released = 0;
    for aggregate in streams::releasable(pool, consumer, handler.name()).await? {
        match release(pool, consumer, handler, &aggregate, retry, u32::MAX).await {
            Ok(count) => released += count,
            Err(error) => {
                tracing::warn!(handler = handler.name(), aggregate, %error, "releasing a parked message failed")
            }
        }
    }
    Ok(released)
}

/// Skips the gap in front of the parked messages of `aggregate`, deliberately, for a predecessor
/// known to be lost (see [`open_gap`]), and releases what can apply. Returns how many were
/// released.
pub async fn skip_gap<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    aggregate: &str,
    retry: &RetryPolicy,
) -> Result<u32, Error> {
    let stream = Stream {
        consumer,
        handler: handler.name(),
        aggregate,
    };
    open_gap(pool, &stream).await?;
    release(pool, consumer, handler, aggregate, retry, u32::MAX).await
}

/// Skips the gap in front of a stream's parked messages without releasing them: messages a gap
/// timeout marked dead are parked again, and the stream moves to just before the lowest parked
/// message (never backwards). The runtime that owns the handler releases them on its next sweep;
/// this is how an operator skips a gap from outside the consumer's process.
pub async fn open_gap<DB: Backend>(pool: &Pool<DB>, stream: &Stream<'_>) -> Result<(), Error> {
    operators::open_gap(pool, stream, None).await?;
    tracing::warn!(
        handler = stream.handler,
        aggregate = stream.aggregate,
        "gap skipped by an operator"
    );
    Ok(())
}

/// The parked messages of one aggregate that waited too long for a missing predecessor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredGap {
    /// The aggregate.
    pub aggregate: String,
    /// The sequence that never arrived.
    pub missing_sequence: i64,
    /// How many parked messages were marked dead.
    pub messages: i64,
}

/// Marks dead, with the reason "gap timeout at sequence n", the parked messages of every aggregate
/// of `handler` whose oldest parked message has waited longer than `timeout` behind a real gap.
/// Each aggregate is checked again under its stream lock, so a gap that fills meanwhile, or a
/// release in progress, is left alone.
pub async fn expire_gaps<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &str,
    timeout: Duration,
) -> Result<Vec<ExpiredGap>, Error> {
    let mut expired = Vec::new();
    for aggregate in streams::overdue_gaps(pool, consumer, handler, timeout.as_secs_f64()).await? {
        let stream = Stream {
            consumer,
            handler,
            aggregate: &aggregate,
        };
        let mut tx = DB::begin(pool).await?;
        let last = streams::lock(&mut tx, &stream).await?;
        let buried = streams::bury_gap(&mut tx, &stream, last, timeout.as_secs_f64()).await?;
        tx.commit().await?;
        if let Some((missing_sequence, messages)) = buried {
            tracing::warn!(
                handler,
                aggregate,
                missing_sequence,
                "gap timeout: parked messages are dead"
            );
            expired.push(ExpiredGap {
                aggregate,
                missing_sequence,
                messages,
            });
        }
    }
    Ok(expired)
}

/// Replays dead message `message_id` of `handler`, after its handler or data was fixed, recording
/// who replays it and why: it is handled again from its first attempt, so a replay that succeeds is
/// `Processed`, and one that fails is recorded like any failure (and retried by a runtime's sweep,
/// see [`retry_due`]). A message that is already handled is a `Duplicate`, like any
/// redelivery.
pub async fn replay<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    message_id: &str,
    by_reason: (&str, &str),
    retry: &RetryPolicy,
) -> Result<Outcome, Error> {
    let key = MessageKey {
        consumer,
        handler: handler.name(),
        message_id,
    };
    match request_replay(pool, &key, by_reason).await {
        Ok(()) => rerun(pool, consumer, handler, message_id, retry).await,
        Err(Error::NotDead { .. }) if messages::stored(pool, &key).await?.is_some() => {
            Ok(Outcome::Duplicate)
        }
        Err(error) => Err(error),
    }
}

/// Asks for dead (or failed) message `key` to be replayed, recording who asks and why (in the
/// message's history of operators' actions, where what came of an earlier replay is kept too),
/// without handling it: the runtime that owns its handler does, on its next sweep (see
/// [`retry_due`]). This is how an operator replays from outside the consumer's process.
pub async fn request_replay<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    by_reason: (&str, &str),
) -> Result<(), Error> {
    resolve_dead(pool, key, true, by_reason).await
}

/// Discards a dead (or failed) message: it stays, with its payload and who discarded it and why
/// (in its history of operators' actions), but is never retried.
pub async fn discard<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    by_reason: (&str, &str),
) -> Result<(), Error> {
    resolve_dead(pool, key, false, by_reason).await
}

async fn resolve_dead<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    replay: bool,
    (by, reason): (&str, &str),
) -> Result<(), Error> {
    let action = if replay { "replay" } else { "discard" };
    let resolution = Resolution { replay, by, reason };
    let mut tx = DB::begin(pool).await?;
    operators::settle_actions::<DB>(&mut tx, key).await?;
    if !messages::resolve(&mut tx, key, &resolution).await? {
        return Err(Error::NotDead {
            handler: key.handler.to_owned(),
            message_id: key.message_id.to_owned(),
            action,
        });
    }
    let (kind, outcome) = match replay {
        true => (ActionKind::Replay, None),
        false => (ActionKind::Discard, Some("discarded")),
    };
    let (subject, operator) = (Subject::Message(*key), Operator { by, reason });
    operators::record_action::<DB>(&mut tx, &subject, kind, operator, outcome).await?;
    tx.commit().await?;
    tracing::warn!(
        handler = key.handler,
        message_id = key.message_id,
        by,
        reason,
        action,
        "dead message resolved by an operator"
    );
    Ok(())
}

/// Retries the `failed` messages of `handler` whose next attempt is due, each from its stored
/// payload through the guarded path, soonest first; at most 500 per call. Replays an operator
/// requested ([`request_replay`]) are due at once. Once a failure is recorded the store owns the
/// retry: this is how a message is retried when its redelivery never comes (a broker that gave up,
/// dead-lettered it on its own, or moved its offset past it), and how a released message that
/// failed is retried. A message that fails again is recorded like any failure; one that can no
/// longer be decoded is dead at once, with the reason; one whose try ends with nothing recorded
/// (its connection lost) is put off, longer each time ([`messages::postpone_retry`]). Returns how
/// many were processed.
pub async fn retry_due<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    retry: &RetryPolicy,
) -> Result<u32, Error> {
    let mut processed = 0;
    for message_id in operators::due_retries(pool, consumer, handler.name(), now_ms(), 500).await? {
        match rerun(pool, consumer, handler, &message_id, retry).await {
            Ok(outcome) => processed += u32::from(outcome == Outcome::Processed),
            Err(error) if error.is_unrecorded() => {
                tracing::warn!(handler = handler.name(), message_id, %error, "a retry from the store failed; putting it off");
                let key = MessageKey {
                    consumer,
                    handler: handler.name(),
                    message_id: &message_id,
                };
                let put_off = messages::postpone_retry(pool, &key, now_ms(), retry.bounds_ms());
                if let Err(error) = put_off.await {
                    tracing::warn!(message_id, %error, "could not put off a failed retry");
                }
            }
            Err(_) => {}
        }
    }
    Ok(processed)
}

/// Handles a failed message again from its stored payload and headers; one that cannot be decoded
/// any more is marked dead with the reason.
async fn rerun<DB: Backend, H: Handler<DB>>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &H,
    message_id: &str,
    retry: &RetryPolicy,
) -> Result<Outcome, Error> {
    let key = MessageKey {
        consumer,
        handler: handler.name(),
        message_id,
    };
    let Some(stored) = messages::stored(pool, &key)
        .await?
        .filter(|s| s.status == MessageStatus::Failed)
    else {
        return Ok(Outcome::Duplicate);
    };
    let payload = stored.payload.as_deref().unwrap_or_default();
    let (message, headers, identity) =
        match decode_stored(handler, payload, stored.headers.as_deref()) {
            Ok(decoded) => decoded,
            Err(error) => {
                bury_undecodable(pool, &key, "replayed", &error).await?;
                return Err(error);
            }
        };
    let received = Received {
        payload,
        identity: &identity,
        headers: Some(&headers),
        receipt: None,
    };
    let mut pool = pool.clone();
    let guarded = process(&mut pool, consumer, handler, message, received, retry);
    Ok(guarded.await?.outcome)
}

/// Marks dead a failed or parked message whose stored payload no longer decodes, with the reason
/// "cannot be `action`: ...".
async fn bury_undecodable<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    action: &str,
    error: &Error,
) -> Result<(), Error> {
    let reason = format!("cannot be {action}: {error}");
    tracing::warn!(handler = key.handler, message_id = key.message_id, %reason, "message is dead");
    let mut tx = DB::begin(pool).await?;
    messages::bury(&mut tx, key, Some(&reason)).await?;
    tx.commit().await?;
    Ok(())
}

/// A stored message, its headers and its identity, decoded for `handler`.
fn decode_stored<DB: Backend, H: Handler<DB>>(
    handler: &H,
    payload: &[u8],
    headers: Option<&str>,
) -> Result<(H::Message, Headers, Identity), Error> {
    let message: H::Message = decode_payload(H::Message::TYPE, payload)?;
    let headers: Headers = match headers {
        Some(headers) => decode_payload(H::Message::TYPE, headers.as_bytes())?,
        None => Headers::new(),
    };
    let identity = handler.identity(&message)?;
    Ok((message, headers, identity))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_at(now_ms: i64) -> Claim<'static> {
        Claim {
            consumer: "billing",
            handler: "credit",
            message_id: "m-1",
            message_type: "credited",
            aggregate: None,
            sequence: None,
            payload_hash: b"hash",
            now_ms,
        }
    }

    fn failed(retry_at_ms: i64) -> Seen {
        Seen {
            payload_hash: b"hash".to_vec(),
            status: MessageStatus::Failed,
            retry_at_ms: Some(retry_at_ms),
        }
    }

    fn retry_after(outcome: Result<Outcome, Error>) -> Option<Duration> {
        match outcome {
            Err(Error::RetryNotDue { retry_after, .. }) => Some(retry_after),
            _ => None,
        }
    }

    #[test]
    fn a_document_of_exact_numbers_is_hashed_as_its_canonical_form() {
        let delivered = br#"{"b": 1.50, "a": [1, 2, 18446744073709551615]}"#;
        let canonical = br#"{"a":[1,2,18446744073709551615],"b":1.5}"#;
        assert_eq!(content_hash(delivered), Sha256::digest(canonical).to_vec());
    }

    #[test]
    fn documents_that_differ_only_in_a_number_a_value_cannot_hold_are_two_contents() {
        let pairs: [(&[u8], &[u8]); 2] = [
            (
                br#"{"amount":18446744073709551616}"#,
                br#"{"amount":18446744073709551617}"#,
            ),
            (br#"{"rate":0.1000000000000000001}"#, br#"{"rate":0.1}"#),
        ];
        for (one, other) in pairs {
            assert_ne!(content_hash(one), content_hash(other));
        }
    }

    #[test]
    fn a_document_with_its_keys_in_another_order_is_the_same_content_whatever_its_numbers() {
        let one = br#"{"a":18446744073709551616,"b":0.1000000000000000001}"#;
        let other = br#"{"b":0.1000000000000000001, "a":18446744073709551616}"#;
        assert_eq!(content_hash(one), content_hash(other));
    }

    #[test]
    fn a_retry_not_due_is_handed_back_for_the_time_left() {
        let outcome = seen_outcome(&claim_at(1_000), &failed(6_000));
        assert_eq!(retry_after(outcome), Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_retry_that_came_due_meanwhile_is_never_handed_back_at_once() {
        let outcome = seen_outcome(&claim_at(6_001), &failed(6_000));
        assert_eq!(retry_after(outcome), Some(NOT_DUE_AT_LEAST));
    }
}
