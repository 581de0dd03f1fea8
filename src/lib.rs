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
//! ## Running an inbox
//!
//! The runtime registers handlers by message type on [`Inbox::builder`], consumes a [`Source`]
//! with workers (the messages of one aggregate one at a time, in delivery order), and
//! acknowledges each delivery only once its transaction committed. [`Inbox::run`] returns when
//! the source ends, with a [`RunReport`] of what it did; [`Inbox::run_until`] also stops on a
//! shutdown signal, finishing and acknowledging what it already pulled.
//!
//! ```
//! use inbox::prelude::*;
//! use inbox::{MemoryBroker, Permanence};
//!
//! #[derive(Debug, Clone, Serialize, Deserialize, Message)]
//! #[message(name = "order.paid")]
//! struct OrderPaid { event_id: Uuid, order_id: String, sequence: i64, amount: i64 }
//!
//! #[derive(Debug, thiserror::Error)]
//! enum ShopError {
//!     #[error("order {0} does not exist")]
//!     UnknownOrder(String),
//!     #[error(transparent)]
//!     Database(#[from] sqlx::Error),
//! }
//!
//! // No retry creates a missing order: that message is dead at its first attempt. A database
//! // error is transient (the default), retried under the handler's retry policy.
//! impl Permanence for ShopError {
//!     fn is_permanent(&self) -> bool { matches!(self, ShopError::UnknownOrder(_)) }
//! }
//!
//! #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
//! async fn mark_paid(tx: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), ShopError> {
//!     let paid = sqlx::query("UPDATE orders SET paid = paid + $1 WHERE id = $2")
//!         .bind(msg.amount).bind(&msg.order_id).execute(&mut *tx).await?;
//!     if paid.rows_affected() == 0 {
//!         return Err(ShopError::UnknownOrder(msg.order_id));
//!     }
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
//! let inbox = Inbox::builder(pool.clone())
//!     .consumer("billing")                              // dedup and ordering are per consumer group
//!     .handler(mark_paid)
//!     .retry_for(mark_paid, RetryPolicy::new(5))        // the handler itself, not its name
//!     .build()
//!     .await?;
//!
//! // The in-memory broker delivers at least once, as a real one does: the payment for o-1
//! // comes twice. The payment for o-9 names an order that does not exist.
//! let paid = |order: &str| OrderPaid {
//!     event_id: Uuid::new_v4(), order_id: order.into(), sequence: 1, amount: 30,
//! };
//! let (first, unknown) = (paid("o-1"), paid("o-9"));
//! let broker = MemoryBroker::new();
//! broker.publish(Envelope::encode("delivery-1", &first)?);
//! broker.publish(Envelope::encode("delivery-2", &first)?);   // the same event_id: a duplicate
//! broker.publish(Envelope::encode("delivery-3", &unknown)?);
//! broker.close();                                      // its source ends once all is settled
//!
//! let report = inbox.run(broker.source()).await?;
//! assert_eq!(report.deliveries, 3);
//! assert_eq!(report.acked, 3);                         // dead is settled too: the inbox keeps it
//! assert_eq!(report.handler_calls_with(Outcome::Processed), 1);
//! assert_eq!(report.handler_calls_with(Outcome::Duplicate), 1);
//! assert_eq!(report.handler_calls_with(Outcome::Dead), 1);
//!
//! let dead = inbox.dead().await?;                      // kept with its payload and error, for replay
//! assert_eq!(dead[0].error_text.as_deref(), Some("order o-9 does not exist"));
//! let paid: i64 = sqlx::query_scalar("SELECT paid FROM orders WHERE id = 'o-1'").fetch_one(&pool).await?;
//! assert_eq!(paid, 30);
//! # Ok(()) }
//! ```
//!
//! A service runs until it is told to stop:
//! `inbox.run_until(source, async { tokio::signal::ctrl_c().await.ok(); }).await?`.
//! [`MemoryBroker`] is in-process, for tests and examples. The brokers are modules behind cargo
//! features, each a source (and a sink for the outbox) built from its client's own types:
//! `inbox::nats` (NATS JetStream, feature `nats`), `inbox::amqp` (RabbitMQ, `amqp`),
//! `inbox::redis` (Redis Streams, `redis`), `inbox::kafka` (Kafka, `kafka`) and
//! `inbox::postgres_queue` (a queue table in PostgreSQL, no broker, `postgres-queue`).
//!
//! ## Errors
//!
//! A handler returns `Result<(), E>`. `E` is [`HandlerError`], into which `?` converts any error;
//! `anyhow::Error` (a handler may return `anyhow::Result<()>`); or an error type of the
//! application's own, which implements [`Permanence`] to say which of its values no retry can fix,
//! as `ShopError` does above. A permanent error makes the message dead at once
//! ([`HandlerError::permanent`] marks one by hand); every other error is retried under the
//! handler's [`RetryPolicy`] ([`InboxBuilder::retry`] for all handlers,
//! [`InboxBuilder::retry_for`] for one), and the message is dead once its attempts run out. A dead
//! message is kept with its payload and errors until an operator replays or discards it
//! ([`Inbox::replay`], `inbox dead replay`).
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
//! Monotonic ordering, the default, skips a late event as stale: right for a status or a
//! snapshot, where only the newest event counts, and wrong for a ledger, which would lose the
//! late payment. Strict ordering parks an event that comes ahead of its predecessor and applies
//! it once the gap fills. `cargo run --example quickstart` delivers the same shuffled,
//! re-sent payments under both and prints what each made of them, and why.
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

