//! Dedup rows, as the guard reads and writes them on every message: the claim, failures and their
//! retries, settling, burying, operators' replays and discards, conflicting deliveries, and
//! rejected deliveries.

use sqlx::{Pool, Transaction};

use super::sql::{self, Columns, FromColumns, Param, named};
use super::{Backend, OpenProbe, Returning, insert_unless_there, key_params, returning};
use crate::envelope::Envelope;
use crate::keys::{Claim, DeadReason, Failure, MessageKey, MessageStatus, Resolution};
use crate::text::storable_text;

/// The answer to a [`Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// First time: the dedup row is now held by this transaction.
    New,
    /// Failed before, with the same content: this is attempt `attempt`, and the row is held by
    /// this transaction.
    Retry {
        /// 2 for the first retry.
        attempt: u32,
    },
    /// Seen before, with this payload hash and status.
    Seen(Seen),
}

/// A dedup row already there, as a claim finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The hash stored when the message was first recorded.
    pub payload_hash: Vec<u8>,
    /// Where it stands.
    pub status: MessageStatus,
    /// When a `failed` message's next attempt is due, in Unix epoch milliseconds.
    pub retry_at_ms: Option<i64>,
}

impl FromColumns for Seen {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(Seen {
            payload_hash: row.maybe_bytes(0)?.unwrap_or_default(),
            status: named(row, 1, MessageStatus::parse)?,
            retry_at_ms: row.maybe_int(2)?,
        })
    }
}

impl Seen {
    /// Whether `claim` may take this row for its next attempt now.
    pub(crate) fn retry_due_for(&self, claim: &Claim<'_>) -> bool {
        self.status == MessageStatus::Failed
            && self.payload_hash == claim.payload_hash
            && self.retry_at_ms.is_some_and(|due| due <= claim.now_ms)
    }
}

/// The stored content of a message, for a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPayload {
    /// Where it stands.
    pub status: MessageStatus,
    /// The payload as delivered, while it is kept.
    pub payload: Option<Vec<u8>>,
    /// The delivery's headers, as a JSON object.
    pub headers: Option<String>,
}

impl FromColumns for StoredPayload {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(StoredPayload {
            status: named(row, 0, MessageStatus::parse)?,
            payload: row.maybe_bytes(1)?,
            headers: row.maybe_text(2)?,
        })
    }
}

fn claim_params<'a>(claim: &Claim<'a>) -> [Param<'a>; 7] {
    [
        Param::Text(claim.consumer),
        Param::Text(claim.handler),
        Param::Text(claim.message_id),
        Param::Text(claim.message_type),
        Param::MaybeText(claim.aggregate),
        Param::MaybeInt(claim.sequence),
        Param::Bytes(claim.payload_hash),
    ]
}

/// Inserts the dedup row, or reports the one already there; a `failed` row of the same content
/// whose retry is due is taken for the next attempt. The row already there is read before it is
/// written, so concurrent duplicates only read it (on MySQL, where a duplicate insert leaves a
/// shared lock, writing it would deadlock them).
pub async fn claim<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
) -> Result<Claimed, sqlx::Error> {
    Ok(claim_with(tx, claim, None).await?.0)
}

/// Claims as [`claim`]; for a new message, where the database can in the same statement
/// ([`MessageSql::claim_and_advance`](super::MessageSql::claim_and_advance)), also advances its
/// stream as [`super::streams::advance`] does and says whether the stream moved (`None`: not
/// advanced). Only for a claim with a stream and a sequence, under monotonic ordering.
pub async fn claim_advancing<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
) -> Result<(Claimed, Option<bool>), sqlx::Error> {
    claim_with(tx, claim, DB::SQL.messages.claim_and_advance).await
}

async fn claim_with<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    advancing: Option<&'static str>,
) -> Result<(Claimed, Option<bool>), sqlx::Error> {
    // A row that conflicts and is then gone was purged in between: claim it again.
    for _ in 0..3 {
        if let Some(claimed) = try_claim(tx, claim, advancing).await? {
            return Ok(claimed);
        }
    }
    Err(sqlx::Error::RowNotFound)
}

async fn try_claim<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    advancing: Option<&'static str>,
) -> Result<Option<(Claimed, Option<bool>)>, sqlx::Error> {
    let found = match claim_or_seen(tx, claim, advancing).await? {
        Inserted::New { moved } => return Ok(Some((Claimed::New, moved))),
        Inserted::NotVisible => return Ok(None),
        Inserted::There(found) => found,
    };
    Ok(there(tx, claim, found)
        .await?
        .map(|claimed| (claimed, None)))
}

