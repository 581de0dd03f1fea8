//! Many dedup rows and streams in one statement each, for a batch: the claims of all its
//! messages, the rows some of them found there already, and the advance of their streams. The
//! rows go to the database as one JSON document (`jsonb_to_recordset` on PostgreSQL,
//! `jsonb_each` on SQLite, `JSON_TABLE` on MySQL), so each statement is one fixed text, prepared
//! once, whatever the batch's size.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sqlx::Transaction;

use super::messages::Seen;
use super::sql::{self, Columns, FromColumns, Param};
use super::{Backend, BulkAdvance, BulkClaim};
use crate::keys::Claim;

/// A dedup row's key within one consumer: (handler, message id).
pub type RowKey = (String, String);

/// A stream's key within one consumer: (handler, aggregate).
pub type StreamKey = (String, String);

/// One dedup row of a bulk claim, as the statement reads it from the document.
#[derive(Serialize)]
struct ClaimRow<'a> {
    handler: &'a str,
    message_id: &'a str,
    message_type: &'a str,
    // Left out when there is none: a missing field reads as `NULL` on every database.
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence_number: Option<i64>,
    /// The payload hash in hexadecimal: JSON has no bytes.
    payload_hash: String,
}

impl<'a> ClaimRow<'a> {
    /// The row's key, borrowed: (handler, message id).
    fn id(&self) -> (&'a str, &'a str) {
        (self.handler, self.message_id)
    }

    fn key(&self) -> RowKey {
        (self.handler.to_owned(), self.message_id.to_owned())
    }
}

/// One stream of a bulk advance.
#[derive(Serialize)]
struct StreamRow<'a> {
    handler: &'a str,
    aggregate_id: &'a str,
    sequence_number: i64,
}

impl StreamRow<'_> {
    fn key(&self) -> StreamKey {
        (self.handler.to_owned(), self.aggregate_id.to_owned())
    }
}

/// A dedup row's key, as a bulk statement reads it from the document.
#[derive(Serialize)]
struct MessageRow<'a> {
    handler: &'a str,
    message_id: &'a str,
}

/// A stream's key, as a bulk statement reads it from the document.
#[derive(Serialize)]
struct StreamKeyRow<'a> {
    handler: &'a str,
    aggregate_id: &'a str,
}

/// A stream's last applied sequence, read back with its key.
struct LastSequence(StreamKey, i64);

impl FromColumns for LastSequence {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(LastSequence((row.text(0)?, row.text(1)?), row.int(2)?))
    }
}

/// A key read back from a bulk statement.
struct Keyed(String, String);

impl FromColumns for Keyed {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok(Keyed(row.text(0)?, row.text(1)?))
    }
}

/// A dedup row found by [`seen`]: its columns as [`Seen`] reads them, then its key.
struct SeenRow(RowKey, Seen);

impl FromColumns for SeenRow {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        let seen = Seen::from_columns(row)?;
        Ok(SeenRow((row.text(3)?, row.text(4)?), seen))
    }
}

/// What a bulk claim found: the keys of the rows it inserted, and the rows that were there.
#[derive(Debug, Default)]
pub struct Claims {
    /// The rows inserted, by key.
    pub inserted: HashSet<RowKey>,
    /// The rows that were there, by key.
    pub seen: HashMap<RowKey, Seen>,
}

/// Inserts a `processed` dedup row for every claim of `consumer` that has none yet (each key
/// once); says which it inserted and reads the rows of the others.
pub async fn claim<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    consumer: &str,
    claims: &[Claim<'_>],
) -> Result<Claims, sqlx::Error> {
    if claims.is_empty() {
        return Ok(Claims::default());
    }
    let rows: Vec<ClaimRow<'_>> = claims
        .iter()
        .map(|claim| ClaimRow {
            handler: claim.handler,
            message_id: claim.message_id,
            message_type: claim.message_type,
            aggregate_id: claim.aggregate,
            sequence_number: claim.sequence,
            payload_hash: hex::encode(claim.payload_hash),
        })
        .collect();
    match DB::SQL.batch.claim {
        BulkClaim::Returning(insert) => insert_returning(tx, insert, consumer, &rows).await,
        BulkClaim::ReadThenInsert(insert) => read_then_insert(tx, insert, consumer, &rows).await,
    }
}

