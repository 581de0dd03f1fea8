//! What operators list, show and resolve: dead letters, rejected deliveries, messages by status,
//! counts by status, the retries due, and the history of what operators did.

use std::time::Duration;

use sqlx::Pool;

use super::sql::{self, Columns, FromColumns, Param, named};
use super::{Backend, key_params, streams};
use crate::envelope::Envelope;
use crate::error::Error;
use crate::keys::{DeadReason, Headers, MessageKey, MessageStatus, Resolution, Stream};
use crate::text::storable_text;

/// The statements on what the inbox keeps for operators beyond [`OperatorSql`](super::OperatorSql):
/// the consumers there are, operators' actions, and conflicting deliveries
/// ([`Statements::records`](super::Statements::records)).
#[derive(Debug, Clone, Copy)]
pub struct RecordSql {
    /// The smallest consumer greater than a given one; `NULL` after the last ([`consumers`]).
    pub next_consumer: &'static str,
    /// Records an operator's action (`record_action`).
    pub record_action: &'static str,
    /// The actions on a message and on the gaps of its aggregate, in the order they were done
    /// ([`history`]).
    pub message_actions: &'static str,
    /// Sets the outcome of a message's actions that have none yet (`settle_actions`).
    pub settle_message_actions: &'static str,
    /// The actions on a rejected delivery, in the order they were done ([`rejected_history`]).
    pub rejected_actions: &'static str,
    /// Keeps a conflicting delivery, or counts one more delivery of a content kept already
    /// ([`super::messages::keep_conflict`]).
    pub keep_conflict: &'static str,
    /// The conflicts waiting for an operator, of every consumer or of one ([`conflicts`]).
    pub conflicts: &'static str,
    /// One conflict, whatever its state ([`conflict`]).
    pub conflict: &'static str,
    /// The conflicts waiting for an operator, per consumer and handler ([`conflict_counts`]).
    pub conflict_counts: &'static str,
    /// An operator's discard of a conflict waiting for one ([`discard_conflict`]).
    pub discard_conflict: &'static str,
    /// Sets the outcome of a rejected delivery's actions that have none yet
    /// ([`resolve_rejected`], [`replay_rejected_requests`]).
    pub settle_rejected_actions: &'static str,
    /// Rejected deliveries not resolved yet, of every consumer or of one ([`kept_rejected`]).
    pub kept_rejected: &'static str,
    /// One rejected delivery, whatever its state ([`rejected_by_id`]).
    pub rejected_by_id: &'static str,
    /// Asks for a rejected delivery to be dispatched again by its consumer
    /// ([`request_rejected_replay`]).
    pub request_rejected_replay: &'static str,
    /// A consumer's rejected deliveries whose replay an operator asked for
    /// ([`replay_rejected_requests`]).
    pub rejected_replays: &'static str,
    /// Marks a rejected delivery whose requested replay was handed to its handlers `replayed`,
    /// keeping who asked and why ([`replay_rejected_requests`]).
    pub replayed: &'static str,
    /// Puts a rejected delivery whose replay was refused again back in the list, with the new
    /// reason ([`replay_rejected_requests`]).
    pub refused_again: &'static str,
}

/// The [`RecordSql`] of `DB`.
pub(crate) fn record_sql<DB: Backend>() -> RecordSql {
    DB::SQL.records
}

/// What an operator can do to what the inbox keeps, as recorded in `inbox_actions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Handle a dead (or failed) message again.
    Replay,
    /// Never handle a dead (or failed) message.
    Discard,
    /// Skip the gap in front of a stream's parked messages.
    SkipGap,
    /// Dispatch a rejected delivery again.
    ReplayRejected,
    /// Never dispatch a rejected delivery.
    DiscardRejected,
}

impl ActionKind {
    const ALL: [ActionKind; 5] = [
        ActionKind::Replay,
        ActionKind::Discard,
        ActionKind::SkipGap,
        ActionKind::ReplayRejected,
        ActionKind::DiscardRejected,
    ];

