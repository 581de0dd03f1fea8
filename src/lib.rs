//! # inbox
//!
//! Effectively-once message handlers. Brokers deliver at least once; `inbox` wraps a plain
//! `async fn` in one database transaction that records the message's identity under a unique
//! constraint, guards per-aggregate ordering with a sequence number, runs the handler's own writes,
//! and commits before the delivery is acknowledged. Duplicates become harmless and stale events are
//! skipped.
//!
//! ```
//! use inbox::prelude::*;
//!
//! #[derive(Debug, Clone, Serialize, Deserialize, Message)]
//! #[message(name = "order.paid")]
//! struct OrderPaid { event_id: Uuid, order_id: String, sequence: i64, amount: i64 }
//!
//! #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
//! async fn mark_paid(tx: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), HandlerError> {
//!     sqlx::query("UPDATE orders SET paid = paid + $1 WHERE id = $2")
//!         .bind(msg.amount).bind(msg.order_id).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! inbox::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, paid INTEGER NOT NULL)").execute(&pool).await?;
//! sqlx::query("INSERT INTO orders VALUES ('o-1', 0)").execute(&pool).await?;
//!
//! let paid = OrderPaid { event_id: Uuid::new_v4(), order_id: "o-1".into(), sequence: 1, amount: 30 };
//! assert_eq!(mark_paid.process(&pool, paid.clone()).await?, Outcome::Processed);
//! assert_eq!(mark_paid.process(&pool, paid).await?, Outcome::Duplicate);
//!
//! let paid: i64 = sqlx::query_scalar("SELECT paid FROM orders").fetch_one(&pool).await?;
//! assert_eq!(paid, 30);
//! # Ok(()) }
//! ```
//!
//! ## `#[inbox_handler(...)]`
//!
//! | argument | meaning |
//! | --- | --- |
//! | `key = "field"` or `key = ["a", "b"]` (required) | the dedup identity, read from the message's fields |
//! | `sequence = "field"` | an integer field; per aggregate, a message whose sequence is not newer than the last applied one is skipped as [`Outcome::Stale`] |
//! | `aggregate = "field"` | the ordering stream, and the unit of serialization: handlers of one aggregate never run concurrently |
//! | `ordering = "monotonic"` | the default: newer sequences apply, gaps are allowed, older ones are [`Outcome::Stale`] |
//! | `ordering = "strict"` | sequences apply contiguously from 1: a message ahead of its predecessor is [`Outcome::Parked`] and applied, in order, when the gap fills ([`Outcome::Released`]) |
//! | `gap_timeout = "15m"` | strict only: how long a parked message waits before it is marked dead ([`DEFAULT_GAP_TIMEOUT`] if unset) |
//! | `name = "..."` | the handler's stable dedup scope; default: the function's name. **Renaming the function without setting `name` starts a new scope, in which every message is new again.** |
//! | `crate = "path"` | where generated code finds this crate, for re-exporting crates |
//!
//! ## Strict ordering
//!
//! ```
//! use inbox::prelude::*;
//!
//! #[derive(Debug, Clone, Serialize, Deserialize, Message)]
//! struct Deposited { event_id: u64, account: String, version: i64, amount: i64 }
//!
//! #[inbox_handler(key = "event_id", sequence = "version", aggregate = "account", ordering = "strict")]
//! async fn deposit(tx: &mut sqlx::SqliteConnection, msg: Deposited) -> Result<(), HandlerError> {
//!     sqlx::query("INSERT INTO history (account, version) VALUES ($1, $2)")
//!         .bind(msg.account).bind(msg.version).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! inbox::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE history (account TEXT, version INTEGER)").execute(&pool).await?;
//! let event = |event_id, version| Deposited { event_id, account: "a-1".into(), version, amount: 5 };
//!
//! // Version 2 arrives first: it waits, durably, for version 1.
//! assert_eq!(deposit.process(&pool, event(20, 2)).await?, Outcome::Parked);
//! // Version 1 applies, then releases version 2 in its own transaction.
//! assert_eq!(deposit.process(&pool, event(10, 1)).await?, Outcome::Processed);
//!
//! let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM history").fetch_all(&pool).await?;
//! assert_eq!(versions, [1, 2]);
//! # Ok(()) }
//! ```
//!
//! ## State
//!
//! A handler can take the application's state (an HTTP client, configuration, a cache) as a
//! [`State<T>`] parameter between its database handle and its message. The state is registered on
//! the builder, before the handlers that take it; a handler whose state the builder does not have
//! does not compile. [`FromRef`] hands a handler one part of a larger state.
//!
//! ```
//! use inbox::prelude::*;
//!
//! #[derive(Clone)]
//! struct Shop { vat_percent: i64 }
//!
//! #[derive(Debug, Clone, Serialize, Deserialize, Message)]
//! struct OrderPaid { event_id: u64, amount: i64 }
//!
//! #[inbox_handler(key = "event_id")]
//! async fn book_vat(tx: &mut sqlx::SqliteConnection, State(shop): State<Shop>, msg: OrderPaid) -> Result<(), HandlerError> {
//!     let vat = msg.amount * shop.vat_percent / 100;
//!     sqlx::query("INSERT INTO vat (amount) VALUES ($1)").bind(vat).execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! inbox::migrate(&pool).await?;
//! sqlx::query("CREATE TABLE vat (amount INTEGER)").execute(&pool).await?;
//!
//! // With the runtime: the state first, then the handlers that take it.
//! let inbox = Inbox::builder(pool.clone()).state(Shop { vat_percent: 20 }).handler(book_vat).build().await?;
//!
//! // Without it, bound to its state, it is a plain handler.
//! let bound = book_vat.with_state(Shop { vat_percent: 20 });
//! assert_eq!(bound.process(&pool, OrderPaid { event_id: 1, amount: 50 }).await?, Outcome::Processed);
//! let vat: i64 = sqlx::query_scalar("SELECT amount FROM vat").fetch_one(&pool).await?;
//! assert_eq!(vat, 10);
//! # drop(inbox);
//! # Ok(()) }
//! ```
//!
//! The first parameter names the database: `&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection`,
//! `&mut sqlx::MySqlConnection` (feature `mysql`),
//! `&mut sqlx::Transaction<'_, DB>` or `&mut inbox::Context<'_, DB>` (the transaction plus the
//! message's metadata). A handler may also take only the message. The annotated name stays callable
//! as the plain, unguarded function for unit tests, and is a value implementing [`Handler`] for
//! [`Process::process`] and [`Inbox::builder`].
#![warn(missing_docs)]

