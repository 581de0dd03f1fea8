//! The `inbox` command end to end: the built binary against real databases (SQLite always,
//! PostgreSQL and MySQL when `INBOX_TEST_POSTGRES_URL` and `INBOX_TEST_MYSQL_URL` are set), each case checking what changed in the
//! database, not only what was printed.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Stdio};

/// One run of the `inbox` binary.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts the run succeeded.
    fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "the command failed: {self:#?}");
        self
    }

    /// Asserts the run failed with `code` and said something mentioning each of `words`.
    fn failed(self, code: i32, words: &[&str]) -> Self {
        assert_eq!(self.code, Some(code), "{self:#?}");
        let error = self.stderr.lines().find(|line| line.starts_with("error: "));
        assert!(error.is_some(), "no `error: ...` line: {self:#?}");
        for word in words {
            assert!(self.stderr.contains(word), "expected {word:?} in {self:#?}");
        }
        self
    }

    /// Stdout as the one JSON document `--json` prints.
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }
}

/// Runs `inbox --database-url <url> <args>` with nothing on stdin.
fn cli(url: &str, args: &[&str]) -> Run {
    cli_with_input(url, args, "")
}

/// Runs `inbox --database-url <url> <args>`, typing `input` on its stdin (then end of input).
fn cli_with_input(url: &str, args: &[&str], input: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("INBOX_CONSUMER")
        .env("USER", "tester")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the inbox binary");
    let mut stdin = child.stdin.take().expect("the child's stdin");
    // A command that never reads its stdin may exit before this write: that is fine.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let output = child.wait_with_output().expect("run the inbox binary");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Whether `text` is a time as the CLI shows it: RFC 3339, in UTC, to the second
/// (`2026-12-02T21:23:42Z`).
fn utc_time(text: &str) -> bool {
    let shape = text
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c });
    shape.collect::<String>() == "9999-99-99T99:99:99Z"
}

