//! Keyed scheduling: any free worker takes the oldest waiting job whose key (a handler and one of
//! its aggregates, or a message id for a handler without aggregates) is not being handled, so one
//! aggregate's jobs run one at a time and in arrival order, while no worker idles as long as some
//! other aggregate has work.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};

/// What serializes jobs: a handler, and what its messages are ordered by.
pub(crate) type Key = (&'static str, Serial);

/// What one handler's jobs are serialized by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Serial {
    /// The aggregate, for a handler with one: its messages in arrival order.
    Aggregate(String),
    /// The message id, for a handler without: copies of one message never race each other.
    Message(String),
}

/// Jobs waiting for a worker, and the keys of those being handled.
pub(crate) struct Scheduler<T> {
    state: Mutex<State<T>>,
    /// Signalled when a job arrives, a key is free again, or the scheduler closes.
    changed: Notify,
    /// Bounds the work pulled from the source and not yet settled.
    room: Arc<Semaphore>,
    capacity: usize,
}

/// Each key's jobs in arrival order, and the free keys with a job waiting ordered by when that
/// job arrived: taking the oldest free job, and freeing a key, cost a lookup each, however many
/// jobs wait behind busy keys.
struct State<T> {
    keys: HashMap<Key, KeyQueue<T>>,
    /// Free keys with a waiting job, by the arrival number of their first waiting job.
    ready: BTreeMap<u64, Key>,
    /// The arrival number of the next job pushed.
    arrivals: u64,
    waiting: usize,
    closed: bool,
    workers: usize,
}

/// The jobs of one key that wait, each with its arrival number, and whether one is being
/// handled.
struct KeyQueue<T> {
    jobs: VecDeque<(u64, T)>,
    busy: bool,
}

/// A taken job's key: busy until this is dropped (also when the worker unwinds), so the
/// aggregate's next job waits for this one to end.
pub(crate) struct Busy<'s, T> {
    scheduler: &'s Scheduler<T>,
    key: Key,
}

impl<T> Scheduler<T> {
    /// A scheduler for `workers` workers, with room for `capacity` units of work in flight.
    pub(crate) fn new(workers: usize, capacity: usize) -> Self {
        let state = State {
            keys: HashMap::new(),
            ready: BTreeMap::new(),
            arrivals: 0,
            waiting: 0,
            closed: false,
            workers,
        };
        Self {
            state: Mutex::new(state),
            changed: Notify::new(),
            room: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// Waits until there is room for `units` more units of work (at most the whole capacity);
    /// the room is given back when the permit is dropped. Fails once every worker is gone.
    pub(crate) async fn room(&self, units: usize) -> Result<OwnedSemaphorePermit, AcquireError> {
        let units = units.clamp(1, self.capacity) as u32;
        Arc::clone(&self.room).acquire_many_owned(units).await
    }

    /// Queues a job behind the earlier jobs of its key.
    pub(crate) fn push(&self, key: Key, job: T) {
        self.lock().push(key, job);
        self.changed.notify_waiters();
    }

    /// Says no more jobs will come: workers end once the waiting ones are done.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_waiters();
    }

    /// The oldest waiting job whose key is free, waiting for one; `None` once the scheduler is
    /// closed and nothing waits.
    pub(crate) async fn take(&self) -> Option<(T, Busy<'_, T>)> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                if let Some((key, job)) = state.take_free() {
                    return Some((
                        job,
                        Busy {
                            scheduler: self,
                            key,
                        },
                    ));
                }
                if state.closed && state.waiting == 0 {
                    return None;
                }
            }
            changed.await;
        }
    }

    /// Up to `most` jobs of free keys: waits for the first, then takes what is ready, waiting up
    /// to `linger` for more. Empty once the scheduler is closed and nothing waits.
    pub(crate) async fn take_up_to(&self, most: usize, linger: Duration) -> Vec<(T, Busy<'_, T>)> {
        let Some(first) = self.take().await else {
            return Vec::new();
        };
        let mut taken = vec![first];
        let deadline = tokio::time::Instant::now() + linger;
        while taken.len() < most {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next = self.lock().take_free();
            match next {
                Some((key, job)) => taken.push((
                    job,
                    Busy {
                        scheduler: self,
                        key,
                    },
                )),
                None if linger.is_zero() || self.lock().closed => break,
                None => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        break;
                    }
                }
            }
        }
        taken
    }

    /// Marks a worker as gone; when the last one is, no room is left for new work.
    pub(crate) fn worker_gone(&self) {
        let mut state = self.lock();
        state.workers -= 1;
        if state.workers == 0 {
            self.room.close();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> State<T> {
    /// Queues a job behind its key's earlier ones; a free key with nothing waiting becomes ready.
    fn push(&mut self, key: Key, job: T) {
        let arrival = self.arrivals;
        self.arrivals += 1;
        self.waiting += 1;
        let queue = self.keys.entry(key.clone()).or_insert_with(|| KeyQueue {
            jobs: VecDeque::new(),
            busy: false,
        });
        if queue.jobs.is_empty() && !queue.busy {
            self.ready.insert(arrival, key);
        }
        queue.jobs.push_back((arrival, job));
    }

    /// Removes the oldest waiting job whose key is free and marks the key busy. A job never
    /// overtakes an earlier one of its key: only a key's first waiting job can be taken, and
    /// only while the key is free.
    fn take_free(&mut self) -> Option<(Key, T)> {
        let (_, key) = self.ready.pop_first()?;
        let queue = self.keys.get_mut(&key)?;
        let (_, job) = queue.jobs.pop_front()?;
        queue.busy = true;
        self.waiting -= 1;
        Some((key, job))
    }

    /// Frees a key: its next waiting job becomes ready, or the key is forgotten.
    fn free(&mut self, key: &Key) {
        let Some(queue) = self.keys.get_mut(key) else {
            return;
        };
        queue.busy = false;
        match queue.jobs.front() {
            Some((arrival, _)) => {
                self.ready.insert(*arrival, key.clone());
            }
            None => {
                self.keys.remove(key);
            }
        }
    }
}

impl<T> Drop for Busy<'_, T> {
    fn drop(&mut self) {
        self.scheduler.lock().free(&self.key);
        self.scheduler.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(aggregate: &str) -> Key {
        ("handler", Serial::Aggregate(aggregate.to_owned()))
    }

    #[tokio::test]
    async fn a_busy_key_holds_back_only_its_own_jobs_and_the_oldest_free_job_comes_first() {
        let scheduler = Scheduler::new(1, 16);
        for (aggregate, job) in [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("b", 5)] {
            scheduler.push(key(aggregate), job);
        }
        let (first, busy_a) = scheduler.take().await.expect("a job");
        let taken = scheduler.take_up_to(10, Duration::ZERO).await;
        let jobs: Vec<i32> = taken.iter().map(|(job, _)| *job).collect();
        assert_eq!((first, jobs), (1, vec![3, 4]), "a and b are busy");
        drop(busy_a);
        drop(taken);
        let rest = scheduler.take_up_to(10, Duration::ZERO).await;
        let jobs: Vec<i32> = rest.iter().map(|(job, _)| *job).collect();
        assert_eq!(jobs, vec![2, 5], "each key's next job, oldest first");
        drop(rest);
        scheduler.close();
        assert!(scheduler.take().await.is_none());
    }
}
