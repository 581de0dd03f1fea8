//! Stream rows and strict ordering: the per-aggregate lock and sequence, parked messages, their
//! release, and gaps that time out or that an operator skips.

use sqlx::{Pool, Transaction};

use super::sql::{self, Columns, FromColumns, Param};
use super::{Backend, key_params, returning, stream_params};
use crate::keys::{MessageKey, Stream};

/// A message parked by strict ordering, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedMessage {
    /// The dedup key.
    pub message_id: String,
    /// Its place in the aggregate's stream.
    pub sequence_number: i64,
    /// The payload as delivered.
    pub payload: Vec<u8>,
    /// The delivery's headers, as a JSON object.
    pub headers: Option<String>,
}

impl FromColumns for ParkedMessage {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(ParkedMessage {
            message_id: row.text(0)?,
            sequence_number: row.int(1)?,
            payload: row.maybe_bytes(2)?.unwrap_or_default(),
            headers: row.maybe_text(3)?,
        })
    }
}

/// `stream`'s key, then one more value.
fn and<'a>(stream: &Stream<'a>, last: Param<'a>) -> [Param<'a>; 4] {
    let [consumer, handler, aggregate] = stream_params(stream);
    [consumer, handler, aggregate, last]
}

/// Locks the stream row, creating it if missing, and moves it to `sequence` if that is newer
/// than the last applied one. Returns `false` when it is not newer (stale).
///
/// Creation is an upsert on the primary key, so two first messages of a new aggregate serialize
/// on the key instead of both seeing "no row".
pub async fn advance<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    sequence: i64,
) -> Result<bool, sqlx::Error> {
    let Some(advance) = DB::SQL.streams.advance else {
        // A new stream is created just before this message, so that its first one applies
        // whatever its sequence (0 included).
        let last = lock_created_at(tx, stream, sequence.saturating_sub(1)).await?;
        if sequence <= last {
            return Ok(false);
        }
        set(tx, stream, sequence).await?;
        return Ok(true);
    };
    let params = and(stream, Param::Int(sequence));
    Ok(sql::execute::<DB>(sql::conn(tx), advance, &params).await? == 1)
}

/// Locks the stream row (creating it at 0, where strict ordering has applied nothing, if
/// missing, race-free like [`advance`]) and returns the last applied sequence.
pub async fn lock<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
) -> Result<i64, sqlx::Error> {
    lock_created_at(tx, stream, 0).await
}

/// Locks the stream row, creating it at `created` if missing, and returns the last applied
/// sequence.
async fn lock_created_at<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    created: i64,
) -> Result<i64, sqlx::Error> {
    let write = and(stream, Param::Int(created));
    let read = stream_params(stream);
    returning::<DB, i64>(sql::conn(tx), DB::SQL.streams.lock, &write, &read)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// Moves a locked stream row to `sequence`.
pub async fn set<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    sequence: i64,
) -> Result<(), sqlx::Error> {
    let [consumer, handler, aggregate] = stream_params(stream);
    let params = [Param::Int(sequence), consumer, handler, aggregate];
    sql::execute::<DB>(sql::conn(tx), DB::SQL.streams.set, &params).await?;
    Ok(())
}

/// Marks a claimed message parked, keeping its payload and headers.
pub async fn park<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    key: &MessageKey<'_>,
    payload: &[u8],
    headers: &str,
) -> Result<(), sqlx::Error> {
    let [consumer, handler, message_id] = key_params(key);
    let params = [
        Param::Bytes(payload),
        Param::Text(headers),
        consumer,
        handler,
        message_id,
    ];
    sql::execute::<DB>(sql::conn(tx), DB::SQL.streams.park, &params).await?;
    Ok(())
}

/// The parked message of the stream with the lowest sequence, if that sequence is at most
/// `up_to`.
pub async fn next_parked<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    up_to: i64,
) -> Result<Option<ParkedMessage>, sqlx::Error> {
    let params = and(stream, Param::Int(up_to));
    sql::fetch_optional::<DB, ParkedMessage>(sql::conn(tx), DB::SQL.streams.next_parked, &params)
        .await
}

/// Whether the stream has parked messages (a read that takes no lock).
pub async fn has_parked<DB: Backend>(
    pool: &Pool<DB>,
    stream: &Stream<'_>,
) -> Result<bool, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let parked: i64 = sql::fetch_one::<DB, i64>(
        &mut conn,
        DB::SQL.streams.has_parked,
        &stream_params(stream),
    )
    .await?;
    Ok(parked > 0)
}

