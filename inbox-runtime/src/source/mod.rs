//! Where deliveries come from: a [`Source`] yields [`Delivery`]s, each acknowledged only after its
//! handlers committed, or handed back for redelivery.

mod memory;

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use inbox_core::Envelope;

pub use memory::{MemoryBroker, MemorySource};

/// An error of the transport.
pub type SourceError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A stream of deliveries from a broker.
pub trait Source: Send + 'static {
    /// The next delivery; `Ok(None)` when the source has ended.
    fn next(&mut self) -> impl Future<Output = Result<Option<Delivery>, SourceError>> + Send;
}

/// Settles one delivery with its broker.
pub trait Acknowledge: Send + 'static {
    /// The delivery was handled and committed: the broker may forget it.
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>>;
    /// The delivery was not handled: the broker should deliver it again, not before `delay` where
    /// it can (brokers without delayed redelivery redeliver when they redeliver).
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>>;
}

/// One message handed over by a source, with the means to settle it.
pub struct Delivery {
    envelope: Envelope,
    attempt: u32,
    acker: Box<dyn Acknowledge>,
}

impl Delivery {
    /// A delivery of `envelope`, the `attempt`-th time (1 for the first), settled by `acker`.
    pub fn new(envelope: Envelope, attempt: u32, acker: Box<dyn Acknowledge>) -> Self {
        Self {
            envelope,
            attempt,
            acker,
        }
    }

    /// The delivered message.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// How many times the broker has delivered this message, this time included.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The envelope, the delivery count and the means to settle, apart.
    pub(crate) fn into_parts(self) -> (Envelope, u32, Box<dyn Acknowledge>) {
        (self.envelope, self.attempt, self.acker)
    }

    /// Acknowledges the delivery.
    pub async fn ack(self) -> Result<(), SourceError> {
        self.acker.ack().await
    }

    /// Hands the delivery back for redelivery, not before `delay`.
    pub async fn nack(self, delay: Duration) -> Result<(), SourceError> {
        self.acker.nack(delay).await
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("envelope", &self.envelope)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}