/// The cases, for one backend: `$url` gives a new database's URL, `$connect` a pool on it (for
/// SQLite, creating the file), `$ten_days_ago` is SQL for that moment, and `$refuse_updates` the
/// statements of a trigger that fails every update of `inbox_messages` with a message of its
/// own, as a server would with its internals.
macro_rules! cli_suite {
    ($db:ty, $url:path, $connect:path, $ten_days_ago:literal, $refuse_updates:expr) => {
        use inbox::prelude::*;
        use serde_json::json;

        use super::{cli, cli_with_input};

        type Pool = sqlx::Pool<$db>;

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "test.order")]
        struct Order {
            id: String,
        }

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "test.step")]
        struct Step {
            id: String,
            account: String,
            version: i64,
        }

        /// Fails permanently while the `broken` table has a row; records the order otherwise.
        #[inbox_handler(key = "id", name = "record_order")]
        async fn record_order(ctx: &mut Context<'_, $db>, order: Order) -> Result<(), HandlerError> {
            let broken: i64 = sqlx::query_scalar(crate::common::sql::<$db>("SELECT COUNT(*) FROM broken")).fetch_one(&mut **ctx).await?;
            if broken > 0 {
                return Err(HandlerError::permanent(HandlerError::msg("the `broken` table has a row")));
            }
            sqlx::query(crate::common::sql::<$db>("INSERT INTO recorded (id) VALUES ($1)")).bind(order.id).execute(&mut **ctx).await?;
            Ok(())
        }

        /// Applies an account's steps strictly in order.
        #[inbox_handler(key = "id", sequence = "version", aggregate = "account", ordering = "strict")]
        async fn apply_step(ctx: &mut Context<'_, $db>, step: Step) -> Result<(), HandlerError> {
            sqlx::query(crate::common::sql::<$db>("INSERT INTO recorded (id) VALUES ($1)")).bind(step.id).execute(&mut **ctx).await?;
            Ok(())
        }

        /// A database migrated by `inbox migrate`, with the tables of the handlers above.
        async fn database(test: &str) -> Option<(Pool, String)> {
            let url = $url(test).await?;
            cli(&url, &["migrate"]).ok();
            let pool = $connect(&url).await;
            for ddl in ["CREATE TABLE broken (id TEXT)", "CREATE TABLE recorded (id TEXT NOT NULL)"] {
                sqlx::query(crate::common::sql::<$db>(ddl)).execute(&pool).await.expect("create a test table");
            }
            Some((pool, url))
        }

        /// A database holding one dead message: order `o-1` of `record_order`.
        async fn with_dead_order(test: &str) -> Option<(Pool, String, Inbox<$db>)> {
            let (pool, url) = database(test).await?;
            sqlx::query(crate::common::sql::<$db>("INSERT INTO broken (id) VALUES ('o-1')")).execute(&pool).await.unwrap();
            let inbox = Inbox::builder(pool.clone()).handler(record_order).build().await.unwrap();
            let order = Order { id: "o-1".into() };
            let envelope = Envelope::encode("delivery-o-1", &order).unwrap().with_header("correlation-id", "corr-o-1");
            let error = inbox.dispatch(&envelope).await.unwrap_err();
            assert!(error.to_string().contains("broken"), "{error}");
            assert_eq!(row(&pool, "o-1").await.0, "dead");
            Some((pool, url, inbox))
        }

        /// `(status, resolution, resolved_by, resolved_reason)` of message `id`.
        async fn row(pool: &Pool, id: &str) -> (String, Option<String>, Option<String>, Option<String>) {
            sqlx::query_as(crate::common::sql::<$db>("SELECT status, resolution, resolved_by, resolved_reason FROM inbox_messages WHERE message_id = $1"))
                .bind(id.to_owned())
                .fetch_one(pool)
                .await
                .expect("read the inbox row")
        }

        async fn recorded(pool: &Pool) -> Vec<String> {
            sqlx::query_scalar(crate::common::sql::<$db>("SELECT id FROM recorded ORDER BY id")).fetch_all(pool).await.unwrap()
        }

        async fn count(pool: &Pool, status: &str, prefix: &str) -> i64 {
            sqlx::query_scalar(crate::common::sql::<$db>("SELECT COUNT(*) FROM inbox_messages WHERE status = $1 AND message_id LIKE $2"))
                .bind(status.to_owned())
                .bind(format!("{prefix}%"))
                .fetch_one(pool)
                .await
                .unwrap()
        }

        #[tokio::test]
        async fn migrate_applies_the_schema_to_a_fresh_database() {
            let Some(url) = $url("cli_migrate").await else { return };

            let migrated = cli(&url, &["migrate"]).ok();
            assert!(migrated.stdout.contains("up to date"), "{migrated:#?}");
            let status = cli(&url, &["status", "--json"]).ok().json();

            assert_eq!(status["handlers"], json!([]), "{status}");
            assert_eq!(status["rejected"], json!([]), "{status}");
            assert_eq!(status["conflicts"], json!([]), "{status}");
            assert!(status["storage_bytes"].as_i64().is_some_and(|bytes| bytes > 0), "{status}");
            let pool = $connect(&url).await;
            let rows: i64 = sqlx::query_scalar(crate::common::sql::<$db>("SELECT COUNT(*) FROM inbox_messages")).fetch_one(&pool).await.unwrap();
            assert_eq!(rows, 0);
            cli(&url, &["migrate"]).ok();
            let ddl = cli(&url, &["schema"]).ok().stdout;
            assert!(ddl.contains("CREATE TABLE IF NOT EXISTS inbox_messages"), "{ddl}");
        }

        #[tokio::test]
        async fn a_dead_message_is_listed_shown_and_replayed_by_the_running_consumer() {
            let Some((pool, url, inbox)) = with_dead_order("cli_replay").await else { return };

            let dead = cli(&url, &["dead", "list", "--json"]).ok().json();
            assert_eq!(dead.as_array().map(Vec::len), Some(1), "{dead}");
            assert_eq!((&dead[0]["handler"], &dead[0]["message_id"]), (&json!("record_order"), &json!("o-1")));
            assert_eq!(dead[0]["last_error"], json!("the `broken` table has a row"));
            let (received, failed) = (dead[0]["received_at"].as_str().unwrap(), dead[0]["failed_at"].as_str().unwrap());
            assert!(crate::utc_time(received) && crate::utc_time(failed) && received <= failed, "UTC times on every backend: {dead}");
            let table = cli(&url, &["dead", "list"]).ok().stdout;
            assert!(table.contains(failed), "the table shows the same RFC 3339 time: {table}");
            let shown = cli(&url, &["dead", "show", "record_order", "o-1"]).ok().stdout;
            assert!(shown.contains("the `broken` table has a row"), "{shown}");
            assert!(shown.contains(r#""id":"o-1""#), "the payload, as text: {shown}");
            assert!(shown.contains("correlation-id:") && shown.contains("corr-o-1"), "the headers: {shown}");
            let detail = cli(&url, &["show", "record_order", "o-1", "--json"]).ok().json();
            assert_eq!((&detail["status"], &detail["headers"]), (&json!("dead"), &json!({"correlation-id": "corr-o-1"})), "{detail}");

            sqlx::query(crate::common::sql::<$db>("DELETE FROM broken")).execute(&pool).await.unwrap();
            let replayed = cli(&url, &["dead", "replay", "record_order", "o-1", "--reason", "fixed"]).ok();

            assert!(replayed.stdout.contains("next sweep"), "{replayed:#?}");
            let requested = (Some("replayed".to_owned()), Some("tester".to_owned()), Some("fixed".to_owned()));
            let (status, resolution, by, reason) = row(&pool, "o-1").await;
            assert_eq!((status.as_str(), (resolution, by, reason)), ("failed", requested));
            assert!(recorded(&pool).await.is_empty(), "the CLI does not run handlers");
            assert_eq!(inbox.replay_requested().await.unwrap(), 1);
            assert_eq!(recorded(&pool).await, ["o-1"]);
            assert_eq!(row(&pool, "o-1").await.0, "processed");
            assert_eq!(cli(&url, &["dead", "list", "--json"]).ok().json(), json!([]));
            let status = cli(&url, &["status", "--json"]).ok().json();
            assert_eq!((&status["handlers"][0]["processed"], &status["handlers"][0]["dead"]), (&json!(1), &json!(0)), "{status}");
            let table = cli(&url, &["status"]).ok().stdout;
            assert!(table.contains("record_order") && table.contains("PROCESSED"), "{table}");
        }

        /// The status of message `id` of consumer `consumer`.
        async fn status_of(pool: &Pool, consumer: &str, id: &str) -> String {
            sqlx::query_scalar(crate::common::sql::<$db>("SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2"))
                .bind(consumer.to_owned())
                .bind(id.to_owned())
                .fetch_one(pool)
                .await
                .expect("read the inbox row")
        }

        #[tokio::test]
        async fn without_a_consumer_lists_cover_every_consumer_and_a_message_is_found_where_it_is() {
            let Some((pool, url)) = database("cli_consumers").await else { return };
            sqlx::query(crate::common::sql::<$db>("INSERT INTO broken (id) VALUES ('x')")).execute(&pool).await.unwrap();
            for consumer in ["shop", "billing"] {
                let inbox = Inbox::builder(pool.clone()).consumer(consumer).handler(record_order).build().await.unwrap();
                for id in [format!("{consumer}-1"), "both".to_owned()] {
                    let envelope = Envelope::encode(format!("delivery-{id}"), &Order { id }).unwrap();
                    inbox.dispatch(&envelope).await.unwrap_err();
                }
            }

            let dead = cli(&url, &["dead", "list", "--json"]).ok().json();
            let listed: Vec<(&str, &str)> = dead.as_array().unwrap().iter()
                .map(|message| (message["consumer"].as_str().unwrap(), message["message_id"].as_str().unwrap()))
                .collect();
            assert_eq!(listed, [("billing", "billing-1"), ("billing", "both"), ("shop", "both"), ("shop", "shop-1")], "{dead}");
            let table = cli(&url, &["dead", "list"]).ok().stdout;
            assert!(table.starts_with("CONSUMER") && table.contains("shop-1"), "{table}");
            let one = cli(&url, &["dead", "list", "--consumer", "shop", "--json"]).ok().json();
            assert_eq!(one.as_array().map(Vec::len), Some(2), "{one}");
            let page = cli(&url, &["dead", "list", "--consumer", "shop", "--limit", "1", "--offset", "1", "--json"]).ok().json();
            assert_eq!((page.as_array().map(Vec::len), &page[0]["message_id"]), (Some(1), &json!("shop-1")), "the second page of one: {page}");
            let none = cli(&url, &["dead", "list", "--consumer", "default"]).ok().stdout;
            assert!(none.contains("No dead messages for consumer `default` (the consumers in this database are `billing`, `shop`)"), "{none}");
            let shown = cli(&url, &["dead", "show", "record_order", "shop-1", "--json"]).ok().json();
            assert_eq!(shown["consumer"], json!("shop"), "the only consumer that has it: {shown}");
            cli(&url, &["dead", "show", "record_order", "o-9"]).failed(4, &["for any consumer (`billing`, `shop`)"]);

            cli(&url, &["dead", "replay", "record_order", "both"]).failed(2, &["`billing`, `shop`", "--consumer"]);
            assert_eq!(status_of(&pool, "shop", "both").await, "dead", "an ambiguous command changes nothing");
            cli(&url, &["dead", "replay", "record_order", "both", "--consumer", "shop"]).ok();

            assert_eq!((status_of(&pool, "shop", "both").await, status_of(&pool, "billing", "both").await), ("failed".into(), "dead".into()));
        }

        #[tokio::test]
        async fn every_operator_action_is_kept_and_a_failed_replay_says_it_failed() {
            let Some((pool, url, inbox)) = with_dead_order("cli_history").await else { return };

            cli(&url, &["dead", "replay", "record_order", "o-1", "--reason", "first try"]).ok();
            let waiting = cli(&url, &["show", "record_order", "o-1", "--json"]).ok().json();
            assert_eq!(waiting["actions"][0]["outcome"], json!("waiting for the running consumer's next sweep"), "{waiting}");
            inbox.replay_requested().await.unwrap();
            assert_eq!(row(&pool, "o-1").await.0, "dead", "the handler still fails");
            let failed = cli(&url, &["show", "record_order", "o-1"]).ok().stdout;
            assert!(failed.contains("failed again, dead: the `broken` table has a row"), "{failed}");
            assert!(!failed.contains("resolution"), "no resolution that reads as if the replay worked: {failed}");
            sqlx::query(crate::common::sql::<$db>("DELETE FROM broken")).execute(&pool).await.unwrap();
            cli(&url, &["dead", "replay", "record_order", "o-1", "--reason", "fixed", "--by", "ops"]).ok();
            inbox.replay_requested().await.unwrap();

            let shown = cli(&url, &["show", "record_order", "o-1", "--json"]).ok().json();
            let actions: Vec<_> = shown["actions"].as_array().unwrap().iter()
                .map(|action| (action["action"].as_str().unwrap(), action["by"].as_str().unwrap(), action["reason"].as_str().unwrap(), action["outcome"].as_str().unwrap()))
                .collect();
            assert_eq!(actions, [
                ("replay", "tester", "first try", "failed again, dead: the `broken` table has a row"),
                ("replay", "ops", "fixed", "processed"),
            ], "{shown}");
            assert!(crate::utc_time(shown["actions"][0]["at"].as_str().unwrap()) && crate::utc_time(shown["actions"][0]["outcome_at"].as_str().unwrap()), "{shown}");
            let table = cli(&url, &["show", "record_order", "o-1"]).ok().stdout;
            assert!(table.contains("operator actions:") && table.contains("first try") && table.contains("fixed"), "{table}");
        }

        #[tokio::test]
        async fn only_a_stored_dead_message_can_be_replayed() {
            let Some((pool, url, _inbox)) = with_dead_order("cli_replay_missing").await else { return };

            cli(&url, &["dead", "replay", "record_order", "o-2"]).failed(4, &["o-2", "inbox dead list"]);
            cli(&url, &["dead", "show", "other_handler", "o-1"]).failed(4, &["other_handler"]);
            cli(&url, &["dead", "replay", "record_order", "o-1", "--consumer", "billing"]).failed(4, &["billing"]);
            cli(&url, &["dead", "replay", "record_order", "o-1"]).ok();
            cli(&url, &["dead", "replay", "record_order", "o-1"]).failed(4, &["`failed`, not dead"]);

            assert_eq!(row(&pool, "o-1").await.1.as_deref(), Some("replayed"));
        }

        #[tokio::test]
        async fn a_database_error_is_a_sentence_and_the_servers_message_is_for_verbose() {
            let Some((pool, url, _inbox)) = with_dead_order("cli_refused").await else { return };
            for ddl in $refuse_updates {
                sqlx::query(crate::common::sql::<$db>(ddl)).execute(&pool).await.expect("create the refusing trigger");
            }

            let refused = cli(&url, &["dead", "replay", "record_order", "o-1"]).failed(1, &["the database refused the operation", "--verbose"]);
            assert!(!refused.stderr.contains("line 948"), "no server internals: {refused:#?}");
            let verbose = cli(&url, &["dead", "replay", "record_order", "o-1", "--verbose"]).failed(1, &["detail: "]);
            assert!(verbose.stderr.contains("line 948"), "--verbose has the server's message: {verbose:#?}");
            assert_eq!(row(&pool, "o-1").await.0, "dead");
        }

        /// `(state, reason)` of rejected delivery `id`, as `rejected show` prints it.
        fn rejected_state(url: &str, id: i64) -> (String, String) {
            let shown = cli(url, &["rejected", "show", &id.to_string(), "--json"]).ok().json();
            (shown["state"].as_str().unwrap().to_owned(), shown["reason"].as_str().unwrap().to_owned())
        }

        /// The outcomes of rejected delivery `id`'s actions, in the order they were done.
        async fn rejected_outcomes(pool: &Pool, id: i64) -> Vec<(String, Option<String>)> {
            sqlx::query_as(crate::common::sql::<$db>("SELECT action, outcome FROM inbox_actions WHERE rejected_id = $1 ORDER BY id"))
                .bind(id)
                .fetch_all(pool)
                .await
                .expect("read the actions")
        }

        #[tokio::test]
        async fn a_rejected_delivery_is_listed_shown_and_replayed_by_the_running_consumer() {
            let Some((pool, url)) = database("cli_rejected").await else { return };
            let order = Envelope::encode("delivery-r-1", &Order { id: "r-1".into() }).unwrap().with_header("correlation-id", "corr-r-1");
            let first = inbox::storage::messages::reject(&pool, "shop", &order, "no handler is registered for message type `test.order`").await.unwrap();
            let unknown = Envelope::new("test.unknown", "delivery-u-1", b"{}".to_vec());
            let second = inbox::storage::messages::reject(&pool, "shop", &unknown, "no handler is registered for message type `test.unknown`").await.unwrap();

            let listed = cli(&url, &["rejected", "list", "--json"]).ok().json();
            assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
            assert_eq!((&listed[0]["id"], &listed[0]["consumer"], &listed[0]["state"], &listed[0]["message_type"]), (&json!(first), &json!("shop"), &json!("waiting"), &json!("test.order")));
            assert!(crate::utc_time(listed[0]["received_at"].as_str().unwrap()), "{listed}");
            let table = cli(&url, &["rejected", "list"]).ok().stdout;
            assert!(table.contains("DELIVERY ID") && table.contains("delivery-u-1"), "{table}");
            let shown = cli(&url, &["rejected", "show", &first.to_string()]).ok().stdout;
            assert!(shown.contains("corr-r-1") && shown.contains(r#""id":"r-1""#), "headers and payload: {shown}");
            cli(&url, &["rejected", "show", &first.to_string(), "--consumer", "billing"]).failed(4, &["billing", "inbox rejected list"]);
            cli(&url, &["rejected", "show", "999999"]).failed(4, &["999999"]);

            for id in [first, second] {
                let requested = cli(&url, &["rejected", "replay", &id.to_string(), "--reason", "handler deployed", "--json"]).ok().json();
                assert_eq!((&requested["action"], &requested["by"]), (&json!("replay_requested"), &json!("tester")), "{requested}");
            }
            assert_eq!(rejected_state(&url, first).0, "replay_requested");
            cli(&url, &["rejected", "replay", &first.to_string()]).failed(4, &["replay_requested"]);
            let status = cli(&url, &["status", "--json"]).ok().json();
            assert_eq!(status["rejected"], json!([{"consumer": "shop", "deliveries": 2}]), "not handled yet: {status}");

            // What the running consumer's sweep does.
            let inbox = Inbox::builder(pool.clone()).consumer("shop").handler(record_order).build().await.unwrap();
            let replayed = inbox.replay_requested().await.unwrap();

            assert_eq!(replayed, 1);
            assert_eq!(recorded(&pool).await, ["r-1"]);
            assert_eq!(rejected_state(&url, first).0, "replayed");
            assert_eq!(rejected_outcomes(&pool, first).await, [("replay_rejected".to_owned(), Some("replayed: handled".to_owned()))]);
            let shown = cli(&url, &["rejected", "show", &first.to_string(), "--json"]).ok().json();
            assert_eq!((&shown["actions"][0]["reason"], &shown["actions"][0]["outcome"]), (&json!("handler deployed"), &json!("replayed: handled")), "{shown}");
            let (state, reason) = rejected_state(&url, second);
            assert_eq!((state.as_str(), reason.as_str()), ("waiting", "no handler is registered for message type `test.unknown`"), "refused again, back in the list");
            let outcomes = rejected_outcomes(&pool, second).await;
            assert!(outcomes[0].1.as_deref().is_some_and(|outcome| outcome.starts_with("rejected again: no handler")), "{outcomes:?}");
            let listed = cli(&url, &["rejected", "list", "--json"]).ok().json();
            assert_eq!((listed.as_array().map(Vec::len), &listed[0]["id"]), (Some(1), &json!(second)), "{listed}");

            let discard = ["rejected", "discard", &second.to_string(), "--reason", "obsolete type"];
            cli(&url, &discard).failed(5, &["aborted"]);
            assert_eq!(rejected_state(&url, second).0, "waiting");
            cli(&url, &[&discard[..], &["--yes"]].concat()).ok();

            assert_eq!(rejected_state(&url, second).0, "discarded");
            assert_eq!(rejected_outcomes(&pool, second).await.last().cloned(), Some(("discard_rejected".to_owned(), Some("discarded".to_owned()))));
            cli(&url, &[&discard[..], &["--yes"]].concat()).failed(4, &["discarded", "resolved already"]);
            assert_eq!(cli(&url, &["rejected", "list", "--json"]).ok().json(), json!([]));
            let none = cli(&url, &["rejected", "list"]).ok().stdout;
            assert!(none.starts_with("No rejected deliveries"), "{none}");
        }

        #[tokio::test]
        async fn a_conflict_is_counted_in_status_listed_and_shown_next_to_the_stored_message() {
            let Some((pool, url, inbox)) = with_dead_order("cli_conflicts").await else { return };
            let resent = Envelope::new("test.order", "delivery-o-1-again", br#"{"id":"o-1","note":"resent"}"#.to_vec())
                .with_header("correlation-id", "corr-again");
            let handled = inbox.dispatch(&resent).await.unwrap();
            assert_eq!(handled[0].outcome, Outcome::Conflict);

            let status = cli(&url, &["status", "--json"]).ok().json();
            assert_eq!(status["conflicts"], json!([{"consumer": "default", "handler": "record_order", "conflicts": 1}]), "{status}");
            let text = cli(&url, &["status"]).ok().stdout;
            assert!(text.contains("inbox conflicts list") && text.contains("record_order"), "{text}");
            let listed = cli(&url, &["conflicts", "list", "--json"]).ok().json();
            assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
            assert_eq!((&listed[0]["message_id"], &listed[0]["deliveries"]), (&json!("o-1"), &json!(1)), "{listed}");
            assert!(crate::utc_time(listed[0]["last_seen_at"].as_str().unwrap()), "{listed}");
            let id = listed[0]["id"].to_string();
            let shown = cli(&url, &["conflicts", "show", &id, "--json"]).ok().json();
            assert!(shown["payload"].as_str().unwrap().contains("resent"), "{shown}");
            assert_eq!((&shown["stored"]["status"], &shown["stored"]["payload"]), (&json!("dead"), &json!(r#"{"id":"o-1"}"#)), "both payloads: {shown}");
            assert_eq!(shown["headers"]["correlation-id"], json!("corr-again"), "{shown}");
            let text = cli(&url, &["conflicts", "show", &id]).ok().stdout;
            assert!(text.contains("resent") && text.contains(r#"{"id":"o-1"}"#), "{text}");

            sqlx::query(crate::common::sql::<$db>("DELETE FROM broken")).execute(&pool).await.unwrap();
            inbox.dispatch(&Envelope::encode("delivery-o-2", &Order { id: "o-2".into() }).unwrap()).await.unwrap();
            let other = Envelope::new("test.order", "delivery-o-2-again", br#"{"id":"o-2","note":"other"}"#.to_vec());
            inbox.dispatch(&other).await.unwrap();
            let listed = cli(&url, &["conflicts", "list", "--json"]).ok().json();
            let id = listed[1]["id"].to_string();
            let text = cli(&url, &["conflicts", "show", &id]).ok().stdout;
            assert!(text.contains("not kept: the stored message is `processed`"), "{text}");
            cli(&url, &["conflicts", "show", "999999"]).failed(4, &["999999", "inbox conflicts list"]);
            let none = cli(&url, &["conflicts", "list", "--consumer", "billing"]).ok().stdout;
            assert!(none.contains("No conflicts for consumer `billing`"), "{none}");

            let first = listed[0]["id"].to_string();
            let discard = ["conflicts", "discard", &first, "--reason", "the publisher resent with a new field"];
            cli(&url, &discard).failed(5, &["aborted"]);
            cli(&url, &[&discard[..], &["--yes"]].concat()).ok();

            let listed = cli(&url, &["conflicts", "list", "--json"]).ok().json();
            assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
            let shown = cli(&url, &["conflicts", "show", &first, "--json"]).ok().json();
            assert_eq!((&shown["resolution"], &shown["resolved_by"]), (&json!("discarded"), &json!("tester")), "{shown}");
            cli(&url, &[&discard[..], &["--yes"]].concat()).failed(4, &["resolved already"]);
        }

        #[tokio::test]
        async fn discarding_a_dead_message_needs_confirmation() {
            let Some((pool, url, _inbox)) = with_dead_order("cli_discard").await else { return };
            let discard = ["dead", "discard", "record_order", "o-1", "--reason", "obsolete"];

            let refused = cli_with_input(&url, &discard, "n\n").failed(5, &["aborted"]);
            assert!(refused.stderr.contains("[y/N]"), "{refused:#?}");
            assert_eq!(row(&pool, "o-1").await, ("dead".into(), None, None, None));
            cli(&url, &discard).failed(5, &["aborted"]);
            assert_eq!(row(&pool, "o-1").await.0, "dead", "the end of input is a no");

            let discarded = cli(&url, &[&discard[..], &["--yes", "--json"]].concat()).ok().json();

            assert_eq!(discarded["action"], json!("discarded"), "{discarded}");
            let resolved = (Some("discarded".to_owned()), Some("tester".to_owned()), Some("obsolete".to_owned()));
            assert_eq!(row(&pool, "o-1").await, ("discarded".into(), resolved.0, resolved.1, resolved.2));
            let status = cli(&url, &["status", "--json"]).ok().json();
            assert_eq!((&status["handlers"][0]["discarded"], &status["handlers"][0]["dead"]), (&json!(1), &json!(0)), "{status}");
            cli(&url, &[&discard[..], &["--yes"]].concat()).failed(4, &["`discarded`, not dead"]);
            let shown = cli(&url, &["dead", "show", "record_order", "o-1", "--json"]).ok().json();
            assert_eq!(shown["actions"].as_array().map(Vec::len), Some(1), "{shown}");
            let discard = &shown["actions"][0];
            assert_eq!((&discard["action"], &discard["reason"], &discard["outcome"]), (&json!("discard"), &json!("obsolete"), &json!("discarded")), "{shown}");
        }

        #[tokio::test]
        async fn a_skipped_gap_releases_the_parked_messages_on_the_next_sweep() {
            let Some((pool, url)) = database("cli_gap").await else { return };
            let inbox = Inbox::builder(pool.clone()).handler(apply_step).build().await.unwrap();
            for version in [3, 4] {
                let step = Step { id: format!("s-{version}"), account: "a-1".into(), version };
                inbox.dispatch(&Envelope::encode(format!("delivery-{version}"), &step).unwrap()).await.unwrap();
            }
            let parked = cli(&url, &["parked", "list", "--json"]).ok().json();
            assert_eq!(parked.as_array().map(Vec::len), Some(2), "{parked}");
            assert_eq!((&parked[0]["aggregate_id"], &parked[0]["sequence_number"]), (&json!("a-1"), &json!(3)));
            assert_eq!(parked[0]["consumer"], json!("default"), "{parked}");

            // A reason is optional (a default one is kept): the skip is refused for its aggregate.
            cli(&url, &["gap", "skip", "apply_step", "a-2", "--yes"]).failed(4, &["a-2", "no gap"]);
            let stream: Option<i64> = sqlx::query_scalar(crate::common::sql::<$db>("SELECT last_sequence FROM inbox_streams WHERE aggregate_id = 'a-2'"))
                .fetch_optional(&pool).await.unwrap();
            assert_eq!(stream, None, "a refused skip creates no stream");
            let skipped = cli_with_input(&url, &["gap", "skip", "apply_step", "a-1", "--reason", "v2 lost upstream", "--json"], "y\n").ok().json();
            assert_eq!((&skipped["by"], &skipped["reason"]), (&json!("tester"), &json!("v2 lost upstream")), "{skipped}");
            let action: (String, String, String, String, Option<String>) = sqlx::query_as(crate::common::sql::<$db>(
                "SELECT consumer, aggregate_id, action, performed_by || ': ' || reason, message_id FROM inbox_actions"))
                .fetch_one(&pool).await.expect("the skip is recorded");
            assert_eq!(action, ("default".into(), "a-1".into(), "skip_gap".into(), "tester: v2 lost upstream".into(), None));
            let shown = cli(&url, &["show", "apply_step", "s-3", "--json"]).ok().json();
            assert_eq!((&shown["actions"][0]["action"], &shown["actions"][0]["reason"]), (&json!("skip_gap"), &json!("v2 lost upstream")), "the skip is in the history of its aggregate's messages: {shown}");

            assert!(recorded(&pool).await.is_empty(), "the CLI does not run handlers");
            assert_eq!(inbox.resume().await.unwrap(), 2);
            assert_eq!(recorded(&pool).await, ["s-3", "s-4"]);
            assert_eq!(cli(&url, &["parked", "list", "--json"]).ok().json(), json!([]));
        }

        /// Inserts `rows` inbox rows `<prefix>-<n>` in `status`, received and handled ten days ago
        /// if `old`, now otherwise.
        async fn insert(pool: &Pool, prefix: &str, rows: usize, status: &str, old: bool) {
            const NOW: &str = "INSERT INTO inbox_messages (consumer, handler, message_id, message_type, status, payload_hash, received_at, processed_at, failed_at) \
                VALUES ('default', 'h', $1, 't', $2, $3, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)";
            const OLD: &str = concat!(
                "INSERT INTO inbox_messages (consumer, handler, message_id, message_type, status, payload_hash, received_at, processed_at, failed_at) \
                 VALUES ('default', 'h', $1, 't', $2, $3, ", $ten_days_ago, ", ", $ten_days_ago, ", ", $ten_days_ago, ")"
            );
            let mut tx = pool.begin().await.unwrap();
            for n in 0..rows {
                sqlx::query(crate::common::sql::<$db>(if old { OLD } else { NOW }))
                    .bind(format!("{prefix}-{n}"))
                    .bind(status.to_owned())
                    .bind(vec![0_u8; 32])
                    .execute(&mut *tx)
                    .await
                    .expect("insert an inbox row");
            }
            tx.commit().await.unwrap();
        }

        #[tokio::test]
        async fn purge_deletes_old_handled_rows_and_keeps_dead_ones() {
            let Some((pool, url)) = database("cli_purge").await else { return };
            insert(&pool, "old", 500, "processed", true).await;
            insert(&pool, "recent", 20, "processed", false).await;
            insert(&pool, "dead", 1, "dead", true).await;

            let plan = cli(&url, &["purge", "--older-than", "7d", "--dry-run", "--json"]).ok().json();
            assert_eq!((&plan["purgeable"], &plan["kept_dead"], &plan["kept_parked"]), (&json!(500), &json!(1), &json!(0)), "{plan}");
            assert_eq!(count(&pool, "processed", "old").await, 500, "a dry run deletes nothing");
            let default = cli(&url, &["purge", "--dry-run", "--json"]).ok().json();
            assert_eq!((&default["default_window"], &default["older_than"], &default["purgeable"]), (&json!(true), &json!("7days"), &json!(500)), "{default}");
            assert_eq!(plan["default_window"], json!(false), "{plan}");
            let said = cli(&url, &["purge", "--dry-run"]).ok().stdout;
            assert!(said.contains("more than 7days ago (the default window: no --older-than was given)"), "{said}");
            cli(&url, &["purge", "--yes"]).failed(2, &["--older-than", "7days"]);
            assert_eq!(count(&pool, "processed", "old").await, 500, "a purge without a window deletes nothing");
            cli(&url, &["purge", "--older-than", "7d"]).failed(5, &["aborted"]);
            assert_eq!(count(&pool, "processed", "old").await, 500, "no answer deletes nothing");

            let done = cli(&url, &["purge", "--older-than", "7d", "--yes", "--batch-size", "100", "--json"]).ok().json();

            assert_eq!((&done["purged"], &done["batches"]), (&json!(500), &json!(6)), "{done}");
            assert_eq!(done["kept_dead"], json!(1), "{done}");
            assert_eq!(count(&pool, "processed", "old").await, 0);
            assert_eq!(count(&pool, "processed", "recent").await, 20);
            assert_eq!(count(&pool, "dead", "dead").await, 1);
            let text = cli(&url, &["purge", "--older-than", "7d", "--yes"]).ok().stdout;
            assert!(text.contains("Purged 0") && text.contains("1 dead"), "{text}");
        }

        /// Writes one outbox message per aggregate in `aggregates`, in one committed transaction;
        /// gives their ids.
        async fn publish_outbox(pool: &Pool, aggregates: &[&str]) -> Vec<String> {
            let mut tx = pool.begin().await.unwrap();
            let mut ids = Vec::new();
            for aggregate in aggregates {
                let message = inbox_core::outbox::Outgoing::new("test.type", b"{}".to_vec()).aggregate(*aggregate);
                ids.push(inbox_core::outbox::publish(&mut *tx, message).await.expect("write to the outbox"));
            }
            tx.commit().await.unwrap();
            ids
        }

        /// Sets outbox message `id` to `status`, as a relay that gave up on it (`failed`) or
        /// published it would.
        async fn set_outbox(pool: &Pool, id: &str, status: &str) {
            let sql = match status {
                "failed" => "UPDATE inbox_outbox SET status = 'failed', last_error = 'refused', attempts = 3 WHERE id = $1",
                "published" => "UPDATE inbox_outbox SET status = 'published', published_at_ms = created_at_ms, attempts = 1 WHERE id = $1",
                other => panic!("the tests set no outbox status {other:?}"),
            };
            sqlx::query(crate::common::sql::<$db>(sql)).bind(id.to_owned()).execute(pool).await.expect("update the outbox row");
        }

        /// The ids of the outbox messages of `status`, in the order they were written.
        async fn outbox_ids(pool: &Pool, status: inbox_core::outbox::OutboxStatus) -> Vec<String> {
            let messages = inbox_core::outbox::list(pool, Some(status), 100).await.unwrap();
            messages.into_iter().map(|message| message.id).collect()
        }

        #[tokio::test]
        async fn the_outbox_lists_what_is_not_published_and_a_failed_message_is_retried() {
            use inbox_core::outbox::OutboxStatus;
            let Some((pool, url)) = database("cli_outbox").await else { return };
            let ids = publish_outbox(&pool, &["a-1", "a-1", "a-2"]).await;
            set_outbox(&pool, &ids[0], "failed").await;
            set_outbox(&pool, &ids[2], "published").await;

            let unpublished = cli(&url, &["outbox", "list", "--json"]).ok().json();
            assert_eq!(unpublished.as_array().map(Vec::len), Some(2), "{unpublished}");
            let (failed, pending) = (&unpublished[0], &unpublished[1]);
            assert_eq!((&failed["id"], &failed["status"], &pending["id"], &pending["status"]), (&json!(ids[0]), &json!("failed"), &json!(ids[1]), &json!("pending")));
            assert_eq!((&failed["aggregate_id"], &failed["aggregate_sequence"], &pending["aggregate_sequence"]), (&json!("a-1"), &json!(1), &json!(2)));
            assert_eq!((&failed["attempts"], &failed["last_error"], &failed["message_type"]), (&json!(3), &json!("refused"), &json!("test.type")));
            assert!(crate::utc_time(failed["created_at"].as_str().unwrap()), "{unpublished}");
            let published = cli(&url, &["outbox", "list", "--status", "published", "--json"]).ok().json();
            assert_eq!((&published[0]["id"], published.as_array().map(Vec::len)), (&json!(ids[2]), Some(1)), "{published}");
            assert!(crate::utc_time(published[0]["published_at"].as_str().unwrap()), "{published}");
            let first = cli(&url, &["outbox", "list", "--limit", "1", "--json"]).ok().json();
            assert_eq!(first, json!([unpublished[0]]));
            let table = cli(&url, &["outbox", "list"]).ok().stdout;
            for shown in [&ids[0], &ids[1], "a-1 #1", "a-1 #2", "failed", "refused", "CREATED"] {
                assert!(table.contains(shown), "expected {shown:?} in {table}");
            }
            assert!(!table.contains(&ids[2]), "published messages are not listed by default: {table}");

            let retried = cli(&url, &["outbox", "retry", &ids[0]]).ok();

            assert!(retried.stdout.contains("pending again"), "{retried:#?}");
            assert_eq!(outbox_ids(&pool, OutboxStatus::Failed).await, Vec::<String>::new());
            assert_eq!(outbox_ids(&pool, OutboxStatus::Pending).await, ids[..2]);
            let pending = inbox_core::outbox::list(&pool, Some(OutboxStatus::Pending), 1).await.unwrap();
            assert_eq!(pending[0].attempts, 0, "attempts are counted from zero again");
            cli(&url, &["outbox", "retry", &ids[0]]).failed(4, &[&ids[0], "inbox outbox list --status failed"]);
            cli(&url, &["outbox", "retry", &ids[2]]).failed(4, &[&ids[2]]);
            cli(&url, &["outbox", "retry", "no-such-id"]).failed(4, &["no-such-id"]);
            assert_eq!(outbox_ids(&pool, OutboxStatus::Published).await, [ids[2].clone()]);
        }

        #[tokio::test]
        async fn retrying_every_failed_outbox_message_needs_confirmation() {
            use inbox_core::outbox::OutboxStatus;
            let Some((pool, url)) = database("cli_outbox_all").await else { return };
            let ids = publish_outbox(&pool, &["a-1", "a-2", "a-3"]).await;
            for id in &ids[..2] {
                set_outbox(&pool, id, "failed").await;
            }

            let refused = cli_with_input(&url, &["outbox", "retry", "--all-failed"], "n\n").failed(5, &["aborted"]);
            assert!(refused.stderr.contains("2 failed") && refused.stderr.contains("[y/N]"), "{refused:#?}");
            cli(&url, &["outbox", "retry", "--all-failed"]).failed(5, &["aborted"]);
            assert_eq!(outbox_ids(&pool, OutboxStatus::Failed).await, ids[..2], "the end of input is a no");

            let retried = cli_with_input(&url, &["outbox", "retry", "--all-failed"], "y\n").ok();

            assert!(retried.stdout.contains("2 failed outbox messages are pending again"), "{retried:#?}");
            assert_eq!(outbox_ids(&pool, OutboxStatus::Failed).await, Vec::<String>::new());
            assert_eq!(outbox_ids(&pool, OutboxStatus::Pending).await, ids);
            let nothing = cli(&url, &["outbox", "retry", "--all-failed", "--json"]).ok().json();
            assert_eq!(nothing, json!({"id": null, "retried": 0}), "nothing failed, nothing asked");
            set_outbox(&pool, &ids[2], "failed").await;
            let all = cli(&url, &["outbox", "retry", "--all-failed", "--yes", "--json"]).ok().json();
            assert_eq!(all, json!({"id": null, "retried": 1}));
            assert_eq!(outbox_ids(&pool, OutboxStatus::Pending).await, ids);
        }

        #[tokio::test]
        async fn status_shows_the_outbox_backlog() {
            let Some((pool, url)) = database("cli_outbox_status").await else { return };
            let empty = cli(&url, &["status", "--json"]).ok().json();
            assert_eq!(empty["outbox"], json!({"pending": 0, "failed": 0, "oldest_unpublished_secs": null}), "{empty}");
            let text = cli(&url, &["status"]).ok().stdout;
            assert!(text.contains("Outbox: 0 pending, 0 failed; oldest unpublished: none"), "{text}");

            let ids = publish_outbox(&pool, &["a-1", "a-2", "a-3"]).await;
            set_outbox(&pool, &ids[0], "failed").await;
            set_outbox(&pool, &ids[2], "published").await;

            let status = cli(&url, &["status", "--json"]).ok().json();
            let outbox = &status["outbox"];
            assert_eq!((&outbox["pending"], &outbox["failed"]), (&json!(1), &json!(1)), "{status}");
            assert!(outbox["oldest_unpublished_secs"].as_f64().is_some_and(|secs| (0.0..600.0).contains(&secs)), "{status}");
            let text = cli(&url, &["status"]).ok().stdout;
            assert!(text.contains("Outbox: 1 pending, 1 failed; oldest unpublished: "), "{text}");
            assert!(!text.contains("oldest unpublished: none"), "{text}");
        }

        #[tokio::test]
        async fn a_database_without_the_schema_is_refused_with_a_pointer_to_migrate() {
            let Some(url) = $url("cli_no_schema").await else { return };
            let pool = $connect(&url).await;

            cli(&url, &["status"]).failed(3, &["inbox migrate"]);
            cli(&url, &["dead", "list"]).failed(3, &["inbox migrate"]);
            cli(&url, &["purge", "--older-than", "7d", "--yes"]).failed(3, &["inbox migrate"]);

            let probe = sqlx::query(crate::common::sql::<$db>("SELECT COUNT(*) FROM inbox_messages")).execute(&pool).await;
            assert!(probe.is_err(), "no command but migrate creates the tables");
        }

        #[tokio::test]
        async fn a_stream_table_without_its_key_is_refused_with_the_key_it_lacks() {
            let Some(url) = $url("cli_keyless").await else { return };
            let pool = $connect(&url).await;
            cli(&url, &["migrate"]).ok();
            for statement in [
                "ALTER TABLE inbox_streams RENAME TO inbox_streams_keyed",
                "CREATE TABLE inbox_streams AS SELECT * FROM inbox_streams_keyed WHERE 1 = 0",
            ] {
                sqlx::query(statement).execute(&pool).await.unwrap();
            }

            let key = "`inbox_streams` has no unique key on (consumer, handler, aggregate_id)";
            cli(&url, &["status"]).failed(3, &[key]);
        }
    };
}

/// For a backend whose purge leader holds a server lock (PostgreSQL's advisory lock, MySQL's
/// `GET_LOCK`): a purge while another instance leads deletes nothing. Expands inside a module
/// that ran `cli_suite!`.
macro_rules! purge_lock_case {
    () => {
        #[tokio::test]
        async fn a_purge_while_another_instance_purges_deletes_nothing() {
            let Some((pool, url)) = database("cli_purge_busy").await else {
                return;
            };
            insert(&pool, "old", 10, "processed", true).await;
            let other = inbox::storage::purge::lead_purge(&pool).await.unwrap();
            let other = other.expect("nobody else purges this schema");

            cli(&url, &["purge", "--older-than", "7d", "--yes", "--json"])
                .failed(6, &["another instance is purging"]);
            cli(&url, &["purge", "--older-than", "7d", "--yes"])
                .failed(6, &["nothing was deleted"]);
            assert_eq!(count(&pool, "processed", "old").await, 10);
            other.step_down().await.unwrap();
            cli(&url, &["purge", "--older-than", "7d", "--yes"]).ok();
            assert_eq!(count(&pool, "processed", "old").await, 0);
        }
    };
}

mod sqlite {
    use std::path::PathBuf;

    /// A pool on the SQLite database at `url`, creating its file.
    async fn connect(url: &str) -> sqlx::SqlitePool {
        let options = inbox::sqlite_options(url).expect("a SQLite URL");
        sqlx::SqlitePool::connect_with(options)
            .await
            .expect("open SQLite")
    }

    fn path(url: &str) -> PathBuf {
        PathBuf::from(url.trim_start_matches("sqlite://"))
    }

    cli_suite!(
        sqlx::Sqlite,
        crate::common::sqlite_url,
        connect,
        "datetime('now', '-10 days')",
        ["CREATE TRIGGER refuse BEFORE UPDATE ON inbox_messages \
             BEGIN SELECT RAISE(ABORT, 'refused by a trigger at line 948'); END"]
    );

    #[tokio::test]
    async fn migrate_creates_a_missing_sqlite_file() {
        let url = crate::common::sqlite_url("cli_create").await.unwrap();
        assert!(!path(&url).exists());

        cli(&url, &["migrate"]).ok();

        assert!(path(&url).exists());
    }

    #[tokio::test]
    async fn a_missing_sqlite_file_is_an_error_and_is_not_created() {
        let url = crate::common::sqlite_url("cli_typo").await.unwrap();

        cli(&url, &["status"]).failed(1, &["does not exist", "inbox migrate"]);
        cli(&url, &["dead", "list"]).failed(1, &["does not exist"]);

        assert!(
            !path(&url).exists(),
            "a typo'd path must not become an empty database"
        );
        let url = "sqlite:///no/such/directory/inbox.db";
        cli(url, &["status"]).failed(1, &["/no/such/directory/inbox.db", "does not exist"]);
    }
}

mod postgres {
    async fn connect(url: &str) -> sqlx::PgPool {
        sqlx::PgPool::connect(url)
            .await
            .expect("connect PostgreSQL")
    }

    cli_suite!(
        sqlx::Postgres,
        crate::common::postgres_url,
        connect,
        "now() - interval '10 days'",
        [
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             'BEGIN RAISE EXCEPTION ''refused by a trigger at line 948''; END'",
            "CREATE TRIGGER refuse BEFORE UPDATE ON inbox_messages \
             FOR EACH ROW EXECUTE FUNCTION refuse()"
        ]
    );

    purge_lock_case!();
}

#[cfg(feature = "mysql")]
mod mysql {
    async fn connect(url: &str) -> sqlx::MySqlPool {
        sqlx::MySqlPool::connect(url).await.expect("connect MySQL")
    }

    cli_suite!(
        sqlx::MySql,
        crate::common::mysql_url,
        connect,
        "CURRENT_TIMESTAMP(6) - INTERVAL 10 DAY",
        [
            "CREATE TRIGGER refuse BEFORE UPDATE ON inbox_messages FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by a trigger at line 948'"
        ]
    );

    purge_lock_case!();

    #[tokio::test]
    async fn a_mariadb_url_is_a_mysql_url() {
        let Some(url) = crate::common::mysql_url("cli_mariadb").await else {
            return;
        };
        let url = url.replacen("mysql://", "mariadb://", 1);

        cli(&url, &["migrate"]).ok();

        let status = cli(&url, &["status", "--json"]).ok().json();
        assert_eq!(status["handlers"], json!([]), "{status}");
    }
}

#[test]
fn an_unsupported_or_missing_database_url_is_a_usage_error() {
    cli("oracle://root:secret@localhost/inbox", &["status"])
        .failed(2, &["oracle", "postgres://", "mysql://", "sqlite://"]);
    let run = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .arg("status")
        .env_remove("DATABASE_URL")
        .output()
        .expect("run the inbox binary");
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("--database-url"));
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let run = cli(
        "sqlite://unused.db",
        &["purge", "--older-than", "7 parsecs"],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("--older-than"), "{run:#?}");
}

#[test]
fn the_schema_is_printed_without_a_database() {
    let mut backends = vec![("postgres", "bytea"), ("sqlite", "BLOB")];
    if cfg!(feature = "mysql") {
        backends.push(("mysql", "utf8mb4_bin"));
    }
    for (backend, ddl) in backends {
        let run = Command::new(env!("CARGO_BIN_EXE_inbox"))
            .args(["schema", "--backend", backend])
            .env_remove("DATABASE_URL")
            .output()
            .expect("run the inbox binary");
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "{run:?}");
        assert!(
            stdout.contains("CREATE TABLE IF NOT EXISTS inbox_messages")
                && stdout.contains("CREATE TABLE IF NOT EXISTS inbox_actions")
                && stdout.contains("CREATE TABLE IF NOT EXISTS inbox_conflicts")
                && stdout.contains(ddl),
            "{stdout}"
        );
    }
}

#[test]
fn an_unreachable_server_is_an_error() {
    cli("postgres://nobody@127.0.0.1:1/inbox", &["status"])
        .failed(1, &["cannot connect", "127.0.0.1:1"]);
}