#[cfg(feature = "sqlite")]
pub use inbox_core::sqlite_options;
pub use inbox_core::storage;
pub use inbox_core::{
    Backend, Context, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONSUMER, DEFAULT_GAP_TIMEOUT,
    DatabaseHandle, DeadLetterFilter, DeadReason, Envelope, Error, ExpiredGap, FromRef, Handler,
    HandlerError, HandlerResult, HandlerStatus, Headers, Identifier, Identity, IntoHandler,
    MAX_ID_LEN, MAX_SEQUENCE, MIGRATIONS_TABLE, Message, MessageKey, MessageStatus, Ordering,
    Outcome, Permanence, Process, PurgeLeader, PurgePreview, PurgeReport, RELEASES_PER_MESSAGE,
    RejectedDelivery, Retention, RetryPolicy, SequenceNumber, State, Stateful, Stateless, Status,
    StoredMessage, Stream, migrate, open_gap, purge, purge_preview, request_replay, schema, status,
};
pub use inbox_macros::{Message, inbox_handler};
pub use inbox_runtime::relay::Outbox;
pub use inbox_runtime::*;

/// The outbox: what a transaction publishes commits with it.
///
/// [`publish`](outbox::publish) writes a message to the outbox table in the caller's
/// transaction (a handler's [`Context::publish`] does the same in the guarded one): a rollback
/// publishes nothing, a commit publishes it at least once. A [`Relay`](outbox::Relay) publishes
/// what committed through a [`Sink`] (every broker module has one), in order per aggregate, under
/// the outbox id as the envelope id, so that the inbox on the other side drops what a relay may
/// publish twice.
///
/// ```
/// use inbox::prelude::*;
/// use inbox::{MemoryBroker, outbox};
///
/// #[derive(Debug, Clone, Serialize, Deserialize, Message)]
/// #[message(name = "order.placed", aggregate = "order_id")]     // published in order per order
/// struct OrderPlaced { order_id: String }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// inbox::migrate(&pool).await?;
/// let placed = OrderPlaced { order_id: "o-1".into() };
///
/// let mut tx = pool.begin().await?;
/// // ... the application's own writes ...
/// outbox::publish(&mut *tx, &placed).await?;
/// tx.rollback().await?;                                // nothing was published
///
/// let mut tx = pool.begin().await?;
/// let id = outbox::publish(&mut *tx, &placed).await?;     // the envelope id it is published under
/// tx.commit().await?;
///
/// let broker = MemoryBroker::new();
/// let relay = outbox::Relay::new(pool, broker.clone());
/// assert_eq!(relay.publish_batch().await?.published, 1);
/// assert_eq!(broker.queued(), 1);
/// # Ok(()) }
/// ```
pub mod outbox {
    pub use inbox_core::outbox::*;
    pub use inbox_runtime::relay::{Outbox, Relay, RelayBatch, RelayReport, Route};
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

/// The examples of `inbox-core` and `inbox-runtime` cannot name this crate, yet they are shown on
/// its pages: they are written with its paths (`use inbox::RetryPolicy;`), and compiled there
/// against a stand-in. These are those paths, compiled against this crate.
///
/// ```
/// use inbox::outbox::{OutboxStatus, Outgoing};
/// use inbox::{Error, FromRef, HandlerError, Identity, MessageStatus, Permanence, Retention, RetryPolicy};
/// let _ = inbox::schema::<sqlx::Sqlite>;
/// ```
#[cfg(doctest)]
pub struct ExamplePaths;

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
