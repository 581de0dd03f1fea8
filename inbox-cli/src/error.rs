//! What can go wrong in a command, and the exit code each failure maps to.

/// The exit codes of the `inbox` command; `--help` lists them too (see `cli::EXIT_CODES`).
pub mod exit {
    /// The command did what it was asked.
    pub const OK: u8 = 0;
    /// The operation failed: a database error, or the database could not be reached.
    pub const FAILED: u8 = 1;
    /// The command line is wrong: clap's own usage errors, an unsupported or missing database
    /// URL, a command that needs `--consumer` to say which consumer it means.
    pub const USAGE: u8 = 2;
    /// The database has no inbox schema (or an old one): run `inbox migrate`; or its tables lack
    /// a unique key the inbox relies on (the error names it).
    pub const SCHEMA_MISSING: u8 = 3;
    /// The message or stream named on the command line does not exist, or is not dead (or, in
    /// the outbox, not failed).
    pub const NOT_FOUND: u8 = 4;
    /// The operator declined the confirmation prompt; nothing was changed.
    pub const ABORTED: u8 = 5;
    /// Another instance holds the purge lock: nothing was deleted; a later run can purge.
    pub const BUSY: u8 = 6;
}

mod sentence;

use crate::consumer::{Searched, names};

/// A failed command, worded for the operator who ran it.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither `--database-url` nor `DATABASE_URL` was given.
    #[error(
        "no database given: pass --database-url or set DATABASE_URL \
         (postgres://..., mysql://... or sqlite://...)"
    )]
    MissingDatabaseUrl,

    /// The URL names a database the inbox does not run on.
    #[error(
        "unsupported database URL scheme `{0}`: the inbox runs on PostgreSQL (postgres:// or \
         postgresql://), MySQL and MariaDB (mysql:// or mariadb://) and SQLite (sqlite://)"
    )]
    UnsupportedScheme(String),

    /// The URL names MySQL, and this build of the command was made without it.
    #[cfg(not(feature = "mysql"))]
    #[error(
        "this `inbox` was built without MySQL: build it with `--features mysql` \
         (a default feature)"
    )]
    MySqlNotBuilt,

    /// The URL has a supported scheme but cannot be parsed.
    #[error("invalid database URL: {0}")]
    InvalidUrl(#[source] sqlx::Error),

    /// The SQLite file named by the URL does not exist (only `inbox migrate` creates one).
    #[error(
        "the SQLite database `{0}` does not exist: check the path, or create it with \
         `inbox migrate`"
    )]
    NoSuchDatabaseFile(String),

    /// The database could not be reached.
    #[error("cannot connect to the database {target}: {}", sentence::of(.source))]
    Connect {
        /// Where the database is, without credentials.
        target: String,
        /// Why the connection failed.
        source: sqlx::Error,
    },

    /// The inbox tables are missing, or older than this command.
    #[error("the inbox schema is missing or out of date in this database: run `inbox migrate`")]
    SchemaMissing(#[source] sqlx::Error),

    /// The inbox tables lack a unique key the inbox relies on.
    #[error("the inbox schema in this database is incomplete: {0}")]
    SchemaIncomplete(String),

    /// The schema could not be applied.
    #[error("could not apply the inbox schema: {}", migration(.0))]
    Migrate(#[source] sqlx::migrate::MigrateError),

    /// No message is stored under the given handler and id.
    #[error(
        "no message `{message_id}` of handler `{handler}` is stored {searched}: see \
         `inbox dead list`"
    )]
    NoSuchMessage {
        /// Where the command looked.
        searched: Searched,
        /// The handler named.
        handler: String,
        /// The message id named.
        message_id: String,
    },

    /// What the command names is held by several consumers, and `--consumer` did not say which.
    #[error(
        "{what} is held by several consumers ({}): pass --consumer to say which",
        names(.consumers)
    )]
    SeveralConsumers {
        /// What the command names.
        what: String,
        /// The consumers that hold it.
        consumers: Vec<String>,
    },

    /// The message exists but is not dead, so it cannot be replayed or discarded.
    #[error(
        "message `{message_id}` of handler `{handler}` is `{status}`, not dead: only dead messages \
         can be replayed or discarded"
    )]
    NotDead {
        /// The handler named.
        handler: String,
        /// The message id named.
        message_id: String,
        /// Its current status.
        status: String,
    },

    /// `gap skip` named a stream with nothing waiting on it.
    #[error(
        "handler `{handler}` has no parked or dead messages for aggregate `{aggregate}` \
         {searched}, so there is no gap to skip: see `inbox parked list`"
    )]
    NoGap {
        /// Where the command looked.
        searched: Searched,
        /// The handler named.
        handler: String,
        /// The aggregate named.
        aggregate: String,
    },

    /// No rejected delivery has the number named (for the consumer named, if one was).
    #[error(
        "no rejected delivery has number {id}{}: see `inbox rejected list`",
        .consumer.as_ref().map(|c| format!(" for consumer `{c}`")).unwrap_or_default()
    )]
    NoSuchRejected {
        /// The number named.
        id: i64,
        /// The consumer named, if one was.
        consumer: Option<String>,
    },

    /// No conflict has the number named (for the consumer named, if one was).
    #[error(
        "no conflict has number {id}{}: see `inbox conflicts list`",
        .consumer.as_ref().map(|c| format!(" for consumer `{c}`")).unwrap_or_default()
    )]
    NoSuchConflict {
        /// The number named.
        id: i64,
        /// The consumer named, if one was.
        consumer: Option<String>,
    },

    /// The conflict named was resolved already.
    #[error("conflict {0} is resolved already: see `inbox conflicts list`")]
    ConflictResolved(i64),

    /// The rejected delivery named is not in a state the command acts on.
    #[error("rejected delivery {id} is {state}: {what}")]
    RejectedNotWaiting {
        /// The number named.
        id: i64,
        /// Where it stands.
        state: inbox_core::storage::operators::RejectedState,
        /// What cannot be done.
        what: &'static str,
    },

    /// `outbox retry` named a message that is not a failed outbox message.
    #[error(
        "no failed outbox message `{0}`: it does not exist, or it is pending or published; only \
         a failed message can be retried (see `inbox outbox list --status failed`)"
    )]
    NoFailedOutboxMessage(String),

    /// A purge (not a dry run) was not told its window.
    #[error(
        "a purge deletes rows: pass --older-than with a window longer than the broker's \
         redelivery horizon (`inbox purge --dry-run` without it previews the default window, {})",
        humantime::format_duration(crate::cli::DEFAULT_WINDOW)
    )]
    WindowNeeded,

    /// Another instance is purging the same inbox, so this purge did nothing.
    #[error(
        "another instance is purging this inbox right now: nothing was deleted; try again later"
    )]
    PurgeBusy,

    /// The operator answered no (or nothing) at the confirmation prompt.
    #[error("aborted: nothing was changed")]
    Aborted,

    /// An inbox operation failed.
    #[error(transparent)]
    Inbox(inbox_core::Error),

    /// A database query failed.
    #[error("{}", sentence::of(.0))]
    Database(#[source] sqlx::Error),

    /// Writing the output or reading the prompt's answer failed.
    #[error("cannot use the terminal: {0}")]
    Io(#[from] std::io::Error),

    /// The JSON output could not be written.
    #[error("cannot write JSON output: {0}")]
    Json(#[from] serde_json::Error),
}

impl CliError {
    /// The process exit code for this failure (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::MissingDatabaseUrl | Self::UnsupportedScheme(_) | Self::InvalidUrl(_) => {
                exit::USAGE
            }
            #[cfg(not(feature = "mysql"))]
            Self::MySqlNotBuilt => exit::USAGE,
            Self::SchemaMissing(_) | Self::SchemaIncomplete(_) => exit::SCHEMA_MISSING,
            Self::Migrate(_) => exit::FAILED,
            Self::SeveralConsumers { .. } | Self::WindowNeeded => exit::USAGE,
            Self::NoSuchMessage { .. }
            | Self::NotDead { .. }
            | Self::NoGap { .. }
            | Self::NoSuchRejected { .. }
            | Self::NoSuchConflict { .. }
            | Self::ConflictResolved(_)
            | Self::RejectedNotWaiting { .. }
            | Self::NoFailedOutboxMessage(_) => exit::NOT_FOUND,
            Self::Inbox(inbox_core::Error::NotDead { .. }) => exit::NOT_FOUND,
            Self::Aborted => exit::ABORTED,
            Self::PurgeBusy => exit::BUSY,
            Self::NoSuchDatabaseFile(_)
            | Self::Connect { .. }
            | Self::Inbox(_)
            | Self::Database(_)
            | Self::Io(_)
            | Self::Json(_) => exit::FAILED,
        }
    }
}