    /// The value stored in the column.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Replay => "replay",
            ActionKind::Discard => "discard",
            ActionKind::SkipGap => "skip_gap",
            ActionKind::ReplayRejected => "replay_rejected",
            ActionKind::DiscardRejected => "discard_rejected",
        }
    }

    /// The action a column value names, if it names one.
    pub fn parse(value: &str) -> Option<ActionKind> {
        ActionKind::ALL
            .into_iter()
            .find(|action| action.as_str() == value)
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operator acted on.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A dedup row.
    Message(MessageKey<'a>),
    /// The gap in front of a stream's parked messages.
    Gap(Stream<'a>),
    /// A rejected delivery of a consumer, by its number.
    Rejected {
        /// The consumer group.
        consumer: &'a str,
        /// The delivery's number.
        id: i64,
    },
}

impl<'a> Subject<'a> {
    /// `consumer, handler, message_id, aggregate_id, rejected_id`, in the order of their
    /// placeholders.
    fn params(&self) -> [Param<'a>; 5] {
        match *self {
            Subject::Message(key) => [
                Param::Text(key.consumer),
                Param::Text(key.handler),
                Param::Text(key.message_id),
                Param::MaybeText(None),
                Param::MaybeInt(None),
            ],
            Subject::Gap(stream) => [
                Param::Text(stream.consumer),
                Param::Text(stream.handler),
                Param::MaybeText(None),
                Param::Text(stream.aggregate),
                Param::MaybeInt(None),
            ],
            Subject::Rejected { consumer, id } => [
                Param::Text(consumer),
                Param::MaybeText(None),
                Param::MaybeText(None),
                Param::MaybeText(None),
                Param::MaybeInt(Some(id)),
            ],
        }
    }
}

/// Who did an action, and why.
#[derive(Debug, Clone, Copy)]
pub struct Operator<'a> {
    /// Who.
    pub by: &'a str,
    /// Why.
    pub reason: &'a str,
}

/// Records, on `conn` (in the transaction that does it, if any), that an operator did `action`
/// to `subject`, with its `outcome` if it is known already.
pub(crate) async fn record_action<DB: Backend>(
    conn: &mut DB::Connection,
    subject: &Subject<'_>,
    action: ActionKind,
    operator: Operator<'_>,
    outcome: Option<&str>,
) -> Result<(), sqlx::Error> {
    let (by, reason) = (storable_text(operator.by), storable_text(operator.reason));
    let outcome = outcome.map(storable_text);
    let recorded = [
        Param::Text(action.as_str()),
        Param::Text(&by),
        Param::Text(&reason),
        Param::MaybeText(outcome.as_deref()),
        Param::Flag(outcome.is_some()),
    ];
    let params: Vec<Param<'_>> = subject.params().into_iter().chain(recorded).collect();
    sql::execute::<DB>(conn, record_sql::<DB>().record_action, &params).await?;
    Ok(())
}

/// An operator's action, as the history of what it was done to shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRecord {
    /// What was done.
    pub action: ActionKind,
    /// Who did it.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When, in RFC 3339, UTC.
    pub at: String,
    /// What came of it: recorded once known, or, for the last replay of a message, what its
    /// message says so far; `None` while nothing is known.
    pub outcome: Option<String>,
    /// When the outcome was recorded, in RFC 3339, UTC; `None` for an outcome read off the
    /// message as it stands.
    pub outcome_at: Option<String>,
}

impl FromColumns for ActionRecord {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(ActionRecord {
            action: named(row, 0, ActionKind::parse)?,
            by: row.text(1)?,
            reason: row.text(2)?,
            at: row.text(3)?,
            outcome: row.maybe_text(4)?,
            outcome_at: row.maybe_text(5)?,
        })
    }
}

/// What operators did about `message` of `consumer`, and about the gaps of its aggregate, oldest
/// first: every action is kept, a later one never erases an earlier one. A replay whose
/// outcome is not recorded yet (the latest one) is given what its message says so far: waiting
/// for the sweep, processed, failed again.
pub async fn history<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    message: &StoredMessage,
) -> Result<Vec<ActionRecord>, sqlx::Error> {
    let params = [
        Param::Text(consumer),
        Param::Text(&message.handler),
        Param::Text(&message.message_id),
        Param::MaybeText(message.aggregate_id.as_deref()),
    ];
    let mut conn = pool.acquire().await?;
    let statement = record_sql::<DB>().message_actions;
    let mut actions = sql::fetch_all::<DB, ActionRecord>(&mut conn, statement, &params).await?;
    let pending = |action: &&mut ActionRecord| {
        action.action == ActionKind::Replay && action.outcome.is_none()
    };
    for action in actions.iter_mut().filter(pending) {
        action.outcome = Some(outcome_so_far(message));
    }
    Ok(actions)
}

/// What operators did about rejected delivery `id`, oldest first.
pub async fn rejected_history<DB: Backend>(
    pool: &Pool<DB>,
    id: i64,
) -> Result<Vec<ActionRecord>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let statement = record_sql::<DB>().rejected_actions;
    sql::fetch_all::<DB, ActionRecord>(&mut conn, statement, &[Param::Int(id)]).await
}

