//! Testing handlers without a broker: an inbox database in memory, the guarded call on it, and
//! what the inbox kept. For a handler that takes `&mut Context`, called as a plain function,
//! build the context with [`Context::new`](inbox_core::Context::new).
//!
//! ```
//! use inbox::prelude::*;
//! use inbox::testing::Harness;
//!
//! #[derive(Debug, Clone, Serialize, Deserialize, Message)]
//! struct OrderPaid { event_id: u64, order_id: String, sequence: i64 }
//!
//! #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id", ordering = "strict")]
//! async fn mark_paid(tx: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), HandlerError> {
//!     sqlx::query("INSERT INTO paid (order_id, sequence) VALUES ($1, $2)")
//!         .bind(msg.order_id).bind(msg.sequence).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let inbox = Harness::sqlite().await?;
//! sqlx::query("CREATE TABLE paid (order_id TEXT, sequence INTEGER)").execute(inbox.pool()).await?;
//! let paid = |event_id, sequence| OrderPaid { event_id, order_id: "o-1".into(), sequence };
//!
//! let outcomes = inbox.deliver_all(&mark_paid, [paid(2, 2), paid(1, 1), paid(1, 1)]).await?;
//!
//! assert_eq!(outcomes, [Outcome::Parked, Outcome::Processed, Outcome::Duplicate]);
//! assert!(inbox.parked().await?.is_empty(), "sequence 2 was released after 1");
//! # Ok(()) }
//! ```

use inbox_core::storage::operators;
use inbox_core::{
    Backend, DEFAULT_CONSUMER, Error, Handler, MessageStatus, Outcome, Process, StoredMessage,
};
use sqlx::Pool;

/// An inbox database for tests, on which handlers run guarded, as [`Process::process`] runs
/// them, for the [`DEFAULT_CONSUMER`].
#[derive(Debug, Clone)]
pub struct Harness<DB: Backend> {
    pool: Pool<DB>,
}

#[cfg(feature = "sqlite")]
impl Harness<sqlx::Sqlite> {
    /// A fresh, migrated SQLite database in memory. Its pool holds one connection, so every call
    /// sees the same database; it disappears with the pool.
    pub async fn sqlite() -> Result<Self, Error> {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(inbox_core::sqlite_options("sqlite::memory:")?)
            .await?;
        Self::new(pool).await
    }
}

impl<DB: Backend> Harness<DB> {
    /// A harness on `pool` (a `#[sqlx::test]` pool, say), after applying the inbox schema.
    pub async fn new(pool: Pool<DB>) -> Result<Self, Error> {
        inbox_core::migrate(&pool).await?;
        Ok(Self { pool })
    }

    /// The database, for the test's own tables and queries.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Delivers `message` to `handler` once, guarded: its outcome, or the handler's failure
    /// (recorded, as a runtime would record it).
    pub async fn deliver<H: Handler<DB>>(
        &self,
        handler: &H,
        message: H::Message,
    ) -> Result<Outcome, Error> {
        handler.process(&self.pool, message).await
    }

    /// Delivers each message in turn, as a broker would (duplicates and reordering included):
    /// their outcomes, or the first failure.
    pub async fn deliver_all<H: Handler<DB>>(
        &self,
        handler: &H,
        messages: impl IntoIterator<Item = H::Message>,
    ) -> Result<Vec<Outcome>, Error> {
        let mut outcomes = Vec::new();
        for message in messages {
            outcomes.push(self.deliver(handler, message).await?);
        }
        Ok(outcomes)
    }

    /// The messages kept dead: their attempts, errors and payloads.
    pub async fn dead(&self) -> Result<Vec<StoredMessage>, Error> {
        self.kept(MessageStatus::Dead).await
    }

    /// The messages parked behind a gap (strict ordering).
    pub async fn parked(&self) -> Result<Vec<StoredMessage>, Error> {
        self.kept(MessageStatus::Parked).await
    }

    /// The failed messages whose retry is pending.
    pub async fn failed(&self) -> Result<Vec<StoredMessage>, Error> {
        self.kept(MessageStatus::Failed).await
    }

    async fn kept(&self, status: MessageStatus) -> Result<Vec<StoredMessage>, Error> {
        Ok(operators::list(&self.pool, DEFAULT_CONSUMER, status).await?)
    }
}
