//! The command line: what an operator can type, with the help text it shows.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use inbox_core::Retention;
use inbox_core::outbox::OutboxStatus;

/// The exit codes, as `--help` shows them (the constants are in `error::exit`).
const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  the operation failed (database error, unreachable database)
  2  usage error (bad arguments or duration, missing or unsupported database URL, several
     consumers hold what the command names: pass --consumer)
  3  the inbox schema is missing (run `inbox migrate`) or lacks a unique key (the message names
     it, and the statement that adds it)
  4  not found (no such message, not dead, no gap to skip, not a failed outbox message)
  5  aborted at the confirmation prompt
  6  busy: another instance is purging, nothing was deleted (try again later)";

/// Operate an inbox database: apply its schema, see what it holds, replay or discard dead
/// letters and rejected deliveries, see conflicts, skip strict-ordering gaps, purge old dedup
/// rows, and list or retry outbox messages.
#[derive(Debug, Parser)]
#[command(name = "inbox", version, after_long_help = EXIT_CODES)]
pub struct Cli {
    /// The database: postgres://user@host/db, mysql://user@host/db or sqlite://path/to/file.db
    ///
    /// For a PostgreSQL schema outside the default search path, add
    /// `?options=-c%20search_path%3Dmy_schema` to the URL, or set
    /// PGOPTIONS="-c search_path=my_schema".
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// On a database error, print the database's own message too (the error's sentence leaves
    /// it out: it can hold the server's internals).
    #[arg(long, short, global = true)]
    pub verbose: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The commands that work on a database.
    #[command(flatten)]
    Database(DatabaseCommand),
    /// Print the schema as plain DDL, for teams that run their own migrations (no connection).
    Schema {
        /// Which database's DDL (default: the one the database URL names).
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
    },
}

/// The commands that connect to the database.
#[derive(Debug, Subcommand)]
pub enum DatabaseCommand {
    /// Apply the inbox schema (idempotent; creates a SQLite file if it does not exist).
    Migrate,
    /// Counts by status per consumer and handler, rejected deliveries, conflicts, the outbox
    /// backlog and storage size.
    Status,
    /// Everything stored about one message, whatever its status: its payload and headers,
    /// errors, and what operators did about it.
    Show(ShowArgs),
    /// Dead letters: messages given up on after their last attempt or a permanent error.
    Dead(DeadArgs),
    /// Rejected deliveries: ones that could not be handled at all (no handler for their type,
    /// a payload that does not decode, an unusable id), kept with their exact bytes.
    Rejected(RejectedArgs),
    /// Conflicts: deliveries whose id was seen before with other content, kept (never applied)
    /// with their payload next to the stored message.
    Conflicts(ConflictsArgs),
    /// Messages parked by strict ordering, waiting for a predecessor.
    Parked(ParkedArgs),
    /// Strict-ordering gaps that will not fill.
    Gap(GapArgs),
    /// Delete processed and stale dedup rows older than a window (parked and dead ones are kept).
    Purge(PurgeArgs),
    /// The outbox: messages written in the application's transactions, for the relay to publish.
    #[command(subcommand)]
    Outbox(OutboxCommand),
}

/// A database the inbox runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL and MariaDB.
    #[cfg(feature = "mysql")]
    #[value(name = "mysql")]
    #[serde(rename = "mysql")]
    MySql,
}

/// The consumer group a command acts on.
#[derive(Debug, Args)]
pub struct ConsumerArg {
    /// The consumer group. Without it, a list shows every consumer's messages, and a command on
    /// one message or stream acts on the only consumer that has it.
    #[arg(long, env = "INBOX_CONSUMER", global = true)]
    pub consumer: Option<String>,
}

/// `inbox show ...`
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// The message named.
    #[command(flatten)]
    pub message: MessageArgs,
}

/// `inbox dead ...`
#[derive(Debug, Args)]
pub struct DeadArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// What to do with dead letters.
    #[command(subcommand)]
    pub command: DeadCommand,
}

