//! An in-process broker with at-least-once semantics, for tests and examples: a delivery that is
//! nacked, or dropped without being settled (a crash before the ack), is delivered again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use inbox_core::Envelope;
use tokio::sync::Notify;

use super::{Acknowledge, Delivery, Source, SourceError};

#[derive(Default)]
struct State {
    ready: VecDeque<(Envelope, u32)>,
    unsettled: usize,
    acked: u64,
    redelivered: u64,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave `State` half-updated: every update is a
        // single assignment or push.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state());
        self.changed.notify_waiters();
    }
}

/// An in-memory broker. Publish envelopes, hand [`MemoryBroker::source`] to
/// [`crate::Inbox::run`], and [`close`](MemoryBroker::close) it so the source ends once everything
/// published has been acknowledged.
///
/// ```
/// # use std::time::Duration;
/// # use inbox::{Envelope, MemoryBroker, Source};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let broker = MemoryBroker::new();
/// broker.publish(Envelope::new("ping", "d-1", b"{}".to_vec()));
/// broker.close();
///
/// let mut source = broker.source();
/// let delivery = source.next().await.unwrap().unwrap();
/// delivery.nack(Duration::ZERO).await.unwrap();         // handed back: delivered again
/// let again = source.next().await.unwrap().unwrap();
/// assert_eq!(again.attempt(), 2);
/// again.ack().await.unwrap();
/// assert!(source.next().await.unwrap().is_none());     // closed and all settled
/// assert_eq!(broker.acked(), 1);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBroker {
    shared: Arc<Shared>,
}

impl MemoryBroker {
    /// An empty, open broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Enqueues a message for delivery.
    pub fn publish(&self, envelope: Envelope) {
        self.shared
            .update(|state| state.ready.push_back((envelope, 1)));
    }

    /// No more messages will be published: sources end once every message has been acknowledged.
    pub fn close(&self) {
        self.shared.update(|state| state.closed = true);
    }

    /// A consumer of this broker. Several sources of one broker compete for its messages.
    pub fn source(&self) -> MemorySource {
        MemorySource {
            shared: Arc::clone(&self.shared),
        }
    }

    /// How many deliveries were acknowledged.
    pub fn acked(&self) -> u64 {
        self.shared.state().acked
    }

    /// How many deliveries were handed back (nacked or dropped unsettled) and queued again.
    pub fn redelivered(&self) -> u64 {
        self.shared.state().redelivered
    }

    /// How many messages wait for delivery.
    pub fn queued(&self) -> usize {
        self.shared.state().ready.len()
    }

    /// How many deliveries are out with a consumer, neither acknowledged nor handed back.
    pub fn in_flight(&self) -> usize {
        self.shared.state().unsettled
    }
}

/// Publishing to a memory broker enqueues the envelope, whatever the destination: the broker has
/// one queue.
impl super::Sink for MemoryBroker {
    fn publish<'a>(
        &'a self,
        _destination: &'a str,
        envelope: &'a Envelope,
    ) -> futures::future::BoxFuture<'a, Result<(), super::SinkError>> {
        MemoryBroker::publish(self, envelope.clone());
        Box::pin(async { Ok(()) })
    }
}

/// A consumer of a [`MemoryBroker`].
pub struct MemorySource {
    shared: Arc<Shared>,
}

impl MemorySource {
    fn try_next(&self) -> Option<Option<Delivery>> {
        let mut state = self.shared.state();
        if let Some((envelope, attempt)) = state.ready.pop_front() {
            state.unsettled += 1;
            let acker = MemoryAck {
                shared: Arc::clone(&self.shared),
                redelivery: Some((envelope.clone(), attempt + 1)),
            };
            return Some(Some(Delivery::new(envelope, attempt, Box::new(acker))));
        }
        (state.closed && state.unsettled == 0).then_some(None)
    }
}

impl Source for MemorySource {
    async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(next) = self.try_next() {
                return Ok(next);
            }
            changed.await;
        }
    }
}

/// Settles one delivery; if dropped unsettled, the message goes back to the queue.
struct MemoryAck {
    shared: Arc<Shared>,
    redelivery: Option<(Envelope, u32)>,
}

impl MemoryAck {
    /// Queues the message again, now: it stays unsettled until then.
    fn requeue(shared: &Shared, message: (Envelope, u32)) {
        shared.update(|state| {
            state.unsettled -= 1;
            state.redelivered += 1;
            state.ready.push_back(message);
        });
    }
}

impl Acknowledge for MemoryAck {
    fn ack(mut self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        if self.redelivery.take().is_some() {
            self.shared.update(|state| {
                state.unsettled -= 1;
                state.acked += 1;
            });
        }
        Box::pin(async { Ok(()) })
    }

    /// Queues the message again after `delay` (a timer task; until then it counts as in flight).
    fn nack(mut self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        if let Some(message) = self.redelivery.take() {
            let shared = Arc::clone(&self.shared);
            if delay.is_zero() {
                Self::requeue(&shared, message);
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    Self::requeue(&shared, message);
                });
            }
        }
        Box::pin(async { Ok(()) })
    }
}

impl Drop for MemoryAck {
    fn drop(&mut self) {
        if let Some(message) = self.redelivery.take() {
            Self::requeue(&self.shared, message);
        }
    }
}