/// What came of a replay of `message`, as it stands now.
fn outcome_so_far(message: &StoredMessage) -> String {
    let error = message.error_text.as_deref().unwrap_or("no error recorded");
    match message.status {
        MessageStatus::Processed => "processed".to_owned(),
        MessageStatus::Stale => "skipped as stale".to_owned(),
        MessageStatus::Parked => "parked behind a gap".to_owned(),
        MessageStatus::Discarded => "discarded".to_owned(),
        MessageStatus::Failed if message.attempt_count == 0 => {
            "waiting for the running consumer's next sweep".to_owned()
        }
        MessageStatus::Failed => format!(
            "failed again (attempt {}), to be retried: {error}",
            message.attempt_count
        ),
        MessageStatus::Dead => format!("failed again, dead: {error}"),
    }
}

/// Records, in the transaction on `conn` that acts on message `key` again, what came of its
/// earlier actions that have no outcome yet: what the message says as it stands, before the new
/// action changes it.
pub(crate) async fn settle_actions<DB: Backend>(
    conn: &mut DB::Connection,
    key: &MessageKey<'_>,
) -> Result<(), sqlx::Error> {
    let Some(message) = show_on::<DB>(conn, key).await? else {
        return Ok(());
    };
    let outcome = storable_text(&outcome_so_far(&message)).into_owned();
    let [consumer, handler, message_id] = key_params(key);
    let params = [Param::Text(&outcome), consumer, handler, message_id];
    let statement = record_sql::<DB>().settle_message_actions;
    sql::execute::<DB>(conn, statement, &params).await?;
    Ok(())
}

/// Skips the gap in front of a stream's parked messages, in one transaction under the stream's
/// lock: messages a gap timeout marked dead are parked again, and the stream moves to just before
/// the lowest parked message (never backwards). With an `operator`, records who did it and why.
pub async fn open_gap<DB: Backend>(
    pool: &Pool<DB>,
    stream: &Stream<'_>,
    operator: Option<Operator<'_>>,
) -> Result<(), sqlx::Error> {
    let mut tx = DB::begin(pool).await?;
    let last = streams::lock(&mut tx, stream).await?;
    streams::skip_gap(&mut tx, stream, last).await?;
    if let Some(operator) = operator {
        let subject = Subject::Gap(*stream);
        let outcome = format!("skipped after sequence {last}");
        let skipped = Some(outcome.as_str());
        record_action::<DB>(&mut tx, &subject, ActionKind::SkipGap, operator, skipped).await?;
    }
    tx.commit().await
}

/// Which dead messages to list; every field narrows the list.
///
/// ```
/// use std::time::Duration;
/// # use inbox_core as inbox;
/// use inbox::DeadLetterFilter;
///
/// let recent_billing = DeadLetterFilter::default()
///     .handler("mark_paid")
///     .message_type("order.paid")
///     .failed_within(Duration::from_secs(24 * 3600));
/// # let _ = recent_billing;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterFilter {
    handler: Option<String>,
    message_type: Option<String>,
    failed_within: Option<Duration>,
    limit: Option<i64>,
    offset: i64,
}

impl DeadLetterFilter {
    /// Only this handler's.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// Only messages of this type tag.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// Only messages whose last failure is at most this old (which leaves out parked messages
    /// whose gap timed out: they never failed).
    pub fn failed_within(mut self, age: Duration) -> Self {
        self.failed_within = Some(age);
        self
    }

    /// Only messages whose last failure came at or after `time`: [`failed_within`] the time
    /// since then, as it is when this is called.
    ///
    /// [`failed_within`]: Self::failed_within
    pub fn since(self, time: std::time::SystemTime) -> Self {
        let age = std::time::SystemTime::now().duration_since(time);
        self.failed_within(age.unwrap_or_default())
    }

    /// At most `count` messages: one page of the listing, which is in a stable order (handler,
    /// aggregate, sequence, id), so that pages do not load every dead letter with its payload.
    ///
    /// ```
    /// # use inbox_core as inbox;
    /// use inbox::DeadLetterFilter;
    ///
    /// let second_page = DeadLetterFilter::default().limit(100).offset(100);
    /// # let _ = second_page;
    /// ```
    pub fn limit(mut self, count: u32) -> Self {
        self.limit = Some(i64::from(count));
        self
    }

