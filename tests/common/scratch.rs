//! The scratch space each test makes for itself, and its removal: a SQLite file, a PostgreSQL
//! schema or a MySQL database, removed when the test ends, passed or panicked.
//!
//! libtest runs every test on a thread of its own and waits for that thread to end, destructors
//! of its thread-locals included, before it reports the test. So what a test makes is recorded in
//! a thread-local ([`remove_when_test_ends`]) whose destructor removes it: after the test's body
//! and its runtime are gone, whether it returned or unwound. A run that is killed leaves its
//! scratch behind; the next run drops what is older than [`LEFT_BEHIND_AFTER`]
//! ([`drop_left_behind_postgres`], [`drop_left_behind_mysql`]), so that a run going on beside it
//! keeps its own.
//!
//! Schemas and databases are named [`PREFIX`], the second they were made, the test, the process
//! and a counter: `inbox_t_1767225600_flaky_4242_0`.

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};

/// How every test schema (PostgreSQL) and test database (MySQL) is named.
pub const PREFIX: &str = "inbox_t_";

/// Scratch older than this was left by a killed run: no test takes that long.
pub const LEFT_BEHIND_AFTER: Duration = Duration::from_secs(60 * 60);

/// Something a test made for itself.
pub enum Scratch {
    /// A SQLite database file, with its `-wal` and `-shm` files.
    SqliteFile(PathBuf),
    /// A schema on the PostgreSQL server at `server`.
    PostgresSchema { server: String, name: String },
    /// A database on the MySQL server at `server`.
    #[cfg(feature = "mysql")]
    MysqlDatabase { server: String, name: String },
}

/// A new schema or database name for `test`: [`PREFIX`], the current second, `test` (its first
/// 24 characters, lowercase, `[a-z0-9_]` only), the process and a counter. At most 57
/// characters, within PostgreSQL's 63 and MySQL's 64.
pub fn name(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let test: String = test
        .chars()
        .take(24)
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '_',
        })
        .collect();
    let made = now().as_secs();
    format!("{PREFIX}{made}_{test}_{}_{n}", std::process::id())
}

/// Records `scratch` as made by the test running on this thread, to be removed when it ends.
pub fn remove_when_test_ends(scratch: Scratch) {
    MADE.with(|made| made.0.borrow_mut().push(scratch));
}

thread_local! {
    static MADE: Made = const { Made(RefCell::new(Vec::new())) };
}

/// What the test on this thread made; removed when the thread ends.
struct Made(RefCell<Vec<Scratch>>);

impl Drop for Made {
    fn drop(&mut self) {
        let made = self.0.take();
        if made.is_empty() {
            return;
        }
        // This thread's runtime is gone and its thread-locals are being torn down: the removal
        // runs on a thread and a runtime of its own.
        let removal = std::thread::Builder::new()
            .name("remove test scratch".into())
            .spawn(move || remove(made));
        match removal.map(|thread| thread.join()) {
            Ok(Ok(())) => {}
            Ok(Err(_)) => warn("removing this test's scratch panicked"),
            Err(e) => warn(&format!(
                "could not start removing this test's scratch: {e}"
            )),
        }
    }
}

/// Removes every scratch in `made`, saying which it could not.
fn remove(made: Vec<Scratch>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let Ok(runtime) = runtime else {
        return warn("no runtime to remove this test's scratch with");
    };
    for scratch in made {
        match scratch {
            // A file that is not there, or cannot be removed, stays in the temporary directory.
            Scratch::SqliteFile(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
            Scratch::PostgresSchema { server, name } => {
                if let Err(e) = runtime.block_on(drop_postgres_schema(&server, &name)) {
                    warn(&format!("could not drop the test schema {name}: {e}"));
                }
            }
            #[cfg(feature = "mysql")]
            Scratch::MysqlDatabase { server, name } => {
                if let Err(e) = runtime.block_on(drop_mysql_database(&server, &name)) {
                    warn(&format!("could not drop the test database {name}: {e}"));
                }
            }
        }
    }
}

/// Drops schema `name` on the server at `url`, waiting ten seconds at most for a lock that a
/// connection the test leaked still holds.
async fn drop_postgres_schema(url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut admin = PgConnection::connect(url).await?;
    sqlx::query("SET lock_timeout = '10s'")
        .execute(&mut admin)
        .await?;
    let drop = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await?;
    admin.close().await
}

/// Drops database `name` on the server at `url`, like [`drop_postgres_schema`].
#[cfg(feature = "mysql")]
async fn drop_mysql_database(url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut admin = sqlx::MySqlConnection::connect(url).await?;
    sqlx::query("SET SESSION lock_wait_timeout = 10")
        .execute(&mut admin)
        .await?;
    let drop = format!("DROP DATABASE IF EXISTS `{name}`");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await?;
    admin.close().await
}

/// Drops, once per process, the test schemas that killed runs left on `admin`'s database.
pub async fn drop_left_behind_postgres(admin: &mut PgConnection) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)")
            .bind(PREFIX)
            .fetch_all(&mut *admin)
            .await
            .unwrap_or_default();
    for schema in schemas.into_iter().filter(|name| left_behind(name)) {
        let drop = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&mut *admin)
            .await
        {
            warn(&format!(
                "could not drop the left-behind schema {schema}: {e}"
            ));
        }
    }
}

/// Drops, once per process, the test databases that killed runs left on `admin`'s server.
#[cfg(feature = "mysql")]
pub async fn drop_left_behind_mysql(admin: &mut sqlx::MySqlConnection) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let databases: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
         WHERE LEFT(schema_name, CHAR_LENGTH(?)) = ?",
    )
    .bind(PREFIX)
    .bind(PREFIX)
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for database in databases.into_iter().filter(|name| left_behind(name)) {
        let drop = format!("DROP DATABASE IF EXISTS `{database}`");
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&mut *admin)
            .await
        {
            warn(&format!(
                "could not drop the left-behind database {database}: {e}"
            ));
        }
    }
}

/// Whether the scratch `name` (see [`name`]) was made longer than [`LEFT_BEHIND_AFTER`] ago.
fn left_behind(name: &str) -> bool {
    let made = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('_'))
        .and_then(|(made, _)| made.parse::<u64>().ok());
    made.is_some_and(|made| now().as_secs() > made + LEFT_BEHIND_AFTER.as_secs())
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// A line on the terminal: written to stderr itself, which libtest does not capture.
fn warn(what: &str) {
    let _ = writeln!(std::io::stderr(), "warning: {what} (a later run drops it)");
}