/// What a claim whose row is there (`found`) comes to: seen, or a retry that is due taken for
/// its next attempt; `None` if the row went away meanwhile.
async fn there<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    found: Seen,
) -> Result<Option<Claimed>, sqlx::Error> {
    if !found.retry_due_for(claim) {
        return Ok(Some(Claimed::Seen(found)));
    }
    let [consumer, handler, message_id] = key_params(&claim.key());
    let write = [
        consumer,
        handler,
        message_id,
        Param::Bytes(claim.payload_hash),
        Param::Int(claim.now_ms),
    ];
    match failed_attempts(tx, DB::SQL.messages.retry_claim, &write, &claim.key()).await? {
        Some(failed) => Ok(Some(Claimed::Retry {
            attempt: failed + 1,
        })),
        None => Ok(seen(tx, &claim.key()).await?.map(Claimed::Seen)),
    }
}

/// What inserting a claim's dedup row found.
enum Inserted {
    /// The row is new; `moved` says whether its stream moved, where the statement advanced it.
    New { moved: Option<bool> },
    /// A row was there already.
    There(Seen),
    /// A row is there that this statement could not see (committed after it began).
    NotVisible,
}

/// Inserts the claim's row (with `advancing`, advancing its stream too), or reads the row
/// already there.
async fn claim_or_seen<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    advancing: Option<&'static str>,
) -> Result<Inserted, sqlx::Error> {
    let sql = DB::SQL.messages;
    let params = claim_params(claim);
    if let Some(statement) = advancing.or(sql.claim_or_seen) {
        let row = sql::fetch_optional::<DB, Inserted>(sql::conn(tx), statement, &params).await?;
        return Ok(row.unwrap_or(Inserted::NotVisible));
    }
    if insert_unless_there::<DB>(sql::conn(tx), sql.claim, &params).await? {
        return Ok(Inserted::New { moved: None });
    }
    let found = seen(tx, &claim.key()).await?;
    Ok(found.map_or(Inserted::NotVisible, Inserted::There))
}

/// A row of [`MessageSql::claim_or_seen`](super::MessageSql::claim_or_seen): the row already
/// there, or, with a status of `NULL`, the one it inserted (and how many streams moved, where it
/// advanced them).
impl FromColumns for Inserted {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        match row.maybe_text(1)? {
            None => Ok(Inserted::New {
                moved: row.maybe_int(3)?.map(|moved| moved > 0),
            }),
            Some(_) => Seen::from_columns(row).map(Inserted::There),
        }
    }
}

/// The dedup row of `key`, if there is one.
pub async fn seen<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
) -> Result<Option<Seen>, sqlx::Error> {
    sql::fetch_optional::<DB, Seen>(sql::conn(tx), DB::SQL.messages.seen, &key_params(key)).await
}

/// Records a failed attempt of a claimed (or released) message, after its transaction rolled
/// back: the row becomes (or stays) `failed` with the payload, and its attempt count goes up.
/// Returns the number of failed attempts, or `None` if the row holds another state (handled
/// meanwhile) or another content (see [`seen`]).
pub async fn record_failure<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    failure: &Failure<'_>,
) -> Result<Option<u32>, sqlx::Error> {
    let sql = DB::SQL.messages;
    let error = storable_text(failure.error);
    let identity = claim_params(claim);
    let recorded = [
        Param::Bytes(failure.payload),
        Param::Text(failure.headers),
        Param::Text(&error),
        Param::Text(&error),
        Param::Int(claim.now_ms),
    ];
    let first: Vec<Param<'_>> = identity.iter().chain(&recorded).copied().collect();
    if insert_unless_there::<DB>(sql::conn(tx), sql.insert_failure, &first).await? {
        return Ok(Some(1));
    }
    let [consumer, handler, message_id, _, _, _, hash] = identity;
    let again = [
        Param::Text(&error),
        Param::Text(&error),
        Param::Bytes(failure.payload),
        Param::Text(failure.headers),
        Param::Int(claim.now_ms),
        consumer,
        handler,
        message_id,
        hash,
    ];
    failed_attempts(tx, sql.update_failure, &again, &claim.key()).await
}

/// Runs a write on a dedup row that leaves its `attempt_count` to read: the failed attempts it
/// counts, or `None` if the write touched no row.
async fn failed_attempts<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    statement: Returning,
    write: &[Param<'_>],
    key: &MessageKey<'_>,
) -> Result<Option<u32>, sqlx::Error> {
    let failed: Option<i32> =
        returning::<DB, _>(sql::conn(tx), statement, write, &key_params(key)).await?;
    Ok(failed.map(|failed| u32::try_from(failed).unwrap_or(0)))
}

