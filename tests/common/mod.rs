//! Real databases for the behaviour tests: a fresh SQLite file per test, a fresh PostgreSQL
//! schema per test when `INBOX_TEST_POSTGRES_URL` is set, and a fresh MySQL database per test
//! when `INBOX_TEST_MYSQL_URL` is set (both required when `CI=true`). Each is removed when its
//! test ends ([`scratch`]). Without a server, a test is reported as skipped ([`skip`]).
//!
//! The tests write their own SQL in PostgreSQL's dialect with `$n` placeholders, each taken once
//! and in order; [`sql`] turns it into the backend's.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, PgConnection, PgPool, SqlitePool};

/// The variable that points the tests at a PostgreSQL server.
pub const POSTGRES_URL_VAR: &str = "INBOX_TEST_POSTGRES_URL";

/// The variable that points the tests at a MySQL or MariaDB server.
pub const MYSQL_URL_VAR: &str = "INBOX_TEST_MYSQL_URL";

/// The variable that points the broker tests at a NATS server with JetStream.
pub const NATS_URL_VAR: &str = "INBOX_TEST_NATS_URL";

/// The variable that points the broker tests at a RabbitMQ server.
pub const AMQP_URL_VAR: &str = "INBOX_TEST_AMQP_URL";

/// The variable that points the broker tests at a Redis server.
pub const REDIS_URL_VAR: &str = "INBOX_TEST_REDIS_URL";

/// The variable that holds a Kafka broker's bootstrap servers (`host:port,...`).
pub const KAFKA_BROKERS_VAR: &str = "INBOX_TEST_KAFKA_BROKERS";

/// A test's own SQL for `DB`: MySQL takes `?` where the tests write `$1`, `$2`, ...
pub fn sql<DB: sqlx::Database>(sql: &str) -> sqlx::AssertSqlSafe<String> {
    if DB::NAME != "MySQL" {
        return sqlx::AssertSqlSafe(sql.to_owned());
    }
    let mut translated = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            translated.push('?');
        } else {
            translated.push(c);
        }
    }
    sqlx::AssertSqlSafe(translated)
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A name no other test (or earlier run) uses: `test` plus the process, a counter and the time.
pub fn unique(test: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{test}_{}_{n}_{nanos}", std::process::id())
}

