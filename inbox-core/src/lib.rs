//! Core of the `inbox` framework: the message model, the guard and its storage.
//!
//! Most users depend on the `inbox` facade crate instead, which re-exports this one. The
//! examples of what it re-exports are written as its users write them, `use inbox::RetryPolicy;`:
//! with this crate alone, that is `use inbox_core::RetryPolicy;`.
#![warn(missing_docs)]

pub mod batch;
mod connection;
mod context;
mod envelope;
mod error;
mod guard;
mod handler;
mod identity;
mod keys;
mod message;
mod numbers;
pub mod outbox;
mod outcome;
mod process;
pub mod queue;
mod retention;
mod retry;
mod state;
mod status;
pub mod storage;
mod text;
pub mod trace_context;

pub use connection::{Connect, KeptConnection};
pub use context::{Context, DatabaseHandle};
pub use envelope::Envelope;
#[doc(hidden)]
pub use error::classify;
pub use error::{Error, HandlerError, Permanence};
pub use guard::{
    ExpiredGap, Guarded, RELEASES_PER_MESSAGE, Received, discard, expire_gaps, message_span,
    open_gap, process, process_in, release, replay, request_replay, resume, retry_due, skip_gap,
};
pub use handler::{DEFAULT_CONSUMER, DEFAULT_GAP_TIMEOUT, Handler, HandlerResult};
pub use identity::{Identity, MAX_ID_LEN, MAX_SEQUENCE};
pub use keys::{
    Claim, DeadReason, Failure, Headers, MessageKey, MessageStatus, Ordering, Resolution, Stream,
};
pub use message::{Identifier, Message, SequenceNumber};
pub use outcome::Outcome;
pub use process::Process;
pub use retention::{PurgeReport, Retention, purge, purge_preview};
pub use retry::{DEFAULT_ATTEMPT_TIMEOUT, RetryPolicy};
pub use state::{FromRef, IntoHandler, State, Stateful, Stateless};
pub use status::{Status, status};
pub use storage::messages::{Claimed, Seen, StoredPayload};
pub use storage::operators::{DeadLetterFilter, HandlerStatus, RejectedDelivery, StoredMessage};
pub use storage::purge::{PurgeLeader, PurgePreview};
#[cfg(feature = "sqlite")]
pub use storage::sqlite_options;
pub use storage::streams::ParkedMessage;
pub use storage::{Backend, MIGRATIONS_TABLE};
pub use text::storable_text;

/// Applies the inbox schema to the database behind `pool` (idempotent; migrations are tracked in
/// their own table, [`MIGRATIONS_TABLE`], apart from the application's).
pub async fn migrate<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<(), Error> {
    Ok(storage::schema::migrate(pool).await?)
}

/// The inbox schema for `DB` as plain DDL, for teams that run their own migrations.
///
/// ```
/// # use inbox_core as inbox;
/// let ddl = inbox::schema::<sqlx::Postgres>();
/// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS inbox_messages"));
/// ```
pub fn schema<DB: Backend>() -> &'static str {
    DB::schema_sql()
}