/// Sets when a `failed` message's next attempt is due, in Unix epoch milliseconds.
pub async fn schedule_retry<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
    retry_at_ms: i64,
) -> Result<(), sqlx::Error> {
    let [consumer, handler, message_id] = key_params(key);
    let params = [Param::Int(retry_at_ms), consumer, handler, message_id];
    sql::execute::<DB>(sql::conn(tx), DB::SQL.messages.schedule_retry, &params).await?;
    Ok(())
}

/// Puts off the retry of `failed` message `key`, which failed again with nothing recorded (its
/// connection lost, say): due again after as long as it has been since its failure was
/// recorded, at least `min_ms` and at most `max_ms`. So the delay doubles with each such try,
/// where the store would otherwise try it at every sweep.
pub async fn postpone_retry<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
    now_ms: i64,
    (min_ms, max_ms): (i64, i64),
) -> Result<(), sqlx::Error> {
    let [consumer, handler, message_id] = key_params(key);
    let params = [
        Param::Int(now_ms),
        Param::Int(max_ms),
        Param::Int(min_ms),
        consumer,
        handler,
        message_id,
    ];
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, DB::SQL.messages.postpone_retry, &params).await?;
    Ok(())
}

/// Fails if the transaction can no longer commit: PostgreSQL aborts a transaction at its first
/// failed statement, and then turns `COMMIT` into a silent rollback; MySQL rolls a whole
/// transaction back for a deadlock it chose it for, and the statements after it commit on their own. Costs
/// nothing where a failed statement aborts only itself.
pub async fn check_open<DB: Backend>(tx: &mut Transaction<'_, DB>) -> Result<(), sqlx::Error> {
    match DB::SQL.messages.check_open {
        None => Ok(()),
        Some(OpenProbe::FailsOnceAborted(check)) => sql::execute::<DB>(sql::conn(tx), check, &[])
            .await
            .map(drop),
        Some(OpenProbe::RefusedWhileOpen(check)) => {
            match sql::execute::<DB>(sql::conn(tx), check, &[]).await {
                Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("25001") => {
                    Ok(())
                }
                Err(error) => Err(error),
                Ok(_) => Err(sqlx::Error::AnyDriverError(Box::new(RolledBack))),
            }
        }
    }
}

/// Why [`commit_checked`] did not commit.
#[derive(Debug)]
pub enum NotCommitted {
    /// The transaction could no longer commit ([`check_open`] failed): it is rolled back.
    Aborted(sqlx::Error),
    /// The commit failed, or its connection.
    Failed(sqlx::Error),
}

/// Commits `tx` once it made sure it can still commit ([`check_open`]), in one round trip where
/// the database can ([`MessageSql::check_and_commit`](super::MessageSql::check_and_commit)): the
/// check, the `COMMIT` and a `BEGIN` of an empty transaction go as one simple query, the
/// `Transaction` then dropped, its rollback of the empty transaction sent with the connection's
/// next statement (or by [`Connect::settle`](crate::Connect::settle) before its worker waits).
/// Elsewhere, the check and the commit one after the other.
pub async fn commit_checked<DB: Backend>(mut tx: Transaction<'_, DB>) -> Result<(), NotCommitted> {
    let Some(check_and_commit) = DB::SQL.messages.check_and_commit else {
        check_open(&mut tx).await.map_err(NotCommitted::Aborted)?;
        return tx.commit().await.map_err(NotCommitted::Failed);
    };
    match sql::execute_raw::<DB>(sql::conn(&mut tx), check_and_commit).await {
        Ok(()) => Ok(()),
        // `25P02`: the check refused, for a transaction aborted before it (the rest not run).
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("25P02") => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(%rollback, "rollback of an aborted transaction failed");
            }
            Err(NotCommitted::Aborted(sqlx::Error::Database(error)))
        }
        Err(error) => Err(NotCommitted::Failed(error)),
    }
}

/// Whether the server may end a whole transaction under a handler, after which each statement
/// commits on its own (MySQL): then a batch checks after each handler too, not only before it
/// commits, so that no handler after the one that went on runs on without a transaction.
pub fn ends_whole<DB: Backend>() -> bool {
    matches!(
        DB::SQL.messages.check_open,
        Some(OpenProbe::RefusedWhileOpen(_))
    )
}

/// What [`check_open`] finds of a transaction the server rolled back under the guard (MySQL,
/// for a deadlock it chose the transaction for): nothing the transaction wrote is there, and a
/// batch's messages go one by one ([`refused_for_its_transaction`]).
#[derive(Debug, thiserror::Error)]
#[error("the server rolled the transaction back (a deadlock, say): no transaction is active")]
pub struct RolledBack;

