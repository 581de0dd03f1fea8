//! The commands, written once for every backend: [`execute`] connects to the database the URL
//! names and hands its pool to [`run`], which is generic over [`Backend`].

mod conflicts;
mod dead;
mod gap;
mod outbox;
mod parked;
mod purge;
mod rejected;
mod schema;
mod status;

use inbox_core::Backend;
use sqlx::Pool;

use crate::cli::{Cli, Command, DatabaseCommand};
use crate::database::{self, Database};
use crate::error::CliError;
use crate::output::Output;

/// Runs the command `cli` names.
pub async fn execute(cli: Cli) -> Result<(), CliError> {
    let out = Output::new(cli.json);
    let url = cli.database_url.as_deref();
    let command = match cli.command {
        Command::Schema { backend } => return schema::print(backend, url, &out),
        Command::Database(command) => command,
    };
    let creates_file = matches!(command, DatabaseCommand::Migrate);
    match database::connect(url, creates_file).await? {
        Database::Postgres(pool) => run(pool, command, &out).await,
        Database::Sqlite(pool) => run(pool, command, &out).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => run(pool, command, &out).await,
    }
}

/// Runs `command` on `pool`, then closes the pool (which, on SQLite, checkpoints the log).
async fn run<DB: Backend>(
    pool: Pool<DB>,
    command: DatabaseCommand,
    out: &Output,
) -> Result<(), CliError> {
    let result = dispatch(&pool, command, out).await;
    pool.close().await;
    result
}

/// Checks the schema (every command but `migrate` needs it), then runs `command`.
async fn dispatch<DB: Backend>(
    pool: &Pool<DB>,
    command: DatabaseCommand,
    out: &Output,
) -> Result<(), CliError> {
    if !matches!(command, DatabaseCommand::Migrate) {
        database::check_schema(pool).await?;
    }
    match command {
        DatabaseCommand::Migrate => schema::migrate(pool, out).await,
        DatabaseCommand::Status => status::show(pool, out).await,
        DatabaseCommand::Show(args) => {
            dead::show(pool, args.consumer.consumer, &args.message, out).await
        }
        DatabaseCommand::Dead(args) => dead::run(pool, args, out).await,
        DatabaseCommand::Parked(args) => parked::run(pool, args, out).await,
        DatabaseCommand::Rejected(args) => rejected::run(pool, args, out).await,
        DatabaseCommand::Conflicts(args) => conflicts::run(pool, args, out).await,
        DatabaseCommand::Gap(args) => gap::run(pool, args, out).await,
        DatabaseCommand::Purge(args) => purge::run(pool, args, out).await,
        DatabaseCommand::Outbox(command) => outbox::run(pool, command, out).await,
    }
}