/// The aggregates of `handler` whose lowest parked message can be released now.
pub async fn releasable<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [Param::Text(consumer), Param::Text(handler)];
    sql::fetch_all::<DB, String>(&mut conn, DB::SQL.streams.releasable, &params).await
}

/// `(lowest parked sequence, parked messages)` of a stream.
async fn parked_range<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
) -> Result<(Option<i64>, i64), sqlx::Error> {
    let params = stream_params(stream);
    sql::fetch_one::<DB, _>(sql::conn(tx), DB::SQL.streams.parked_range, &params).await
}

/// For an operator skipping a gap that will not fill, on a locked stream at `last`: brings the
/// messages that a gap timeout marked dead back to parked, and moves the stream to just before
/// its lowest parked message if that is ahead of `last + 1`, but never past a message of the
/// gap that is `failed`, waiting for its retry (it is not missing: skipping it would make its
/// retry stale). Never moves the stream backwards.
pub async fn skip_gap<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    last: i64,
) -> Result<(), sqlx::Error> {
    let params = stream_params(stream);
    sql::execute::<DB>(sql::conn(tx), DB::SQL.streams.revive_gap_dead, &params).await?;
    let Some(first_parked) = parked_range(tx, stream).await?.0 else {
        return Ok(());
    };
    let params = and(stream, Param::Int(last));
    let statement = DB::SQL.streams.first_retrying;
    let retrying: Option<i64> = sql::fetch_one::<DB, _>(sql::conn(tx), statement, &params).await?;
    let skip_to = retrying.map_or(first_parked, |retrying| retrying.min(first_parked)) - 1;
    match skip_to > last {
        true => set(tx, stream, skip_to).await,
        false => Ok(()),
    }
}

/// The aggregates of `handler` whose oldest parked message has waited longer than
/// `timeout_secs` behind a real gap: its lowest parked sequence is not the next one, and the
/// next one is absent (not `failed`, waiting for its retry). A read without locks:
/// [`bury_gap`] checks again under the stream lock.
pub async fn overdue_gaps<DB: Backend>(
    pool: &Pool<DB>,
    consumer: &str,
    handler: &str,
    timeout_secs: f64,
) -> Result<Vec<String>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let params = [
        Param::Text(consumer),
        Param::Text(handler),
        Param::Real(timeout_secs),
    ];
    sql::fetch_all::<DB, String>(&mut conn, DB::SQL.streams.overdue_gaps, &params).await
}

/// On a locked stream at `last`: if its lowest parked message is still behind a gap (and the
/// missing message is not `failed`, waiting for its retry), and a parked message has waited
/// longer than `timeout_secs` (a gap that filled meanwhile, followed by a new one, is fresh),
/// marks all its parked messages dead with the reason "gap timeout at sequence n" (n =
/// `last + 1`, the missing one). Returns `(n, messages)`, or `None` if the gap has filled or is
/// not overdue.
pub async fn bury_gap<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    stream: &Stream<'_>,
    last: i64,
    timeout_secs: f64,
) -> Result<Option<(i64, i64)>, sqlx::Error> {
    let (first, parked) = parked_range(tx, stream).await?;
    let missing = last.saturating_add(1);
    if first.is_none_or(|first| first <= missing) {
        return Ok(None);
    }
    let sql = DB::SQL.streams;
    let overdue = and(stream, Param::Real(timeout_secs));
    let overdue: i64 =
        sql::fetch_one::<DB, i64>(sql::conn(tx), sql.parked_overdue, &overdue).await?;
    if overdue == 0 {
        return Ok(None);
    }
    let params = and(stream, Param::Int(missing));
    let retrying: i64 =
        sql::fetch_one::<DB, i64>(sql::conn(tx), sql.retrying_sequence, &params).await?;
    if retrying > 0 {
        return Ok(None);
    }
    let reason = format!("gap timeout at sequence {missing}");
    let [consumer, handler, aggregate] = stream_params(stream);
    let params = [Param::Text(&reason), consumer, handler, aggregate];
    sql::execute::<DB>(sql::conn(tx), sql.bury_parked, &params).await?;
    Ok(Some((missing, parked)))
}
