//! Runtime of the `inbox` framework: a registry of handlers by message type, dispatch of
//! envelopes, and workers that consume a [`Source`] with per-aggregate ordering, acknowledging each
//! delivery only after its transaction committed.
#![warn(missing_docs)]

mod batch;
mod builder;
mod hand_backs;
mod health;
mod inbox;
mod keep_alive;
mod registry;
pub mod relay;
mod route;
mod schedule;
mod source;
pub mod testing;
mod worker;

pub use batch::Batch;
pub use builder::{DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_SWEEP_INTERVAL, InboxBuilder};
pub use health::{Health, SOURCE_FAILING_LIMIT, SourceHealth};
pub use inbox::{Inbox, RunError, RunReport, UnknownTypes};
pub use inbox_core::storage::health::Backlog;
pub use registry::BuildError;
pub use route::{Dispatched, Handled};
#[cfg(feature = "amqp")]
pub use source::amqp;
#[cfg(feature = "kafka")]
pub use source::kafka;
#[cfg(feature = "nats")]
pub use source::nats;
#[cfg(feature = "postgres-queue")]
pub use source::postgres_queue;
#[cfg(feature = "redis")]
pub use source::redis;
pub use source::{
    Acknowledge, Delivery, HeaderNames, MemoryBroker, MemorySource, Sink, SinkError, Source,
    SourceError,
};