    /// Skips the first `count` messages of the listing (the pages before this one).
    pub fn offset(mut self, count: u32) -> Self {
        self.offset = i64::from(count);
        self
    }
}

/// A delivery that could not be handled at all, kept with its exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedDelivery {
    /// Its number, for operators.
    pub id: i64,
    /// The type tag it carried.
    pub message_type: String,
    /// The transport's id for the delivery.
    pub delivery_id: String,
    /// The payload, exactly as delivered.
    pub payload: Vec<u8>,
    /// The delivery's headers, as a JSON object.
    pub headers: String,
    /// What was wrong with it.
    pub reason: String,
}

impl RejectedDelivery {
    /// The delivery as it came, to dispatch it again.
    pub fn envelope(&self) -> Result<Envelope, serde_json::Error> {
        let headers: Headers = serde_json::from_str(&self.headers)?;
        let envelope = Envelope::new(&self.message_type, &self.delivery_id, self.payload.clone());
        Ok(headers
            .into_iter()
            .fold(envelope, |envelope, (name, value)| {
                envelope.with_header(name, value)
            }))
    }
}

/// Where a rejected delivery stands, as its `resolution` column says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectedState {
    /// Waiting for an operator.
    Waiting,
    /// An operator asked for it to be dispatched again: its consumer does, on its next sweep.
    ReplayRequested,
    /// Dispatched again, and handed to its handlers.
    Replayed,
    /// Given up on by an operator.
    Discarded,
}

impl RejectedState {
    /// The `resolution` a state is stored as (`None`: waiting).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectedState::Waiting => "waiting",
            RejectedState::ReplayRequested => "replay_requested",
            RejectedState::Replayed => "replayed",
            RejectedState::Discarded => "discarded",
        }
    }

    fn from_resolution(resolution: Option<&str>) -> Option<RejectedState> {
        Some(match resolution {
            None => RejectedState::Waiting,
            Some("replay_requested") => RejectedState::ReplayRequested,
            Some("replayed") => RejectedState::Replayed,
            Some("discarded") => RejectedState::Discarded,
            Some(_) => return None,
        })
    }
}

impl std::fmt::Display for RejectedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected delivery as operators see it: the delivery, whose it is, when it came and where it
/// stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRejected {
    /// The delivery, with its number, bytes, headers and the reason it was rejected.
    pub delivery: RejectedDelivery,
    /// The consumer group it was delivered to.
    pub consumer: String,
    /// When it came, in RFC 3339, UTC.
    pub received_at: String,
    /// Where it stands.
    pub state: RejectedState,
}

impl FromColumns for KeptRejected {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        let resolution = row.maybe_text(8)?;
        let state = RejectedState::from_resolution(resolution.as_deref()).ok_or_else(|| {
            sqlx::Error::ColumnDecode {
                index: "8".to_owned(),
                source: format!("`{resolution:?}` is not a value this column holds").into(),
            }
        })?;
        Ok(KeptRejected {
            delivery: RejectedDelivery::from_columns(row)?,
            consumer: row.text(6)?,
            received_at: row.text(7)?,
            state,
        })
    }
}

/// A delivery whose id was seen before with other content, kept (never applied) next to the
/// message stored under that id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Its number, for operators.
    pub id: i64,
    /// The consumer group.
    pub consumer: String,
    /// The handler whose dedup row it conflicts with.
    pub handler: String,
    /// The id it shares with the stored message.
    pub message_id: String,
    /// The type tag it came with.
    pub message_type: String,
    /// The hash of its content.
    pub payload_hash: Vec<u8>,
    /// The hash of the stored message's content, when the conflict was seen.
    pub stored_payload_hash: Vec<u8>,
    /// The payload, exactly as delivered.
    pub payload: Vec<u8>,
    /// The delivery's headers, as a JSON object.
    pub headers: String,
    /// How many times this content was delivered.
    pub deliveries: i64,
    /// When it was first delivered, in RFC 3339, UTC.
    pub first_seen_at: String,
    /// When it was last delivered, in RFC 3339, UTC.
    pub last_seen_at: String,
    /// What an operator did about it (`discarded`), who and why; `None` while it waits for one.
    pub resolution: Option<Resolved>,
}

/// What an operator decided about something the inbox kept, who, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The decision, as stored.
    pub resolution: String,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

