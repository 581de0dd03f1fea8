//! Batched mode on real databases: the messages of a batch commit together, and one message's
//! failure neither commits nor loses the others' work, nor applies its own; its handler runs once
//! for the attempt. Duplicates in a batch cost no handler call. (Every behaviour suite also runs
//! batched: see `on_every_backend!(suite, batched)`.)

mod common;

macro_rules! batch_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::collections::BTreeMap;
        use std::sync::Mutex;

        use inbox::prelude::*;
        use inbox::{Batch, MemoryBroker, RunReport};

        type Pool = sqlx::Pool<$db>;

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "batch.step")]
        struct Step {
            id: String,
            account: String,
        }

        /// How many times the handler ran for each id, committed or not.
        static CALLS: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

        /// Writes its row, then fails for good on an id starting with `bad`: a failure after a write.
        #[inbox_handler(key = "id", aggregate = "account", name = "step")]
        async fn step(tx: &mut $conn, msg: Step) -> Result<(), HandlerError> {
            *CALLS.lock().unwrap().entry(msg.id.clone()).or_default() += 1;
            sqlx::query($crate::common::sql::<$db>(
                "INSERT INTO written (id) VALUES ($1)",
            ))
            .bind(&msg.id)
            .execute(&mut *tx)
            .await?;
            if msg.id.starts_with("bad") {
                return Err(HandlerError::permanent(HandlerError::msg("bad is refused")));
            }
            Ok(())
        }

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "batch.counted")]
        struct Counted {
            id: String,
            account: String,
            sequence: i64,
        }

        /// Counts its calls, like `step`, in sequence order per account.
        #[inbox_handler(
            key = "id",
            sequence = "sequence",
            aggregate = "account",
            name = "counted"
        )]
        async fn counted(tx: &mut $conn, msg: Counted) -> Result<(), HandlerError> {
            let _ = tx;
            *CALLS.lock().unwrap().entry(msg.id.clone()).or_default() += 1;
            Ok(())
        }

        fn counted_delivery(n: usize, (id, account, sequence): (&str, &str, i64)) -> Envelope {
            let message = Counted {
                id: id.into(),
                account: account.into(),
                sequence,
            };
            Envelope::encode(format!("counted-{n}"), &message).unwrap()
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            let ddl = "CREATE TABLE written (id VARCHAR(64) NOT NULL)";
            sqlx::query(ddl).execute(&pool).await.unwrap();
            Some(pool)
        }

        async fn written(pool: &Pool) -> Vec<String> {
            let sql = "SELECT id FROM written ORDER BY id";
            sqlx::query_scalar(sql).fetch_all(pool).await.unwrap()
        }

        #[tokio::test]
        async fn a_failure_in_a_batch_rolls_back_only_itself_and_runs_once() {
            let Some(pool) = database("batch_failure").await else {
                return;
            };
            let inbox = Inbox::builder(pool.clone())
                .workers(1)
                .batch(Batch::new(8))
                .handler(step)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            let ids = ["a", "b", "c", "bad", "d", "e", "a", "f"];
            for (n, id) in ids.iter().enumerate() {
                let message = Step {
                    id: (*id).into(),
                    account: format!("acct-{id}"),
                };
                broker.publish(Envelope::encode(format!("delivery-{n}"), &message).unwrap());
            }
            broker.close();

            let report = inbox.run(broker.source()).await.unwrap();

            assert_eq!(
                written(&pool).await,
                ["a", "b", "c", "d", "e", "f"],
                "each good one once, nothing of bad"
            );
            let calls = CALLS.lock().unwrap().clone();
            let ran = |id: &str| calls.get(id).copied().unwrap_or(0);
            assert_eq!(ran("bad"), 1, "one attempt, one run");
            // One transaction: what ran before bad was rolled back with it and ran again, once.
            assert_eq!((ran("a"), ran("b"), ran("c")), (2, 2, 2), "{calls:?}");
            assert_eq!((ran("d"), ran("e"), ran("f")), (1, 1, 1), "{calls:?}");
            assert_eq!(
                report.handler_calls_with(Outcome::Processed),
                6,
                "{report:?}"
            );
            assert_eq!(
                report.handler_calls_with(Outcome::Duplicate),
                1,
                "the second `a`, without a handler call"
            );
            assert_eq!(report.handler_calls_with(Outcome::Dead), 1, "{report:?}");
            assert_eq!(
                broker.acked(),
                ids.len() as u64,
                "every delivery settled after the commits"
            );
            let dead = inbox.dead().await.unwrap();
            assert_eq!(
                (dead[0].message_id.as_str(), dead[0].attempt_count),
                ("bad", 1)
            );
        }

        /// An inbox of `counted` on `pool` whose one worker lingers for a batch long enough to
        /// take everything a run publishes at once.
        async fn counting_inbox(pool: &Pool) -> Inbox<$db> {
            Inbox::builder(pool.clone())
                .workers(1)
                .batch(Batch::new(16).linger(std::time::Duration::from_millis(300)))
                .handler(counted)
                .build()
                .await
                .unwrap()
        }

        /// Runs `deliveries` of `counted` (numbered from `first`) through `inbox`; each is acked.
        async fn run_counted(
            inbox: &Inbox<$db>,
            first: usize,
            deliveries: &[(&str, &str, i64)],
        ) -> RunReport {
            let broker = MemoryBroker::new();
            for (n, delivery) in deliveries.iter().enumerate() {
                broker.publish(counted_delivery(first + n, *delivery));
            }
            broker.close();
            let report = inbox.run(broker.source()).await.unwrap();
            assert_eq!(broker.acked(), deliveries.len() as u64, "{report:?}");
            report
        }

        /// How many messages were processed, duplicate, stale and conflicting.
        fn kinds(report: &RunReport) -> [u64; 4] {
            [
                Outcome::Processed,
                Outcome::Duplicate,
                Outcome::Stale,
                Outcome::Conflict,
            ]
            .map(|outcome| report.handler_calls_with(outcome))
        }

        /// How many times the handler ran for each of `ids`.
        fn runs_of<const N: usize>(ids: [&str; N]) -> [u32; N] {
            let calls = CALLS.lock().unwrap().clone();
            ids.map(|id| calls.get(id).copied().unwrap_or(0))
        }

        /// The last applied sequence of `account`'s stream for `counted`.
        async fn last_sequence(pool: &Pool, account: &str) -> i64 {
            let sql = $crate::common::sql::<$db>(
                "SELECT last_sequence FROM inbox_streams WHERE handler = 'counted' AND aggregate_id = $1",
            );
            sqlx::query_scalar(sql).bind(account).fetch_one(pool).await.unwrap()
        }

        #[tokio::test]
        async fn a_batch_tells_new_duplicate_stale_and_conflicting_messages_apart_at_once() {
            let Some(pool) = database("batch_kinds").await else {
                return;
            };
            let inbox = counting_inbox(&pool).await;
            let before = [
                ("q-seen", "acct-q", 2),
                ("q-prior", "acct-p", 2),
                ("q-third", "acct-t", 5),
            ];
            run_counted(&inbox, 0, &before).await;

            // One aggregate each, so that the worker lingering for a batch takes all five at once.
            let deliveries = [
                ("q-new", "acct-r", 1),
                ("q-seen", "acct-q", 2),
                ("q-late", "acct-p", 1),
                ("q-third", "acct-t", 6),
                ("q-other", "acct-s", 4),
            ];
            let report = run_counted(&inbox, 3, &deliveries).await;

            assert_eq!(kinds(&report), [2, 1, 1, 1], "{report:?}");
            assert_eq!(
                runs_of(["q-new", "q-seen", "q-late", "q-third", "q-other"]),
                [1, 1, 0, 1, 1],
                "only new messages ran"
            );
        }

        #[tokio::test]
        async fn a_batch_places_several_messages_of_one_stream_as_one_after_the_other() {
            let Some(pool) = database("batch_runs").await else {
                return;
            };
            let inbox = counting_inbox(&pool).await;
            run_counted(&inbox, 0, &[("run-p2", "acct-run-p", 2)]).await;

            // Two streams' messages in one batch: r's in a run with a late one, a copy and a
            // conflicting copy inside; p's first one stale, so the ones after it take their
            // place after where p's stream stands.
            let deliveries = [
                ("run-r1", "acct-run-r", 1),
                ("run-p1", "acct-run-p", 1),
                ("run-r3", "acct-run-r", 3),
                ("run-r2", "acct-run-r", 2),
                ("run-r3", "acct-run-r", 3),
                ("run-r3", "acct-run-r", 30),
                ("run-p3", "acct-run-p", 3),
                ("run-r4", "acct-run-r", 4),
                ("run-p2b", "acct-run-p", 2),
            ];
            let report = run_counted(&inbox, 1, &deliveries).await;

            assert_eq!(kinds(&report), [4, 1, 3, 1], "{report:?}");
            assert_eq!(
                runs_of(["run-r1", "run-r3", "run-r4", "run-p3", "run-r2", "run-p1", "run-p2b"]),
                [1, 1, 1, 1, 0, 0, 0],
                "the newer ones ran once each, the late ones not"
            );
            assert_eq!(
                (
                    last_sequence(&pool, "acct-run-r").await,
                    last_sequence(&pool, "acct-run-p").await
                ),
                (4, 3)
            );
            let sql = $crate::common::sql::<$db>(
                "SELECT message_id FROM inbox_messages WHERE handler = 'counted' \
                 AND status = 'stale' ORDER BY message_id",
            );
            let stale: Vec<String> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
            assert_eq!(stale, ["run-p1", "run-p2b", "run-r2"], "recorded as stale");
        }

        #[tokio::test]
        async fn a_batch_compares_ids_and_aggregates_byte_for_byte() {
            let Some(pool) = database("batch_byte_for_byte").await else {
                return;
            };
            let inbox = counting_inbox(&pool).await;
            run_counted(&inbox, 0, &[("case", "acct-case", 1)]).await;

            let deliveries = [
                ("case ", "acct-case", 2),
                ("CASE", "acct-case", 3),
                ("other", "acct-case ", 1),
                ("other ", "ACCT-CASE", 1),
            ];
            let report = run_counted(&inbox, 1, &deliveries).await;

            assert_eq!(kinds(&report), [4, 0, 0, 0], "{report:?}");
            let streams = [
                last_sequence(&pool, "acct-case").await,
                last_sequence(&pool, "acct-case ").await,
                last_sequence(&pool, "ACCT-CASE").await,
            ];
            assert_eq!(streams, [3, 1, 1]);
        }

        #[tokio::test]
        async fn one_message_per_transaction_runs_every_handler_once() {
            let Some(pool) = database("batch_baseline").await else {
                return;
            };
            let inbox = Inbox::builder(pool.clone())
                .workers(1)
                .handler(step)
                .build()
                .await
                .unwrap();
            let broker = MemoryBroker::new();
            for id in ["g", "bad-alone", "h"] {
                let message = Step {
                    id: id.into(),
                    account: format!("acct-{id}"),
                };
                broker.publish(Envelope::encode(format!("delivery-{id}"), &message).unwrap());
            }
            broker.close();

            inbox.run(broker.source()).await.unwrap();

            let calls = CALLS.lock().unwrap().clone();
            assert_eq!(
                (calls.get("g"), calls.get("h")),
                (Some(&1), Some(&1)),
                "{calls:?}"
            );
            assert_eq!(written(&pool).await, ["g", "h"]);
        }
    };
}

