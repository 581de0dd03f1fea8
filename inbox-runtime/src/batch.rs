//! Batched mode: many deliveries handled in one transaction.

use std::time::Duration;

/// How a running inbox batches: up to [`Batch::new`]'s size of ready jobs are guarded in one
/// transaction that commits once, and their deliveries are acknowledged after it. A worker fills
/// its batch first with the jobs waiting behind the aggregates the batch already holds, then with
/// the oldest jobs of aggregates no other worker holds; one aggregate's jobs keep their order,
/// within and across batches, each later one placed as if it came after the one before it.
/// Under strict ordering a batch takes one message of an aggregate: the parked successors it
/// releases apply once the batch committed, before the aggregate's next message is placed.
///
/// The batch claims all its messages, reads the duplicates' rows and advances their streams in
/// one statement each (one more for the streams with several messages in the batch), then runs
/// each new message's handler. A handler's failure rolls the batch
/// back: that failure is recorded (its handler does not run again for the attempt) and the other
/// messages go in a new batch; a statement the database refuses sends each message to a
/// transaction of its own, as does a batch in which a handler went on from a failed statement
/// and left the transaction aborted (PostgreSQL; checked once, before the commit). So one
/// message's failure neither commits nor loses the others' work.
/// Duplicates and stale messages in a batch cost no handler call, as always.
///
/// ```
/// use std::time::Duration;
/// let batch = inbox::Batch::new(100).linger(Duration::from_millis(5));
/// assert_eq!(batch.size(), 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    size: usize,
    linger: Duration,
}

impl Batch {
    /// The largest batch: past it, a batch gains nothing and holds its streams' locks longer.
    pub const MAX_SIZE: usize = 10_000;

    /// Batches of up to `size` jobs (at least one, at most [`Batch::MAX_SIZE`]), taking what is
    /// ready without waiting.
    ///
    /// ```
    /// assert_eq!(inbox::Batch::new(usize::MAX).size(), inbox::Batch::MAX_SIZE);
    /// ```
    pub fn new(size: usize) -> Self {
        Self {
            size: size.clamp(1, Self::MAX_SIZE),
            linger: Duration::ZERO,
        }
    }

    /// How long a worker waits for more ready jobs before it runs a batch that is not full
    /// (default: not at all). Waiting fills batches under a trickle of deliveries, at the cost of
    /// that much latency.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// The most jobs in one batch.
    pub fn size(&self) -> usize {
        self.size
    }

    /// How long a worker waits to fill a batch.
    pub fn lingers(&self) -> Duration {
        self.linger
    }
}