impl FromColumns for Conflict {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(Conflict {
            id: row.int(0)?,
            consumer: row.text(1)?,
            handler: row.text(2)?,
            message_id: row.text(3)?,
            message_type: row.text(4)?,
            payload_hash: row.maybe_bytes(5)?.unwrap_or_default(),
            stored_payload_hash: row.maybe_bytes(6)?.unwrap_or_default(),
            payload: row.maybe_bytes(7)?.unwrap_or_default(),
            headers: row.text(8)?,
            deliveries: row.int(9)?,
            first_seen_at: row.text(10)?,
            last_seen_at: row.text(11)?,
            resolution: match row.maybe_text(12)? {
                Some(resolution) => Some(Resolved {
                    resolution,
                    by: row.maybe_text(13)?.unwrap_or_default(),
                    reason: row.maybe_text(14)?.unwrap_or_default(),
                }),
                None => None,
            },
        })
    }
}

/// A dedup row as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    /// The handler (dedup scope).
    pub handler: String,
    /// The dedup key.
    pub message_id: String,
    /// The type tag.
    pub message_type: String,
    /// The aggregate, if any.
    pub aggregate_id: Option<String>,
    /// The sequence, if any.
    pub sequence_number: Option<i64>,
    /// Where it stands.
    pub status: MessageStatus,
    /// The first error, for a message that failed.
    pub first_error: Option<String>,
    /// The last error, for a failed or dead message (or why a parked one is dead).
    pub error_text: Option<String>,
    /// How many attempts failed.
    pub attempt_count: i32,
    /// The canonical JSON encoding of the message, kept while it is parked, failed, dead or
    /// discarded.
    pub payload: Option<Vec<u8>>,
    /// What an operator did about it: `replayed` or `discarded`.
    pub resolution: Option<String>,
    /// Who did it.
    pub resolved_by: Option<String>,
    /// Why.
    pub resolved_reason: Option<String>,
    /// Why it is dead, if it is.
    pub dead_reason: Option<DeadReason>,
    /// When it was first received, in RFC 3339, UTC (`2026-12-02T21:23:42Z`).
    pub received_at: String,
    /// When its last attempt failed, in RFC 3339, UTC, if one did.
    pub failed_at: Option<String>,
    /// The headers of the delivery it came in (correlation id, trace context, ...), as a JSON
    /// object, kept with the payload while it is parked, failed, dead or discarded.
    pub headers: Option<String>,
}

/// The dedup rows of one handler of one consumer, by status.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerStatus {
    /// The consumer group.
    pub consumer: String,
    /// The handler (dedup scope).
    pub handler: String,
    /// Handled.
    pub processed: i64,
    /// Skipped as older than their aggregate's last applied sequence.
    pub stale: i64,
    /// Waiting for a predecessor (strict ordering).
    pub parked: i64,
    /// Failed, to be retried.
    pub failed: i64,
    /// Given up on: dead letters.
    pub dead: i64,
    /// Dead letters an operator discarded.
    pub discarded: i64,
    /// How long the oldest parked message has waited, in seconds.
    pub oldest_parked_secs: Option<f64>,
}

impl FromColumns for RejectedDelivery {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(RejectedDelivery {
            id: row.int(0)?,
            message_type: row.text(1)?,
            delivery_id: row.text(2)?,
            payload: row.maybe_bytes(3)?.unwrap_or_default(),
            headers: row.text(4)?,
            reason: row.text(5)?,
        })
    }
}

impl FromColumns for StoredMessage {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        let dead_reason = match row.maybe_text(13)? {
            Some(_) => Some(named(row, 13, DeadReason::parse)?),
            None => None,
        };
        Ok(StoredMessage {
            handler: row.text(0)?,
            message_id: row.text(1)?,
            message_type: row.text(2)?,
            aggregate_id: row.maybe_text(3)?,
            sequence_number: row.maybe_int(4)?,
            status: named(row, 5, MessageStatus::parse)?,
            first_error: row.maybe_text(6)?,
            error_text: row.maybe_text(7)?,
            attempt_count: row.int32(8)?,
            payload: row.maybe_bytes(9)?,
            resolution: row.maybe_text(10)?,
            resolved_by: row.maybe_text(11)?,
            resolved_reason: row.maybe_text(12)?,
            dead_reason,
            received_at: row.text(14)?,
            failed_at: row.maybe_text(15)?,
            headers: row.maybe_text(16)?,
        })
    }
}

impl FromColumns for HandlerStatus {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(HandlerStatus {
            consumer: row.text(0)?,
            handler: row.text(1)?,
            processed: row.int(2)?,
            stale: row.int(3)?,
            parked: row.int(4)?,
            failed: row.int(5)?,
            dead: row.int(6)?,
            discarded: row.int(7)?,
            oldest_parked_secs: row.maybe_real(8)?,
        })
    }
}