common::on_every_backend!(batch_suite);

/// On PostgreSQL a batch looks up the rows it found already there, settles its stale ones and
/// reads where its streams stand by their keys, an index lookup each, however many rows the
/// consumer has and whatever the planner's statistics say: a batch never scans the consumer's
/// rows.
#[tokio::test]
async fn postgres_batch_reads_the_rows_already_there_by_their_key() {
    use inbox::Backend;

    let Some(pool) = common::postgres("seen_by_key").await else {
        return;
    };
    let rows = [
        "INSERT INTO inbox_messages \
        (consumer, handler, message_id, message_type, status, payload_hash) \
        SELECT 'billing', 'step', 'm-' || n, 'batch.step', 'processed', '\\x00' \
        FROM generate_series(1, 5000) AS n",
        "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
        SELECT 'billing', 'step', 'a-' || n, n FROM generate_series(1, 5000) AS n",
        "ANALYZE inbox_messages",
        "ANALYZE inbox_streams",
    ];
    for sql in rows {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }

    let bulk = sqlx::Postgres::SQL.batch;
    let messages = r#"[{"handler": "step", "message_id": "m-7"}]"#;
    let streams = r#"[{"handler": "step", "aggregate_id": "a-7"}]"#;
    let statements = [
        (bulk.seen, messages, "inbox_messages_pkey"),
        (bulk.settle_stale, messages, "inbox_messages_pkey"),
        (bulk.last_sequences, streams, "inbox_streams_pkey"),
    ];
    for (sql, document, index) in statements {
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .bind("billing")
            .bind(document)
            .fetch_all(&pool)
            .await
            .unwrap();

        let plan = plan.join("\n");
        assert!(
            plan.contains(&format!("Index Scan using {index}")),
            "{plan}"
        );
        assert!(!plan.contains("Hash") && !plan.contains("Bitmap"), "{plan}");
    }
}