/// A port below 32768 (under the ephemeral range) that nothing listens on now and that no other
/// test of this process was given: servers of their own that tests start at once (a RabbitMQ node
/// may take seconds to listen) each get their own port.
pub fn free_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT_PORT: AtomicU16 = AtomicU16::new(0);
    let base = 21_000 + (std::process::id() % 9_000) as u16;
    let _ = NEXT_PORT.compare_exchange(0, base, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        let port = if port >= 32_000 {
            21_000 + port % 11_000
        } else {
            port
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub mod ledger;
pub mod queries;
pub mod scratch;
pub mod skip;

/// Runs a behaviour suite on every backend:
/// `$suite!(database, connection, connect, unmigrated, batch)` in a module named after each, where
/// `connect` gives a migrated database of the test's own, `unmigrated` an empty one, and `batch`
/// the suite's [`builder`] mode. `on_every_backend!(suite, batched)` runs it once more per backend
/// in batched mode (modules `<backend>_batched`). Adding a database is one entry here (and its
/// two functions below).
#[allow(unused_macros)]
macro_rules! on_every_backend {
    ($suite:ident) => {
        $crate::common::on_every_backend!(@modules sqlite, postgres, mysql: $suite, None);
    };
    ($suite:ident, batched) => {
        $crate::common::on_every_backend!(@modules sqlite, postgres, mysql: $suite, None);
        $crate::common::on_every_backend!(
            @modules sqlite_batched, postgres_batched, mysql_batched:
            $suite, Some(inbox::Batch::new(8))
        );
    };
    (@modules $sqlite:ident, $postgres:ident, $mysql:ident: $suite:ident, $batch:expr) => {
        mod $sqlite {
            $suite!(
                sqlx::Sqlite,
                sqlx::SqliteConnection,
                crate::common::sqlite,
                crate::common::sqlite_without_schema,
                $batch
            );
        }

        mod $postgres {
            $suite!(
                sqlx::Postgres,
                sqlx::PgConnection,
                crate::common::postgres,
                crate::common::postgres_without_schema,
                $batch
            );
        }

        #[cfg(feature = "mysql")]
        mod $mysql {
            $suite!(
                sqlx::MySql,
                sqlx::MySqlConnection,
                crate::common::mysql,
                crate::common::mysql_without_schema,
                $batch
            );
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_every_backend;

/// An inbox builder on `pool` in a suite's mode: batched with `batch`, or (`None`) one message
/// per transaction.
pub fn builder<DB: inbox::Backend>(
    pool: &sqlx::Pool<DB>,
    batch: Option<inbox::Batch>,
) -> inbox::InboxBuilder<DB> {
    let builder = inbox::Inbox::builder(pool.clone());
    match batch {
        Some(batch) => builder.batch(batch),
        None => builder,
    }
}

/// A migrated SQLite database in a new file (always available; `Option` to match [`postgres`]).
pub async fn sqlite(test: &str) -> Option<SqlitePool> {
    let pool = sqlite_without_schema(test).await?;
    inbox::migrate(&pool).await.expect("migrate SQLite");
    Some(pool)
}

/// An empty SQLite database in a new file, removed when the test ends, with the inbox's
/// connection options.
pub async fn sqlite_without_schema(test: &str) -> Option<SqlitePool> {
    let path = std::env::temp_dir().join(format!("inbox_{}.db", unique(test)));
    scratch::remove_when_test_ends(scratch::Scratch::SqliteFile(path.clone()));
    let url = format!("sqlite://{}", path.display());
    let options = inbox::sqlite_options(&url).expect("valid SQLite URL");
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options);
    Some(pool.await.expect("open SQLite"))
}

/// A migrated PostgreSQL schema of its own, dropped when the test ends, or `None` (the test
/// reported as skipped) when no server is configured. Under `CI=true` a missing server fails the
/// test instead.
pub async fn postgres(test: &str) -> Option<PgPool> {
    let pool = postgres_without_schema(test).await?;
    inbox::migrate(&pool).await.expect("migrate PostgreSQL");
    Some(pool)
}

/// An empty PostgreSQL schema of its own, like [`postgres`] without the inbox tables.
pub async fn postgres_without_schema(test: &str) -> Option<PgPool> {
    let url = postgres_url(test).await?;
    let pool = PgPoolOptions::new().max_connections(24).connect(&url);
    Some(pool.await.expect("connect PostgreSQL"))
}

/// The URL of a new SQLite database file that does not exist yet, for programs that connect by
/// URL, such as the CLI (`Option` to match [`postgres_url`]). Removed when the test ends.
pub async fn sqlite_url(test: &str) -> Option<String> {
    let path = std::env::temp_dir().join(format!("inbox_{}.db", unique(test)));
    scratch::remove_when_test_ends(scratch::Scratch::SqliteFile(path.clone()));
    Some(format!("sqlite://{}", path.display()))
}

/// The URL of a new, empty PostgreSQL schema of its own (no inbox tables), for programs that
/// connect by URL, such as the CLI: the URL's `options=-c search_path=...` selects the schema.
/// Dropped when the test ends; `None` when no server is configured, like [`postgres`].
pub async fn postgres_url(test: &str) -> Option<String> {
    let url = server_url(POSTGRES_URL_VAR, "PostgreSQL", test)?;
    let schema = scratch::name(test);
    let mut admin = PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {url}: {e}"));
    scratch::drop_left_behind_postgres(&mut admin).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&mut admin)
        .await
        .expect("create test schema");
    scratch::remove_when_test_ends(scratch::Scratch::PostgresSchema {
        server: url.clone(),
        name: schema.clone(),
    });
    let separator = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{separator}options=-c%20search_path%3D{schema}"
    ))
}

/// The URL of the NATS server, or `None` (the test reported as skipped) when none is configured;
/// under `CI=true` a missing server fails the test instead.
pub fn nats_url(test: &str) -> Option<String> {
    server_url(NATS_URL_VAR, "NATS", test)
}

/// The URL of the RabbitMQ server, like [`nats_url`].
pub fn amqp_url(test: &str) -> Option<String> {
    server_url(AMQP_URL_VAR, "RabbitMQ", test)
}

/// The URL of the Redis server, like [`nats_url`].
pub fn redis_url(test: &str) -> Option<String> {
    server_url(REDIS_URL_VAR, "Redis", test)
}

/// The bootstrap servers of the Kafka broker, like [`nats_url`].
pub fn kafka_brokers(test: &str) -> Option<String> {
    server_url(KAFKA_BROKERS_VAR, "Kafka", test)
}

/// The URL of the server `var` names, or `None` when it is not set, the test being reported as
/// skipped ([`skip`]). Under `CI=true` a missing server fails the test instead.
fn server_url(var: &str, server: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{var} is not set, and CI must run the {server} tests")
        }
        Err(_) => {
            skip::skip(test, &format!("no {server} server (set {var})"));
            None
        }
    }
}