/// A bulk claim that says which rows it inserted: the rows of the others are read after it.
async fn insert_returning<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    insert: &'static str,
    consumer: &str,
    rows: &[ClaimRow<'_>],
) -> Result<Claims, sqlx::Error> {
    let inserted = keys::<DB>(tx, insert, consumer, rows).await?;
    let there: Vec<(&str, &str)> = rows
        .iter()
        .filter(|row| !inserted.contains(&row.key()))
        .map(ClaimRow::id)
        .collect();
    let seen = seen(tx, consumer, &there).await?;
    Ok(Claims { inserted, seen })
}

/// A bulk claim that cannot say which rows it inserted: the rows there are read first, and a
/// plain insert of the others fails on one written in between.
async fn read_then_insert<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    insert: &'static str,
    consumer: &str,
    rows: &[ClaimRow<'_>],
) -> Result<Claims, sqlx::Error> {
    let all: Vec<(&str, &str)> = rows.iter().map(ClaimRow::id).collect();
    let seen = seen(tx, consumer, &all).await?;
    let new: Vec<&ClaimRow<'_>> = rows
        .iter()
        .filter(|row| !seen.contains_key(&row.key()))
        .collect();
    if !new.is_empty() {
        execute::<DB>(tx, insert, consumer, &new).await?;
    }
    let inserted = new.into_iter().map(ClaimRow::key).collect();
    Ok(Claims { inserted, seen })
}

/// The dedup rows of `consumer` already there for `keys`, by key.
pub async fn seen<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    consumer: &str,
    keys: &[(&str, &str)],
) -> Result<HashMap<RowKey, Seen>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = message_rows(keys);
    let sql = DB::SQL.batch.seen;
    let found: Vec<SeenRow> = fetch_rows::<DB, _>(tx, sql, consumer, &rows).await?;
    Ok(found
        .into_iter()
        .map(|SeenRow(key, seen)| (key, seen))
        .collect())
}

/// Locks each of `consumer`'s streams (creating those missing) and moves it to its sequence if
/// that is newer than its last applied one, like [`super::streams::advance`] for each; returns
/// the streams it moved (a stream that is not among them had its message stale). Each stream
/// may appear once. Fails with [`sqlx::Error::RowNotFound`] if a stream it locked is not there
/// to read or to move.
pub async fn advance<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    consumer: &str,
    streams: &[(&str, &str, i64)],
) -> Result<HashSet<StreamKey>, sqlx::Error> {
    let rows: Vec<StreamRow<'_>> = streams
        .iter()
        .map(|&(handler, aggregate_id, sequence_number)| StreamRow {
            handler,
            aggregate_id,
            sequence_number,
        })
        .collect();
    match DB::SQL.batch.advance {
        BulkAdvance::Returning(upsert) => keys::<DB>(tx, upsert, consumer, &rows).await,
        BulkAdvance::LockThenSet { lock, set } => {
            lock_then_set(tx, (lock, set), consumer, &rows).await
        }
    }
}