/// The rejected deliveries of `consumer` that no operator has resolved, oldest first.
pub async fn rejected<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
) -> Result<Vec<RejectedDelivery>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer)];
    sql::fetch_all::<DB, RejectedDelivery>(&mut conn, DB::SQL.operators.rejected, &params).await
}

/// Rejected delivery `id` of `consumer`, if no operator has resolved it.
pub async fn rejected_one<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    id: i64,
) -> Result<Option<RejectedDelivery>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer), Param::Int(id)];
    sql::fetch_optional::<DB, RejectedDelivery>(&mut conn, DB::SQL.operators.rejected_one, &params)
        .await
}

/// Records that an operator replayed or discarded a rejected delivery (one waiting, or whose
/// replay was requested), with the action in its history. Returns `false` if it does not exist
/// or was resolved already.
pub async fn resolve_rejected<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    id: i64,
    resolution: &Resolution<'_>,
) -> Result<bool, sqlx::Error> {
    let (resolved, action) = match resolution.replay {
        true => (RejectedState::Replayed, ActionKind::ReplayRejected),
        false => (RejectedState::Discarded, ActionKind::DiscardRejected),
    };
    let (by, reason) = (
        storable_text(resolution.by),
        storable_text(resolution.reason),
    );
    let params = [
        Param::Text(resolved.as_str()),
        Param::Text(&by),
        Param::Text(&reason),
        Param::Text(consumer),
        Param::Int(id),
    ];
    let mut tx = DB::begin(pool).await?;
    if sql::execute::<DB>(&mut tx, DB::SQL.operators.resolve_rejected, &params).await? != 1 {
        return Ok(false);
    }
    let outcome = resolved.as_str();
    settle_rejected_actions::<DB>(&mut tx, id, outcome).await?;
    let operator = Operator {
        by: resolution.by,
        reason: resolution.reason,
    };
    let subject = Subject::Rejected { consumer, id };
    record_action::<DB>(&mut tx, &subject, action, operator, Some(outcome)).await?;
    tx.commit().await?;
    Ok(true)
}

/// Sets `outcome` on the actions of rejected delivery `id` that have none yet.
async fn settle_rejected_actions<DB: Backend>(
    conn: &mut DB::Connection,
    id: i64,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    let outcome = storable_text(outcome);
    let params = [Param::Text(&outcome), Param::Int(id)];
    sql::execute::<DB>(conn, record_sql::<DB>().settle_rejected_actions, &params).await?;
    Ok(())
}

/// The rejected deliveries no operator has resolved (waiting, or whose replay was requested), of
/// `consumer` or (`None`) of every consumer, oldest first.
pub async fn kept_rejected<DB: Backend>(
    pool: &Pool<DB>,
    consumer: Option<&str>,
) -> Result<Vec<KeptRejected>, sqlx::Error> {
    of_consumer(pool, record_sql::<DB>().kept_rejected, consumer).await
}

/// Rejected delivery `id`, whatever its state.
pub async fn rejected_by_id<DB: Backend>(
    pool: &Pool<DB>,
    id: i64,
) -> Result<Option<KeptRejected>, sqlx::Error> {
    numbered(pool, record_sql::<DB>().rejected_by_id, id).await
}

/// The rows `statement` reads for `consumer`, or (`None`) for every consumer: it takes a flag
/// "every consumer", then the consumer.
async fn of_consumer<DB: Backend, T: FromColumns>(
    pool: &Pool<DB>,
    statement: &'static str,
    consumer: Option<&str>,
) -> Result<Vec<T>, sqlx::Error> {
    let params = [
        Param::Flag(consumer.is_none()),
        Param::Text(consumer.unwrap_or_default()),
    ];
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, T>(&mut conn, statement, &params).await
}

/// The row `statement` reads by its number, `id`.
async fn numbered<DB: Backend, T: FromColumns>(
    pool: &Pool<DB>,
    statement: &'static str,
    id: i64,
) -> Result<Option<T>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_optional::<DB, T>(&mut conn, statement, &[Param::Int(id)]).await
}