/// A batch's bulk statements find their rows by key: the stale ones it settles (all of them, or
/// it says so) and the streams whose last sequence it reads. `bytes` is the database's cast of
/// text to bytes.
async fn bulk_statements_find_their_rows<DB: inbox::Backend>(pool: sqlx::Pool<DB>, bytes: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'r> String: sqlx::Type<DB> + sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    use inbox_core::storage::bulk;

    let row = |consumer: &str, id: &str| {
        format!("('{consumer}', 'step', '{id}', 'batch.step', 'processed', CAST('h' AS {bytes}))")
    };
    let messages = [
        row("billing", "m-1"),
        row("billing", "m-2"),
        row("billing", "m-3"),
        row("other", "m-4"),
    ];
    let rows = [
        format!(
            "INSERT INTO inbox_messages \
            (consumer, handler, message_id, message_type, status, payload_hash) VALUES {}",
            messages.join(", ")
        ),
        "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) VALUES \
        ('billing', 'step', 'a-1', 7), ('other', 'step', 'a-2', 9)"
            .to_owned(),
    ];
    for sql in rows {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut tx = pool.begin().await.unwrap();

    let stale = [("step", "m-1"), ("step", "m-3")];
    bulk::settle_stale(&mut tx, "billing", &stale)
        .await
        .unwrap();
    let elsewhere = bulk::settle_stale(&mut tx, "billing", &[("step", "m-4")]).await;
    let streams = [("step", "a-1"), ("step", "a-2")];
    let lasts = bulk::last_sequences(&mut tx, "billing", &streams)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert!(
        matches!(elsewhere, Err(sqlx::Error::RowNotFound)),
        "another consumer's row: {elsewhere:?}"
    );
    let sql = "SELECT message_id FROM inbox_messages WHERE status = 'stale' ORDER BY message_id";
    let settled: Vec<String> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
    assert_eq!(settled, ["m-1", "m-3"]);
    let expected = [(("step".to_owned(), "a-1".to_owned()), 7)];
    assert_eq!(lasts, expected.into_iter().collect());
}

#[tokio::test]
async fn sqlite_bulk_statements_find_their_rows() {
    let pool = common::sqlite("bulk_rows").await.unwrap();
    bulk_statements_find_their_rows(pool, "blob").await;
}

#[tokio::test]
async fn postgres_bulk_statements_find_their_rows() {
    let Some(pool) = common::postgres("bulk_rows").await else {
        return;
    };
    bulk_statements_find_their_rows(pool, "bytea").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_bulk_statements_find_their_rows() {
    let Some(pool) = common::mysql("bulk_rows").await else {
        return;
    };
    bulk_statements_find_their_rows(pool, "binary").await;
}

/// On MySQL a batch's statements read its rows from `JSON_TABLE` first and look each up by its
/// key (the primary key, never a scan), in that order whatever the statistics say.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_batch_finds_its_rows_by_their_key() {
    use inbox::Backend;
    use sqlx::Row;

    let Some(pool) = common::mysql("mysql_bulk_plans").await else {
        return;
    };
    let bulk = sqlx::MySql::SQL.batch;
    let inbox_core::storage::BulkAdvance::LockThenSet { set, .. } = bulk.advance else {
        panic!("MySQL moves its streams with a statement of its own");
    };
    let messages = r#"[{"handler": "step", "message_id": "m-7"}]"#;
    let streams = r#"[{"handler": "step", "aggregate_id": "a-7", "sequence_number": 3}]"#;
    let statements = [
        (bulk.seen, messages, "m"),
        (bulk.settle_stale, messages, "m"),
        (bulk.last_sequences, streams, "s"),
        (set, streams, "s"),
    ];
    for (sql, document, table) in statements {
        let plan = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .bind("billing")
            .bind(document)
            .fetch_all(&pool)
            .await
            .unwrap();
        let steps: Vec<(String, String, Option<String>)> = plan
            .iter()
            .filter_map(|row| {
                let table: Option<String> = row.try_get("table").unwrap();
                let access: Option<String> = row.try_get("type").unwrap();
                Some((table?, access?, row.try_get("key").unwrap()))
            })
            .filter(|(table, _, _)| !table.starts_with("<derived"))
            .collect();
        let [(first, _, _), (looked_up, access, key)] = &steps[..] else {
            panic!("{sql}: {steps:?}");
        };
        assert_eq!((first.as_str(), looked_up.as_str()), ("r", table), "{sql}");
        let by_key = ["eq_ref", "ref", "range"].contains(&access.as_str());
        assert!(
            by_key && key.as_deref() == Some("PRIMARY"),
            "{sql}: {steps:?}"
        );
    }
}

/// A MySQL batch reads the dedup rows there before it inserts the others: a row another
/// transaction writes in between makes the insert fail (the batch then goes one message per
/// transaction); it is never taken for a row the batch inserted.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_bulk_claim_refuses_a_row_written_after_its_read() {
    use inbox::Backend;
    use inbox_core::storage::bulk;

    let Some(pool) = common::mysql("mysql_bulk_claim_race").await else {
        return;
    };
    let mut other = sqlx::MySql::begin(&pool).await.unwrap();
    let insert = "INSERT INTO inbox_messages \
        (consumer, handler, message_id, message_type, status, payload_hash) \
        VALUES ('billing', 'step', 'm-1', 'batch.step', 'processed', X'00')";
    sqlx::query(insert).execute(&mut *other).await.unwrap();

    let (connection, blocked) = tokio::sync::oneshot::channel();
    let batch = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx = sqlx::MySql::begin(&pool).await.unwrap();
            connection.send(mysql_connection_id(&mut tx).await).unwrap();
            let claim = inbox_core::Claim {
                consumer: "billing",
                handler: "step",
                message_id: "m-1",
                message_type: "batch.step",
                aggregate: None,
                sequence: None,
                payload_hash: &[0],
                now_ms: 0,
            };
            bulk::claim(&mut tx, "billing", &[claim])
                .await
                .map(|claims| claims.inserted)
        }
    });
    mysql_runs_its_insert(&pool, blocked.await.unwrap()).await;
    other.commit().await.unwrap();
    let claimed = batch.await.unwrap();

    let refused = matches!(&claimed, Err(sqlx::Error::Database(e)) if e.is_unique_violation());
    assert!(refused, "{claimed:?}");
}

