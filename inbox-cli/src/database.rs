//! From a database URL to a connected pool of the backend its scheme names.

use std::str::FromStr;
use std::time::Duration;

use inbox_core::Backend;
use inbox_core::storage::schema::SchemaError;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgPool, Pool, SqlitePool};

use crate::cli::BackendKind;
use crate::error::CliError;

/// An operator's command needs few connections: one for its queries, one for the purge lock.
const MAX_CONNECTIONS: u32 = 4;

/// How long to wait for a connection before saying the database is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected database, of one of the backends the inbox runs on.
pub enum Database {
    /// A PostgreSQL database.
    Postgres(PgPool),
    /// A SQLite database.
    Sqlite(SqlitePool),
    /// A MySQL or MariaDB database.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Which backend `url` names, from its scheme.
pub fn backend_of(url: &str) -> Result<BackendKind, CliError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(BackendKind::Postgres);
    }
    if url.starts_with("sqlite:") {
        return Ok(BackendKind::Sqlite);
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        return mysql_kind();
    }
    // Only the scheme is named in the error: the rest may hold a password. What comes before
    // the first `:` of a text that is no URL (`host=db password=s3:cr3t`) is no scheme.
    let scheme = match url.split_once(':') {
        Some((scheme, _)) if is_scheme(scheme) => scheme,
        _ => "(none)",
    };
    Err(CliError::UnsupportedScheme(scheme.to_owned()))
}

/// Whether `text` has the form of a URL's scheme: a letter, then letters, digits, `+`, `-`, `.`.
fn is_scheme(text: &str) -> bool {
    let mut characters = text.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && characters.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// MySQL, if this build has it.
fn mysql_kind() -> Result<BackendKind, CliError> {
    #[cfg(feature = "mysql")]
    return Ok(BackendKind::MySql);
    #[cfg(not(feature = "mysql"))]
    Err(CliError::MySqlNotBuilt)
}

/// Connects to the database at `url` (`None`: none was given). Only `create_sqlite_file` lets a
/// SQLite file be created; otherwise a missing file is an error, not a new empty database.
pub async fn connect(url: Option<&str>, create_sqlite_file: bool) -> Result<Database, CliError> {
    let url = url.ok_or(CliError::MissingDatabaseUrl)?;
    match backend_of(url)? {
        BackendKind::Postgres => Ok(Database::Postgres(connect_postgres(url).await?)),
        BackendKind::Sqlite => Ok(Database::Sqlite(
            connect_sqlite(url, create_sqlite_file).await?,
        )),
        #[cfg(feature = "mysql")]
        BackendKind::MySql => Ok(Database::MySql(connect_mysql(url).await?)),
    }
}

async fn connect_postgres(url: &str) -> Result<PgPool, CliError> {
    let mut options = PgConnectOptions::from_str(url).map_err(CliError::InvalidUrl)?;
    if options.get_application_name().is_none() {
        // What a DBA sees in pg_stat_activity, unless the URL or PGAPPNAME says otherwise.
        options = options.application_name("inbox-cli");
    }
    let target = server(
        options.get_host(),
        options.get_port(),
        options.get_database(),
    );
    open_server(options, target).await
}

/// Where a server database is, for an error message: never the credentials.
fn server(host: &str, port: u16, database: Option<&str>) -> String {
    format!("at {host}:{port}/{}", database.unwrap_or_default())
}

/// Opens a server database, saying where it is (`target`) if it cannot be reached.
async fn open_server<DB: sqlx::Database>(
    options: <DB::Connection as Connection>::Options,
    target: String,
) -> Result<Pool<DB>, CliError> {
    open(options)
        .await
        .map_err(|source| CliError::Connect { target, source })
}

async fn connect_sqlite(url: &str, create_file: bool) -> Result<SqlitePool, CliError> {
    let options = inbox_core::sqlite_options(url)
        .map_err(CliError::InvalidUrl)?
        .create_if_missing(create_file);
    let path = options.get_filename().to_owned();
    open(options)
        .await
        .map_err(|source| match path.try_exists() {
            Ok(false) if !create_file => CliError::NoSuchDatabaseFile(path.display().to_string()),
            _ => CliError::Connect {
                target: format!("`{}`", path.display()),
                source,
            },
        })
}

/// MariaDB's URLs (`mariadb://`) are MySQL's with another scheme.
#[cfg(feature = "mysql")]
async fn connect_mysql(url: &str) -> Result<sqlx::MySqlPool, CliError> {
    let url = url.replacen("mariadb://", "mysql://", 1);
    let options = sqlx::mysql::MySqlConnectOptions::from_str(&url).map_err(CliError::InvalidUrl)?;
    let target = server(
        options.get_host(),
        options.get_port(),
        options.get_database(),
    );
    open_server(options, target).await
}

/// Opens one connection first, so that a database that cannot be reached fails at once with
/// its own reason (a pool would retry until its timeout and report only that), then a pool.
async fn open<DB: sqlx::Database>(
    options: <DB::Connection as Connection>::Options,
) -> Result<Pool<DB>, sqlx::Error> {
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, DB::Connection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::Io(std::io::ErrorKind::TimedOut.into()))??;
    probe.close().await?;
    Ok(PoolOptions::<DB>::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options))
}

/// Fails with [`CliError::SchemaMissing`] (exit 3) if the inbox tables are missing or older
/// than this command, with [`CliError::SchemaIncomplete`] (exit 3) if they lack a unique key
/// the inbox relies on, and with a plain database error if the database could not answer.
pub async fn check_schema<DB: Backend>(pool: &Pool<DB>) -> Result<(), CliError> {
    match inbox_core::storage::schema::check(pool).await {
        Ok(()) => Ok(()),
        Err(SchemaError::Database(error)) => Err(error.into()),
        Err(incomplete) => Err(CliError::SchemaIncomplete(incomplete.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_names_the_backend() {
        let backend = |url| backend_of(url).ok();
        assert_eq!(backend("postgres://u@h/db"), Some(BackendKind::Postgres));
        assert_eq!(backend("postgresql://u@h/db"), Some(BackendKind::Postgres));
        assert_eq!(backend("sqlite://inbox.db"), Some(BackendKind::Sqlite));
        assert_eq!(backend("sqlite::memory:"), Some(BackendKind::Sqlite));
        #[cfg(feature = "mysql")]
        for url in ["mysql://u@h/db", "mariadb://u@h/db"] {
            assert_eq!(backend(url), Some(BackendKind::MySql));
        }
    }

    #[test]
    fn an_unsupported_scheme_is_named_without_the_rest_of_the_url() {
        let error = backend_of("oracle://root:secret@h/db").unwrap_err();
        assert!(matches!(&error, CliError::UnsupportedScheme(scheme) if scheme == "oracle"));
        assert!(!error.to_string().contains("secret"), "{error}");
        let error = backend_of("inbox.db").unwrap_err();
        assert!(matches!(&error, CliError::UnsupportedScheme(scheme) if scheme == "(none)"));
        let error = backend_of("host=db user=app password=s3:cr3t").unwrap_err();
        assert!(matches!(&error, CliError::UnsupportedScheme(scheme) if scheme == "(none)"));
        assert!(!error.to_string().contains("s3"), "{error}");
    }
}