/// Asks for rejected delivery `id` of `consumer`, waiting for an operator, to be dispatched
/// again by the running consumer on its next sweep (see [`replay_rejected_requests`]); records
/// who asks and why. Returns `false` if it is not waiting.
pub async fn request_rejected_replay<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    id: i64,
    operator: Operator<'_>,
) -> Result<bool, sqlx::Error> {
    let (by, reason) = (storable_text(operator.by), storable_text(operator.reason));
    let params = [
        Param::Text(&by),
        Param::Text(&reason),
        Param::Text(consumer),
        Param::Int(id),
    ];
    let mut tx = DB::begin(pool).await?;
    let requested = record_sql::<DB>().request_rejected_replay;
    if sql::execute::<DB>(&mut tx, requested, &params).await? != 1 {
        return Ok(false);
    }
    let subject = Subject::Rejected { consumer, id };
    record_action::<DB>(
        &mut tx,
        &subject,
        ActionKind::ReplayRejected,
        operator,
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Dispatches again, with `dispatch`, each rejected delivery of `consumer` whose replay an
/// operator asked for ([`request_rejected_replay`]), oldest first, and records what came of it:
/// this is the part of a runtime's sweep that carries out `inbox rejected replay`. Returns how
/// many were handed to their handlers.
///
/// `dispatch` runs every handler of the delivery's type, as a delivery from the source would.
/// What its result means:
/// - `Ok`, or a handler's failure ([`Error::Handler`]: recorded with the message, which the
///   store now retries): the delivery is `replayed`;
/// - a transient error (the database): nothing is recorded, and the next sweep tries again;
/// - any other error (no handler for its type yet, a payload that does not decode): it is
///   rejected again, back in the list with the new reason, and its action says so.
pub async fn replay_rejected_requests<DB: Backend, F>(
    pool: &Pool<DB>,
    consumer: &str,
    dispatch: impl Fn(Envelope) -> F,
) -> Result<u32, sqlx::Error>
where
    F: Future<Output = Result<(), Error>> + Send,
{
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer)];
    let statement = record_sql::<DB>().rejected_replays;
    let requested = sql::fetch_all::<DB, RejectedDelivery>(&mut conn, statement, &params).await?;
    drop(conn);
    let mut replayed = 0;
    for delivery in requested {
        let dispatched = match delivery.envelope() {
            Ok(envelope) => dispatch(envelope).await,
            Err(error) => Err(Error::Decode {
                message_type: delivery.message_type.clone(),
                reason: format!("stored headers: {error}"),
            }),
        };
        let outcome = match dispatched {
            Ok(()) => Ok("replayed: handled".to_owned()),
            Err(error @ Error::Handler { .. }) => Ok(format!("replayed: {error}")),
            Err(error) if error.is_transient() => continue,
            Err(error) => Err(error.to_string()),
        };
        replayed += u32::from(outcome.is_ok());
        settle_rejected_replay(pool, consumer, delivery.id, outcome).await?;
    }
    Ok(replayed)
}

/// Records what came of the requested replay of rejected delivery `id`: `Ok`, it is `replayed`;
/// `Err`, it waits for an operator again, with the new reason.
async fn settle_rejected_replay<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    id: i64,
    outcome: Result<String, String>,
) -> Result<(), sqlx::Error> {
    let mut tx = DB::begin(pool).await?;
    let settled = match &outcome {
        Ok(outcome) => {
            let params = [Param::Text(consumer), Param::Int(id)];
            sql::execute::<DB>(&mut tx, record_sql::<DB>().replayed, &params).await?;
            outcome.clone()
        }
        Err(reason) => {
            let reason = storable_text(reason);
            let params = [Param::Text(&reason), Param::Text(consumer), Param::Int(id)];
            sql::execute::<DB>(&mut tx, record_sql::<DB>().refused_again, &params).await?;
            format!("rejected again: {reason}")
        }
    };
    settle_rejected_actions::<DB>(&mut tx, id, &settled).await?;
    tx.commit().await
}

/// The dead messages of `consumer` that match `filter`, by handler, aggregate and sequence.
pub async fn dead_letters<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    filter: &DeadLetterFilter,
) -> Result<Vec<StoredMessage>, sqlx::Error> {
    let within = filter.failed_within.map(|age| age.as_secs_f64());
    let params = [
        Param::Text(consumer),
        Param::MaybeText(filter.handler.as_deref()),
        Param::MaybeText(filter.message_type.as_deref()),
        Param::Flag(within.is_none()),
        Param::Real(within.unwrap_or(0.0)),
        Param::Int(filter.limit.unwrap_or(i64::MAX)),
        Param::Int(filter.offset),
    ];
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, StoredMessage>(&mut conn, DB::SQL.operators.dead_letters, &params).await
}

/// One dedup row, as operators see it.
pub async fn show<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
) -> Result<Option<StoredMessage>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    show_on::<DB>(&mut conn, key).await
}