/// A MySQL batch locks its streams before it reads where they stand: a stream another
/// transaction moves past the batch's message in the meantime finds that message stale, and is
/// never moved back.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_bulk_advance_waits_for_a_stream_moved_meanwhile() {
    use inbox::Backend;
    use inbox_core::storage::bulk;

    let Some(pool) = common::mysql("mysql_bulk_advance_race").await else {
        return;
    };
    let stream = "INSERT INTO inbox_streams (consumer, handler, aggregate_id, last_sequence) \
        VALUES ('billing', 'step', 'a-1', 1)";
    sqlx::query(stream).execute(&pool).await.unwrap();
    let mut other = sqlx::MySql::begin(&pool).await.unwrap();
    let advance = "UPDATE inbox_streams SET last_sequence = 5 WHERE aggregate_id = 'a-1'";
    sqlx::query(advance).execute(&mut *other).await.unwrap();

    let (connection, blocked) = tokio::sync::oneshot::channel();
    let batch = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx = sqlx::MySql::begin(&pool).await.unwrap();
            connection.send(mysql_connection_id(&mut tx).await).unwrap();
            let moved = bulk::advance(&mut tx, "billing", &[("step", "a-1", 3)]).await;
            tx.commit().await.unwrap();
            moved.unwrap()
        }
    });
    mysql_runs_its_insert(&pool, blocked.await.unwrap()).await;
    other.commit().await.unwrap();
    let moved = batch.await.unwrap();

    let last: i64 = sqlx::query_scalar("SELECT last_sequence FROM inbox_streams")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(moved.is_empty(), "the message is stale: {moved:?}");
    assert_eq!(last, 5);
}

