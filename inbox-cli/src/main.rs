//! `inbox`: the operator's command for an inbox database. It applies the schema, shows what
//! the inbox holds, replays or discards dead letters and rejected deliveries, shows and discards
//! conflicts, skips strict-ordering gaps, purges old dedup rows and lists or retries outbox
//! messages, on PostgreSQL, MySQL or SQLite, as tables or as JSON (`--json`). What an operator
//! does is kept, with who, why and what came of it.
//!
//! Replays and skipped gaps are requests: the running consumer, which owns the handler code,
//! carries them out on its next sweep.

mod cli;
mod commands;
mod consumer;
mod database;
mod error;
mod output;
mod prompt;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::error::exit;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    match commands::execute(cli).await {
        Ok(()) => ExitCode::from(exit::OK),
        Err(error) => {
            eprintln!("error: {error}");
            match error.detail() {
                Some(detail) if verbose => eprintln!("detail: {detail}"),
                Some(_) => eprintln!("hint: --verbose prints the database's own message"),
                None => {}
            }
            ExitCode::from(error.exit_code())
        }
    }
}