/// A migrated MySQL database of its own, dropped when the test ends, or `None` (the test reported
/// as skipped) when no server is configured. Under `CI=true` a missing server fails the test
/// instead.
#[cfg(feature = "mysql")]
pub async fn mysql(test: &str) -> Option<sqlx::MySqlPool> {
    let pool = mysql_without_schema(test).await?;
    inbox::migrate(&pool).await.expect("migrate MySQL");
    Some(pool)
}

/// An empty MySQL database of its own, like [`mysql`] without the inbox tables.
#[cfg(feature = "mysql")]
pub async fn mysql_without_schema(test: &str) -> Option<sqlx::MySqlPool> {
    let url = mysql_url(test).await?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(24)
        .connect(&url);
    Some(pool.await.expect("connect MySQL"))
}

/// The URL of a new, empty MySQL database of its own (no inbox tables), like [`postgres_url`].
#[cfg(feature = "mysql")]
pub async fn mysql_url(test: &str) -> Option<String> {
    let url = server_url(MYSQL_URL_VAR, "MySQL", test)?;
    let database = scratch::name(test);
    let mut admin = sqlx::MySqlConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach MySQL at {url}: {e}"));
    scratch::drop_left_behind_mysql(&mut admin).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{database}`")))
        .execute(&mut admin)
        .await
        .expect("create test database");
    scratch::remove_when_test_ends(scratch::Scratch::MysqlDatabase {
        server: url.clone(),
        name: database.clone(),
    });
    let (server, _) = url.rsplit_once('/').expect("a MySQL URL names a database");
    Some(format!("{server}/{database}"))
}

/// Shuffles `items` the same way for the same `seed` (a small xorshift generator: the tests need
/// disorder they can reproduce, not quality randomness).
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// Waits, for ten seconds at most, until the future `done` makes says yes; panics saying `what` it
/// waited for.
pub async fn eventually_async<F: std::future::Future<Output = bool>>(
    what: &str,
    done: impl Fn() -> F,
) {
    for _ in 0..2_000 {
        if done().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Waits, for ten seconds at most, until `done` holds; panics saying `what` it waited for.
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    eventually_async(what, || std::future::ready(done())).await
}

/// Starts a run with `start` on a runtime of its own, and shuts that runtime down once `kill`
/// completes (it runs there too): every task stops where it is, as in a process killed. `start`
/// gives the run's inbox and source, built there on connections of their own (a pool the test
/// shares would keep connections bound to the runtime that is gone). Returns once the runtime is
/// gone.
#[allow(dead_code)]
pub fn run_then_kill<DB: inbox::Backend, S: inbox::Source + Send + 'static, Start>(
    start: impl FnOnce() -> Start + Send,
    kill: impl std::future::Future<Output = ()> + Send,
) where
    Start: std::future::Future<Output = (inbox::Inbox<DB>, S)>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                let (inbox, source) = runtime.block_on(start());
                runtime.spawn(async move { inbox.run(source).await });
                runtime.block_on(kill);
                runtime.shutdown_timeout(std::time::Duration::from_secs(10));
            })
            .join()
            .expect("the killed run's thread");
    });
}