/// One dedup row, as operators see it, read on `conn`.
async fn show_on<DB: Backend>(
    conn: &mut DB::Connection,
    key: &MessageKey<'_>,
) -> Result<Option<StoredMessage>, sqlx::Error> {
    sql::fetch_optional::<DB, StoredMessage>(conn, DB::SQL.operators.show, &key_params(key)).await
}

/// The dedup rows of `consumer` in `status`, by handler, aggregate and sequence.
pub async fn list<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    status: MessageStatus,
) -> Result<Vec<StoredMessage>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer), Param::Text(status.as_str())];
    sql::fetch_all::<DB, StoredMessage>(&mut conn, DB::SQL.operators.list, &params).await
}

/// The `failed` messages of `handler` whose next attempt is due at `now_ms` (Unix epoch
/// milliseconds), soonest first; at most `limit`. Replays an operator requested are due at
/// once.
pub async fn due_retries<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &str,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let params = [
        Param::Text(consumer),
        Param::Text(handler),
        Param::Int(now_ms),
        Param::Int(limit),
    ];
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, String>(&mut conn, DB::SQL.operators.due_retries, &params).await
}

/// `(handler, status, count)` of the parked and dead messages of `consumer`.
pub async fn backlog<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer), Param::Text(consumer)];
    sql::fetch_all::<DB, _>(&mut conn, DB::SQL.operators.backlog, &params).await
}

/// The dedup rows of every consumer and handler, by status.
pub async fn status<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<HandlerStatus>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, HandlerStatus>(&mut conn, DB::SQL.operators.status, &[]).await
}

/// `(consumer, deliveries)` of the rejected deliveries no operator resolved yet.
pub async fn rejected_counts<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, _>(&mut conn, DB::SQL.operators.rejected_counts, &[]).await
}

/// The consumer groups that have dedup rows, in order. Each is found by one lookup of the
/// primary key's leading column (the smallest consumer after the last one found), so the
/// table is never scanned, however many rows each consumer holds.
pub async fn consumers<DB: Backend>(pool: &Pool<DB>) -> Result<Vec<String>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut consumers: Vec<String> = Vec::new();
    loop {
        let after = consumers.last().map_or("", String::as_str);
        let next = record_sql::<DB>().next_consumer;
        match sql::fetch_one::<DB, Option<String>>(&mut conn, next, &[Param::Text(after)]).await? {
            Some(consumer) => consumers.push(consumer),
            None => return Ok(consumers),
        }
    }
}

/// The conflicting deliveries waiting for an operator, of `consumer` or (`None`) of every
/// consumer, oldest first.
pub async fn conflicts<DB: Backend>(
    pool: &Pool<DB>,
    consumer: Option<&str>,
) -> Result<Vec<Conflict>, sqlx::Error> {
    of_consumer(pool, record_sql::<DB>().conflicts, consumer).await
}

/// Conflict `id`, whatever its state.
pub async fn conflict<DB: Backend>(
    pool: &Pool<DB>,
    id: i64,
) -> Result<Option<Conflict>, sqlx::Error> {
    numbered(pool, record_sql::<DB>().conflict, id).await
}

/// Records that an operator gave up on conflict `id` (it is kept, with who and why, but no
/// longer listed); a later delivery of the same content is counted on it, and stays resolved.
/// Returns `false` if no conflict `id` waits for an operator.
pub async fn discard_conflict<DB: Backend>(
    pool: &Pool<DB>,
    id: i64,
    operator: Operator<'_>,
) -> Result<bool, sqlx::Error> {
    let (by, reason) = (storable_text(operator.by), storable_text(operator.reason));
    let params = [Param::Text(&by), Param::Text(&reason), Param::Int(id)];
    let mut conn = pool.acquire().await?;
    let statement = record_sql::<DB>().discard_conflict;
    Ok(sql::execute::<DB>(&mut conn, statement, &params).await? == 1)
}

/// `(consumer, handler, conflicts)` of the conflicting deliveries waiting for an operator.
pub async fn conflict_counts<DB: Backend>(
    pool: &Pool<DB>,
) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_all::<DB, _>(&mut conn, record_sql::<DB>().conflict_counts, &[]).await
}

/// The space the inbox takes, in bytes (PostgreSQL, MySQL: its tables with their indexes;
/// SQLite: the whole database file).
pub async fn storage_bytes<DB: Backend>(pool: &Pool<DB>) -> Result<i64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_one::<DB, i64>(&mut conn, DB::SQL.operators.storage_bytes, &[]).await
}