/// The dead-letter commands.
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List the dead messages.
    List {
        /// Only this handler's.
        #[arg(long)]
        handler: Option<String>,
        /// Only messages of this type tag.
        #[arg(long = "type")]
        message_type: Option<String>,
        /// Only messages whose last failure is at most this old (e.g. 24h, 7d).
        #[arg(long, value_parser = humantime::parse_duration)]
        failed_within: Option<Duration>,
        /// One page of the list: at most this many messages of each consumer listed, in a
        /// stable order (handler, aggregate, sequence, id).
        #[command(flatten)]
        page: Page,
    },
    /// Show everything stored about one message, its payload included.
    Show(MessageArgs),
    /// Ask the running consumer to handle a dead message again, on its next sweep.
    Replay {
        /// The message named.
        #[command(flatten)]
        message: MessageArgs,
        /// Who replays it, and why.
        #[command(flatten)]
        decision: ReplayDecision,
    },
    /// Give up on a dead message for good (it is kept, with who and why, but never handled).
    Discard {
        /// The message named.
        #[command(flatten)]
        message: MessageArgs,
        /// Who discards it, and why.
        #[command(flatten)]
        decision: DiscardDecision,
    },
}

/// One page of a long list.
#[derive(Debug, Args)]
pub struct Page {
    /// At most this many rows.
    #[arg(long)]
    pub limit: Option<u32>,
    /// Skip the first this many rows (the pages before this one).
    #[arg(long, default_value_t = 0)]
    pub offset: u32,
}

/// Who replays something, and why.
#[derive(Debug, Args)]
pub struct ReplayDecision {
    /// Who does it.
    #[command(flatten)]
    pub operator: Operator,
    /// Why it is replayed.
    #[arg(long, default_value = "replayed with the inbox CLI")]
    pub reason: String,
}

/// Who gives something up for good, and why, once asked.
#[derive(Debug, Args)]
pub struct DiscardDecision {
    /// Who does it.
    #[command(flatten)]
    pub operator: Operator,
    /// Why it is discarded.
    #[arg(long, default_value = "discarded with the inbox CLI")]
    pub reason: String,
    /// Whether to ask first.
    #[command(flatten)]
    pub confirm: Confirm,
}

/// One stored message.
#[derive(Debug, Args)]
pub struct MessageArgs {
    /// The handler (its dedup scope).
    pub handler: String,
    /// The message's id (its dedup key).
    pub message_id: String,
}

/// The operator deciding what happens to a dead message, a gap or a rejected delivery.
#[derive(Debug, Args)]
pub struct Operator {
    /// Who decides, recorded with the message.
    #[arg(long, env = "USER", default_value = "inbox-cli")]
    pub by: String,
}

/// Skips the confirmation prompt of a destructive command.
#[derive(Debug, Args)]
pub struct Confirm {
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

/// `inbox rejected ...`
#[derive(Debug, Args)]
pub struct RejectedArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// What to do with rejected deliveries.
    #[command(subcommand)]
    pub command: RejectedCommand,
}

/// The rejected-delivery commands.
#[derive(Debug, Subcommand)]
pub enum RejectedCommand {
    /// List the rejected deliveries no operator has resolved: waiting, or whose replay was
    /// requested.
    List,
    /// Show everything kept about one rejected delivery: its payload, headers and reason, and
    /// what operators did about it.
    Show(RejectedId),
    /// Ask the running consumer to dispatch a rejected delivery again, exactly as it came, on its
    /// next sweep (once it has a handler for its type, say); refused again, it is back in the
    /// list with the new reason.
    Replay {
        /// The delivery named.
        #[command(flatten)]
        delivery: RejectedId,
        /// Who replays it, and why.
        #[command(flatten)]
        decision: ReplayDecision,
    },
    /// Give up on a rejected delivery for good (it is kept, with who and why, but never
    /// dispatched).
    Discard {
        /// The delivery named.
        #[command(flatten)]
        delivery: RejectedId,
        /// Who discards it, and why.
        #[command(flatten)]
        decision: DiscardDecision,
    },
}

/// One rejected delivery.
#[derive(Debug, Args)]
pub struct RejectedId {
    /// Its number, as `inbox rejected list` shows it.
    pub id: i64,
}

/// `inbox conflicts ...`
#[derive(Debug, Args)]
pub struct ConflictsArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// What to do with conflicts.
    #[command(subcommand)]
    pub command: ConflictsCommand,
}

/// The conflict commands.
#[derive(Debug, Subcommand)]
pub enum ConflictsCommand {
    /// List the conflicting deliveries waiting for an operator.
    List,
    /// Show one conflict: the conflicting delivery's payload and headers next to the stored
    /// message's payload (while the inbox keeps it).
    Show(ConflictId),
    /// Give up on a conflict: it is kept, with who and why, but no longer listed or counted
    /// (later deliveries of the same content are counted on it).
    Discard {
        /// The conflict named.
        #[command(flatten)]
        conflict: ConflictId,
        /// Who discards it, and why.
        #[command(flatten)]
        decision: DiscardDecision,
    },
}