impl CliError {
    /// What the database itself said, for `--verbose`: the server's message that the error's
    /// sentence leaves out.
    pub fn detail(&self) -> Option<String> {
        match self {
            Self::Connect { source, .. } | Self::SchemaMissing(source) | Self::Database(source) => {
                Some(source.to_string())
            }
            Self::Migrate(error) => Some(error.to_string()),
            _ => None,
        }
    }
}

/// A table or column the database lacks is a schema to migrate; any other refusal is a database
/// error.
impl From<sqlx::Error> for CliError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(refusal) if sentence::is_missing_schema(&**refusal) => {
                Self::SchemaMissing(error)
            }
            _ => Self::Database(error),
        }
    }
}

impl From<inbox_core::Error> for CliError {
    fn from(error: inbox_core::Error) -> Self {
        match error {
            inbox_core::Error::Database(error) => error.into(),
            inbox_core::Error::Migrate(error) => Self::Migrate(error),
            error => Self::Inbox(error),
        }
    }
}

/// Why a migration failed: the database's refusal as a sentence, or what sqlx found wrong with
/// the migrations already applied (a version missing or changed: no server internals there).
fn migration(error: &sqlx::migrate::MigrateError) -> String {
    match error {
        sqlx::migrate::MigrateError::Execute(error) => sentence::of(error),
        error => error.to_string(),
    }
}