/// Whether `error`, or an error it was caused by, is a statement refused for the transaction it
/// ran in rather than for itself: because an earlier statement had already aborted it
/// (PostgreSQL's SQLSTATE `25P02`: the failure of whoever went on from that earlier statement),
/// or because it was chosen to end a deadlock or a serialization conflict (`40P01`, `40001`,
/// MySQL's deadlock included), which a transaction holding many messages' locks invites; or
/// because the server had already rolled it back ([`RolledBack`]).
pub fn refused_for_its_transaction(error: &(dyn std::error::Error + 'static)) -> bool {
    let rolled_back = std::iter::successors(Some(error), |error| error.source())
        .any(|error| error.is::<RolledBack>());
    rolled_back
        || crate::error::database_causes(error)
            .any(|cause| matches!(cause.code().as_deref(), Some("25P02" | "40P01" | "40001")))
}

/// Marks a `failed` (or `parked`) message dead, keeping its payload for an operator; `reason`, if
/// given, replaces its last error and says it is [`DeadReason::Undecodable`], else it
/// [`DeadReason::GaveUp`].
pub async fn bury<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    let reason = reason.map(storable_text);
    let dead_reason = match reason {
        Some(_) => DeadReason::Undecodable,
        None => DeadReason::GaveUp,
    };
    let [consumer, handler, message_id] = key_params(key);
    let params = [
        Param::MaybeText(reason.as_deref()),
        Param::Text(dead_reason.as_str()),
        consumer,
        handler,
        message_id,
    ];
    sql::execute::<DB>(sql::conn(tx), DB::SQL.messages.bury, &params).await?;
    Ok(())
}

/// Sets the status of a dedup row (`processed`, `stale`), dropping any kept payload.
pub async fn settle<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
    status: MessageStatus,
) -> Result<(), sqlx::Error> {
    let [consumer, handler, message_id] = key_params(key);
    let params = [Param::Text(status.as_str()), consumer, handler, message_id];
    sql::execute::<DB>(sql::conn(tx), DB::SQL.messages.settle, &params).await?;
    Ok(())
}

/// The status, payload and headers of a dedup row.
pub async fn stored<DB: Backend>(
    pool: &Pool<DB>,
    key: &MessageKey<'_>,
) -> Result<Option<StoredPayload>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::fetch_optional::<DB, StoredPayload>(&mut conn, DB::SQL.messages.stored, &key_params(key))
        .await
}

/// Records what an operator did about a `dead` or `failed` message: a replay makes it `failed`
/// with no attempts, due at once; a discard makes it `discarded`. Who and why are kept with the
/// message, and its payload too. Returns `false` if it was neither dead nor failed.
pub async fn resolve<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
    resolution: &Resolution<'_>,
) -> Result<bool, sqlx::Error> {
    let sql = DB::SQL.messages;
    let statement = if resolution.replay {
        sql.replay
    } else {
        sql.discard
    };
    let (by, reason) = (
        storable_text(resolution.by),
        storable_text(resolution.reason),
    );
    let [consumer, handler, message_id] = key_params(key);
    let params = [
        Param::Text(&by),
        Param::Text(&reason),
        consumer,
        handler,
        message_id,
    ];
    Ok(sql::execute::<DB>(sql::conn(tx), statement, &params).await? == 1)
}

/// Keeps, in `tx`, a delivery of `claim` whose content differs from the message stored under
/// its id (whose hash is `stored_hash`): with its payload and headers, for an operator. A content
/// kept already counts one more delivery.
pub async fn keep_conflict<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    claim: &Claim<'_>,
    stored_hash: &[u8],
    payload: &[u8],
    headers: &str,
) -> Result<(), sqlx::Error> {
    let [consumer, handler, message_id] = key_params(&claim.key());
    let params = [
        consumer,
        handler,
        message_id,
        Param::Text(claim.message_type),
        Param::Bytes(claim.payload_hash),
        Param::Bytes(stored_hash),
        Param::Bytes(payload),
        Param::Text(headers),
    ];
    let statement = super::operators::record_sql::<DB>().keep_conflict;
    sql::execute::<DB>(sql::conn(tx), statement, &params).await?;
    Ok(())
}

/// Keeps a delivery that could not be handled at all, with its exact bytes and the reason;
/// returns its number.
pub async fn reject<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    envelope: &Envelope,
    reason: &str,
) -> Result<i64, sqlx::Error> {
    let headers = crate::keys::headers_to_json(envelope.headers());
    let (message_type, id, reason) = (
        storable_text(envelope.message_type()),
        storable_text(envelope.id()),
        storable_text(reason),
    );
    let params = [
        Param::Text(consumer),
        Param::Text(&message_type),
        Param::Text(&id),
        Param::Bytes(envelope.payload()),
        Param::Text(&headers),
        Param::Text(&reason),
    ];
    let mut conn = pool.acquire().await?;
    let id = returning::<DB, i64>(&mut conn, DB::SQL.messages.reject, &params, &[]).await?;
    id.ok_or(sqlx::Error::RowNotFound)
}