/// A bulk advance on a database whose upsert cannot say which rows it moved: every stream
/// locked (created at 0 where missing), read, and those behind their row's sequence moved.
async fn lock_then_set<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    (lock, set): (&'static str, &'static str),
    consumer: &str,
    rows: &[StreamRow<'_>],
) -> Result<HashSet<StreamKey>, sqlx::Error> {
    execute::<DB>(tx, lock, consumer, rows).await?;
    let read = DB::SQL.batch.last_sequences;
    let lasts: Vec<LastSequence> = fetch_rows::<DB, _>(tx, read, consumer, rows).await?;
    if lasts.len() != rows.len() {
        return Err(sqlx::Error::RowNotFound);
    }
    let lasts: HashMap<StreamKey, i64> = lasts
        .into_iter()
        .map(|LastSequence(stream, last)| (stream, last))
        .collect();
    let behind: Vec<&StreamRow<'_>> = rows
        .iter()
        .filter(|row| {
            lasts
                .get(&row.key())
                .is_some_and(|&last| row.sequence_number > last)
        })
        .collect();
    if !behind.is_empty() && execute::<DB>(tx, set, consumer, &behind).await? != behind.len() as u64
    {
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(behind.into_iter().map(StreamRow::key).collect())
}

/// The last applied sequence of each of `consumer`'s `streams` (handler, aggregate) that has a
/// row, by stream.
pub async fn last_sequences<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    consumer: &str,
    streams: &[(&str, &str)],
) -> Result<HashMap<StreamKey, i64>, sqlx::Error> {
    let rows: Vec<StreamKeyRow<'_>> = streams
        .iter()
        .map(|&(handler, aggregate_id)| StreamKeyRow {
            handler,
            aggregate_id,
        })
        .collect();
    let sql = DB::SQL.batch.last_sequences;
    let found: Vec<LastSequence> = fetch_rows::<DB, _>(tx, sql, consumer, &rows).await?;
    Ok(found
        .into_iter()
        .map(|LastSequence(stream, last)| (stream, last))
        .collect())
}

/// Sets `stale` the dedup rows of `consumer` for `keys` (handler, message id, each once), like
/// [`super::messages::settle`] for each; fails with [`sqlx::Error::RowNotFound`] unless it found
/// every row.
pub async fn settle_stale<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    consumer: &str,
    keys: &[(&str, &str)],
) -> Result<(), sqlx::Error> {
    let rows = message_rows(keys);
    let settled = execute::<DB>(tx, DB::SQL.batch.settle_stale, consumer, &rows).await?;
    match settled == keys.len() as u64 {
        true => Ok(()),
        false => Err(sqlx::Error::RowNotFound),
    }
}

/// The rows of a document of dedup row keys (handler, message id).
fn message_rows<'a>(keys: &[(&'a str, &'a str)]) -> Vec<MessageRow<'a>> {
    keys.iter()
        .map(|&(handler, message_id)| MessageRow {
            handler,
            message_id,
        })
        .collect()
}

/// Runs a bulk write over `rows` that returns the keys it wrote.
async fn keys<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    sql: &'static str,
    consumer: &str,
    rows: &[impl Serialize],
) -> Result<HashSet<(String, String)>, sqlx::Error> {
    let written: Vec<Keyed> = fetch_rows::<DB, _>(tx, sql, consumer, rows).await?;
    Ok(written.into_iter().map(|Keyed(a, b)| (a, b)).collect())
}

/// Runs a bulk statement for `consumer` over `rows`, sent as one JSON document; returns what it
/// gives back.
async fn fetch_rows<DB: Backend, T: FromColumns>(
    tx: &mut Transaction<'_, DB>,
    sql: &'static str,
    consumer: &str,
    rows: &[impl Serialize],
) -> Result<Vec<T>, sqlx::Error> {
    let document = document(rows)?;
    let params = [Param::Text(consumer), Param::Text(&document)];
    sql::fetch_all::<DB, T>(sql::conn(tx), sql, &params).await
}

/// Runs a bulk write for `consumer` over `rows`, sent as one JSON document; returns the rows it
/// wrote (on MySQL, those it found).
async fn execute<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    sql: &'static str,
    consumer: &str,
    rows: &[impl Serialize],
) -> Result<u64, sqlx::Error> {
    let document = document(rows)?;
    let params = [Param::Text(consumer), Param::Text(&document)];
    sql::execute::<DB>(sql::conn(tx), sql, &params).await
}

/// `rows` as the one JSON document a bulk statement takes.
fn document(rows: &[impl Serialize]) -> Result<String, sqlx::Error> {
    serde_json::to_string(rows).map_err(|error| sqlx::Error::Encode(Box::new(error)))
}