/// One conflict.
#[derive(Debug, Args)]
pub struct ConflictId {
    /// Its number, as `inbox conflicts list` shows it.
    pub id: i64,
}

/// `inbox parked ...`
#[derive(Debug, Args)]
pub struct ParkedArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// What to do with parked messages.
    #[command(subcommand)]
    pub command: ParkedCommand,
}

/// The parked-message commands.
#[derive(Debug, Subcommand)]
pub enum ParkedCommand {
    /// List the parked messages.
    List,
}

/// `inbox gap ...`
#[derive(Debug, Args)]
pub struct GapArgs {
    /// The consumer group.
    #[command(flatten)]
    pub consumer: ConsumerArg,
    /// What to do with a gap.
    #[command(subcommand)]
    pub command: GapCommand,
}

/// The gap commands.
#[derive(Debug, Subcommand)]
pub enum GapCommand {
    /// Skip the gap in front of an aggregate's parked messages, for a predecessor known to be
    /// lost; the running consumer releases them on its next sweep.
    Skip {
        /// The handler.
        handler: String,
        /// The aggregate whose gap is skipped.
        aggregate: String,
        /// Who does it.
        #[command(flatten)]
        operator: Operator,
        /// Why the missing messages will never come (kept with who skipped the gap, and when).
        #[arg(long, default_value = "gap skipped with the inbox CLI")]
        reason: String,
        /// Whether to ask first.
        #[command(flatten)]
        confirm: Confirm,
    },
}

/// The window a dry run previews when `--older-than` is not given: a week, the window the
/// inbox's documentation starts from.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// `inbox purge ...`
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete rows handled (or resolved by an operator: discarded dead letters, rejected
    /// deliveries and conflicts) longer ago than this (e.g. 7d, 24h, 30m). Keep it longer than
    /// the broker's redelivery horizon, or a late redelivery would be handled twice. A purge
    /// needs it; a dry run without it previews the default window (7 days).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,
    /// Only report what would be deleted and kept.
    #[arg(long)]
    pub dry_run: bool,
    /// The most rows one batch (one short transaction) deletes.
    #[arg(long, default_value_t = Retention::DEFAULT_BATCH_SIZE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Whether to ask first.
    #[command(flatten)]
    pub confirm: Confirm,
}

/// The outbox commands.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// List outbox messages in the order they were written (by default, those not published
    /// yet: pending and failed).
    List {
        /// Only messages of this status.
        #[arg(long, value_enum)]
        status: Option<OutboxStatusArg>,
        /// The most messages to list.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Make failed messages pending again, their attempts counted from zero: the running relay
    /// publishes them in its next batch.
    Retry(OutboxRetryArgs),
}

/// Where an outbox message is, as `--status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutboxStatusArg {
    /// Waiting for the relay.
    Pending,
    /// Published and confirmed by the broker.
    Published,
    /// Given up on by the relay, waiting for an operator.
    Failed,
}

impl From<OutboxStatusArg> for OutboxStatus {
    fn from(status: OutboxStatusArg) -> Self {
        match status {
            OutboxStatusArg::Pending => OutboxStatus::Pending,
            OutboxStatusArg::Published => OutboxStatus::Published,
            OutboxStatusArg::Failed => OutboxStatus::Failed,
        }
    }
}

/// `inbox outbox retry`: one failed message, or every one.
#[derive(Debug, Args)]
pub struct OutboxRetryArgs {
    /// The id of the failed message.
    #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
    pub id: Option<String>,
    /// Retry every failed message (asks first).
    #[arg(long)]
    pub all_failed: bool,
    /// Whether to ask first (`--all-failed` only).
    #[command(flatten)]
    pub confirm: Confirm,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_long_help_lists_every_exit_code() {
        let help = Cli::command().render_long_help().to_string();
        for code in [
            exit::OK,
            exit::FAILED,
            exit::USAGE,
            exit::SCHEMA_MISSING,
            exit::NOT_FOUND,
            exit::ABORTED,
        ] {
            assert!(help.contains(&format!("\n  {code}  ")), "{help}");
        }
    }

    #[test]
    fn an_outbox_retry_names_one_message_or_every_failed_one() {
        let parses = |args: &[&str]| {
            Cli::try_parse_from([&["inbox", "outbox", "retry"], args].concat()).is_ok()
        };
        assert!(parses(&["m-1"]));
        assert!(parses(&["--all-failed", "--yes"]));
        assert!(!parses(&[]), "neither an id nor --all-failed");
        assert!(!parses(&["m-1", "--all-failed"]), "both");
    }
}