/// The server's id of the connection `tx` runs on.
#[cfg(feature = "mysql")]
async fn mysql_connection_id(tx: &mut sqlx::MySqlConnection) -> u64 {
    let id = sqlx::query_scalar("SELECT CONNECTION_ID()");
    id.fetch_one(&mut *tx).await.unwrap()
}

/// Returns once connection `id` runs a statement that writes to the inbox's tables (MariaDB lists
/// a statement blocked on a row lock as running: its state is that of its work, not the wait).
#[cfg(feature = "mysql")]
async fn mysql_runs_its_insert(pool: &sqlx::MySqlPool, id: u64) {
    let running = "SELECT COUNT(*) FROM information_schema.processlist \
        WHERE ID = ? AND INFO LIKE 'INSERT INTO inbox\\_%'";
    common::eventually_async("the batch runs its insert", || async {
        let count: i64 = sqlx::query_scalar(running)
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        count > 0
    })
    .await;
    // Past its start, where the statement reads what is committed, to the lock.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

#[derive(Debug, Clone, inbox::prelude::Serialize, inbox::prelude::Deserialize, inbox::Message)]
#[message(name = "batch.entry")]
struct Entry {
    id: String,
    account: String,
    sequence: i64,
}

/// Writes its row, then fails for good on an id starting with `bad`.
#[inbox::inbox_handler(
    key = "id",
    sequence = "sequence",
    aggregate = "account",
    name = "entry"
)]
async fn entry(tx: &mut sqlx::SqliteConnection, msg: Entry) -> Result<(), inbox::HandlerError> {
    sqlx::query("INSERT INTO written (id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut *tx)
        .await?;
    if msg.id.starts_with("bad") {
        return Err(inbox::HandlerError::msg("bad is refused"));
    }
    Ok(())
}

/// When a message of a batch fails, the messages before it commit before its failure is recorded,
/// as they would one per transaction: from that record on, the store may retry it, and a retry
/// that came first would move its aggregate past them and make them stale. A trigger notes what
/// was committed when the failure was recorded.
#[tokio::test]
async fn the_messages_before_a_failure_commit_before_it_is_recorded() {
    use inbox::prelude::*;

    let pool = common::sqlite("batch_failure_order").await.unwrap();
    for ddl in [
        "CREATE TABLE written (id TEXT NOT NULL)",
        "CREATE TABLE written_at_failure (written INTEGER NOT NULL)",
        "CREATE TRIGGER failure_inserted AFTER INSERT ON inbox_messages \
         WHEN NEW.status IN ('failed', 'dead') \
         BEGIN INSERT INTO written_at_failure SELECT COUNT(*) FROM written; END",
        "CREATE TRIGGER failure_updated AFTER UPDATE OF status ON inbox_messages \
         WHEN NEW.status IN ('failed', 'dead') \
         BEGIN INSERT INTO written_at_failure SELECT COUNT(*) FROM written; END",
    ] {
        sqlx::raw_sql(ddl).execute(&pool).await.unwrap();
    }
    let inbox = Inbox::builder(pool.clone())
        .workers(1)
        .batch(inbox::Batch::new(8))
        .handler(entry)
        .build()
        .await
        .unwrap();
    let broker = inbox::MemoryBroker::new();
    let deliveries = [("a-1", 1), ("a-2", 2), ("bad-3", 3), ("a-4", 4)];
    for (id, sequence) in deliveries {
        let message = Entry {
            id: id.into(),
            account: "a".into(),
            sequence,
        };
        broker.publish(Envelope::encode(format!("delivery-{id}"), &message).unwrap());
    }
    broker.close();

    inbox.run(broker.source()).await.unwrap();

    let at_failure: Vec<i64> = sqlx::query_scalar("SELECT written FROM written_at_failure")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        at_failure,
        [2],
        "a-1 and a-2 committed before bad-3's failure was recorded"
    );
    let written: Vec<String> = sqlx::query_scalar("SELECT id FROM written ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(written, ["a-1", "a-2", "a-4"]);
}

#[derive(Debug, Clone, inbox::prelude::Serialize, inbox::prelude::Deserialize, inbox::Message)]
#[message(name = "batch.locking")]
struct Locking {
    id: String,
    row: i32,
}

/// Takes the lock of its row of `deadlock_rows`, then writes its id.
#[inbox::inbox_handler(key = "id", aggregate = "id", name = "locking")]
async fn locking(tx: &mut sqlx::PgConnection, msg: Locking) -> Result<(), inbox::HandlerError> {
    sqlx::query("UPDATE deadlock_rows SET n = n + 1 WHERE id = $1")
        .bind(msg.row)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO written (id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Waits until a statement on `deadlock_rows` waits for a lock.
async fn until_waiting_for_a_row_lock(pool: &sqlx::PgPool) {
    let sql = "SELECT COUNT(*) FROM pg_stat_activity \
               WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE deadlock_rows%'";
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(sql).fetch_one(pool).await.unwrap();
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the batch never waited for the row lock");
}

/// A deadlock between a batch and another transaction is the batch's, not the failure of the
/// message whose statement PostgreSQL chose to end it: the batch is refused and each message
/// goes in a transaction of its own, where all of them are processed, none failed.
#[tokio::test]
async fn postgres_a_deadlock_in_a_batch_is_not_a_message_failure() {
    use inbox::prelude::*;

    let Some(pool) = common::postgres("batch_deadlock").await else {
        return;
    };
    for ddl in [
        "CREATE TABLE deadlock_rows (id INT PRIMARY KEY, n INT NOT NULL)",
        "INSERT INTO deadlock_rows VALUES (1, 0), (2, 0)",
        "CREATE TABLE written (id TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    let inbox = Inbox::builder(pool.clone())
        .workers(1)
        .batch(inbox::Batch::new(8).linger(std::time::Duration::from_millis(300)))
        .handler(locking)
        .build()
        .await
        .unwrap();
    let broker = inbox::MemoryBroker::new();
    for (id, row) in [("first", 1), ("second", 2)] {
        let message = Locking { id: id.into(), row };
        broker.publish(Envelope::encode(format!("delivery-{id}"), &message).unwrap());
    }
    broker.close();
    // Another transaction holds row 2; the batch takes row 1, then waits for row 2.
    let mut other = pool.begin().await.unwrap();
    let take = |row: i32| sqlx::query("UPDATE deadlock_rows SET n = n + 1 WHERE id = $1").bind(row);
    take(2).execute(&mut *other).await.unwrap();
    let source = broker.source();
    let run = tokio::spawn(async move { inbox.run(source).await });
    until_waiting_for_a_row_lock(&pool).await;

    // Asking for row 1 closes the cycle; the batch, waiting longer, is the one chosen to end it.
    take(1).execute(&mut *other).await.unwrap();
    other.commit().await.unwrap();
    let report = run.await.unwrap().unwrap();

    assert_eq!(report.batches_refused, 1, "{report:?}");
    assert_eq!(
        report.handler_calls_with(Outcome::Processed),
        2,
        "{report:?}"
    );
    let sql = "SELECT message_id || ':' || status FROM inbox_messages ORDER BY message_id";
    let statuses: Vec<String> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
    assert_eq!(statuses, ["first:processed", "second:processed"]);
    assert_eq!(broker.acked(), 2);
}