pub use inbox_core::storage;
pub use inbox_core::{
    Backend, Context, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONSUMER, DEFAULT_GAP_TIMEOUT,
    DatabaseHandle, DeadLetterFilter, DeadReason, Envelope, Error, ExpiredGap, FromRef, Handler,
    HandlerError, HandlerResult, HandlerStatus, Headers, Identifier, Identity, IntoHandler,
    MAX_ID_LEN, MAX_SEQUENCE, MIGRATIONS_TABLE, Message, MessageKey, MessageStatus, Ordering,
    Outcome, Permanence, Process, PurgeLeader, PurgePreview, PurgeReport, RELEASES_PER_MESSAGE,
    RejectedDelivery, Retention, RetryPolicy, SequenceNumber, State, Stateful, Stateless, Status,
    StoredMessage, Stream, migrate, open_gap, purge, purge_preview, request_replay, schema,
    sqlite_options, status,
};
pub use inbox_macros::{Message, inbox_handler};
pub use inbox_runtime::*;

/// The outbox: [`outbox::publish`] writes a message in a transaction, a [`outbox::Relay`]
/// publishes what committed through a [`Sink`].
pub mod outbox {
    pub use inbox_core::outbox::*;
    pub use inbox_runtime::relay::{Relay, RelayBatch, RelayReport, Route};
}

/// Everything a handler module needs: `use inbox::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Context, Envelope, Handler, HandlerError, Inbox, Message, Outcome, Process, RetryPolicy,
        State, inbox_handler,
    };
    pub use serde::{Deserialize, Serialize};
    pub use uuid::Uuid;
}

/// Items the macros' generated code names. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;
    pub use inbox_core::classify;
    pub use inbox_core::{
        Backend, Context, DEFAULT_GAP_TIMEOUT, DatabaseHandle, Error, Handler, HandlerError,
        HandlerResult, Identifier, Identity, IntoHandler, Message, Ordering, SequenceNumber,
    };
    pub use inbox_core::{FromRef, State, Stateful};

    /// A handler's own clone of its state, which must be `Clone + Send + Sync + 'static`.
    pub fn clone_state<T: Clone + Send + Sync + 'static>(state: &T) -> T {
        state.clone()
    }
    pub use sqlx::Connection;
    pub use std::borrow::Cow;
}
