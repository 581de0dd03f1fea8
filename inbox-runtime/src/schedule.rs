//! Keyed scheduling: any free worker takes the oldest waiting job whose key (a handler and one of
//! its aggregates, or a message id for a handler without aggregates) is not being handled, so one
//! aggregate's jobs run one at a time and in arrival order, while no worker idles as long as some
//! other aggregate has work. A worker filling a batch first takes the jobs waiting behind the keys
//! it holds (the batch handles them one after the other), then the oldest jobs of free keys: a
//! few busy aggregates fill whole batches, and the other workers find the other aggregates free.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore, watch};

/// What serializes jobs: a handler, and what its messages are ordered by.
pub(crate) type Key = (&'static str, Serial);

/// What one handler's jobs are serialized by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Serial {
    /// The aggregate, for a handler with one: its messages in arrival order.
    Aggregate(String),
    /// The aggregate, for a handler under strict ordering: its messages in arrival order, one
    /// per batch (see [`Serial::shares_batches`]).
    Strict(String),
    /// The message id, for a handler without: copies of one message never race each other.
    Message(String),
}

impl Serial {
    /// Whether a batch may take more than one job of this key. Not under strict ordering: the
    /// parked successors a message releases apply after its batch commits, and the key's next
    /// message must find them applied, as it does one message per transaction (else it would be
    /// parked behind them, and released in turn).
    fn shares_batches(&self) -> bool {
        !matches!(self, Serial::Strict(_))
    }

    /// The aggregate, or the message id.
    fn name(&self) -> &str {
        match self {
            Serial::Aggregate(name) | Serial::Strict(name) | Serial::Message(name) => name,
        }
    }
}

/// Jobs waiting for a worker, and the keys of those being handled.
pub(crate) struct Scheduler<T> {
    state: Mutex<State<T>>,
    /// Signalled when a job arrives, a key is free again, or the scheduler closes.
    changed: Notify,
    /// Bounds the work pulled from the source and not yet settled.
    room: Arc<Semaphore>,
    capacity: usize,
    /// Becomes `true` when the scheduler closes: the jobs put back with a delay are free at once.
    closed: watch::Sender<bool>,
}

/// Each key's jobs in arrival order, and the free keys with a job waiting ordered by when that
/// job arrived: taking the oldest free job, and freeing a key, cost a lookup each, however many
/// jobs wait behind busy keys. So does taking the oldest job behind the keys a batch holds.
struct State<T> {
    keys: HashMap<Key, KeyQueue<T>>,
    /// Free keys with a waiting job, by the arrival number of their first waiting job.
    ready: BTreeMap<u64, Key>,
    /// Each batch being filled, by its number.
    filling: HashMap<u64, Held>,
    /// The number of the next batch to fill.
    batches: u64,
    /// The arrival number of the next job pushed.
    arrivals: u64,
    waiting: usize,
    closed: bool,
    workers: usize,
    /// Keys whose later jobs are not to run in this run (see [`Busy::stop`]).
    stopped: HashSet<Key>,
}

/// The jobs of one key that wait, each with its arrival number, how many of its jobs are being
/// handled (all by one worker, in one batch), and the batch that holds it while that fills.
struct KeyQueue<T> {
    jobs: VecDeque<(u64, T)>,
    busy: usize,
    filling: Option<u64>,
}

/// The keys a batch being filled holds, and those of them with a job waiting, by the arrival
/// number of that job.
#[derive(Default)]
struct Held {
    keys: Vec<Key>,
    behind: BTreeMap<u64, Key>,
}

/// A batch being filled: its keys are marked as held by it until it is full (also when its
/// filling is abandoned).
struct Filling<'s, T> {
    scheduler: &'s Scheduler<T>,
    batch: u64,
}

/// A taken job's key: busy until this is dropped (also when the worker unwinds), so the
/// aggregate's next job waits for this one to end (unless the same batch took it too), or until
/// the job put back with [`Scheduler::put_back`] is due.
pub(crate) struct Busy<'s, T> {
    scheduler: &'s Scheduler<T>,
    key: Key,
    /// The job's arrival number, which it keeps when put back.
    arrival: u64,
    /// Whether a delayed put-back frees the key instead of the drop.
    put_back: bool,
}

impl<T> Scheduler<T> {
    /// A scheduler for `workers` workers, with room for `capacity` units of work in flight.
    pub(crate) fn new(workers: usize, capacity: usize) -> Self {
        let state = State {
            keys: HashMap::new(),
            ready: BTreeMap::new(),
            filling: HashMap::new(),
            batches: 0,
            arrivals: 0,
            waiting: 0,
            closed: false,
            workers,
            stopped: HashSet::new(),
        };
        Self {
            state: Mutex::new(state),
            changed: Notify::new(),
            room: Arc::new(Semaphore::new(capacity)),
            capacity,
            closed: watch::Sender::new(false),
        }
    }

    /// Waits until there is room for `units` more units of work (at most the whole capacity);
    /// the room is given back when the permit is dropped. Fails once every worker is gone.
    ///
    /// When the room is full, it waits for a quarter of it to be free, not for `units`: the
    /// caller then wakes once per quarter of the room, not once for each job a worker ends,
    /// while the three quarters still queued keep the workers busy.
    pub(crate) async fn room(&self, units: usize) -> Result<OwnedSemaphorePermit, AcquireError> {
        let units = units.clamp(1, self.capacity);
        if let Ok(room) = Arc::clone(&self.room).try_acquire_many_owned(units as u32) {
            return Ok(room);
        }
        let refill = units.max(self.capacity / 4);
        let mut room = Arc::clone(&self.room)
            .acquire_many_owned(refill as u32)
            .await?;
        // The rest goes back at once, for the calls that follow to take without waiting.
        Ok(room.split(units).unwrap_or(room))
    }

    /// Queues a job behind the earlier jobs of its key.
    pub(crate) fn push(&self, key: Key, job: T) {
        self.lock().push(key, job);
        self.changed.notify_waiters();
    }

    /// Says no more jobs will come: workers end once the waiting ones are done.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.closed.send_replace(true);
        self.changed.notify_waiters();
    }

    /// Whether [`Scheduler::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Puts a taken job back first among its key's waiting jobs, to be taken again once `delay`
    /// has passed (at once when the scheduler closes); its key stays busy meanwhile, so none of
    /// the key's later jobs overtakes it.
    pub(crate) fn put_back(self: &Arc<Self>, mut busy: Busy<'_, T>, job: T, delay: Duration)
    where
        T: Send + 'static,
    {
        busy.put_back = true;
        let key = busy.key.clone();
        self.lock().put_back(&key, busy.arrival, job);
        let scheduler = Arc::clone(self);
        let mut closed = self.closed.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = closed.wait_for(|closed| *closed) => {}
            }
            scheduler.lock().free(&key);
            scheduler.changed.notify_waiters();
        });
    }

    /// The oldest waiting job whose key is free, waiting for one (after `before_waiting`, taken
    /// out and run if it is there, when none is free); `None` once the scheduler is closed and
    /// nothing waits.
    pub(crate) async fn take(
        &self,
        before_waiting: &mut Option<impl Future<Output = ()>>,
    ) -> Option<(T, Busy<'_, T>)> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                if let Some((key, arrival, job)) = state.take_free() {
                    return Some((job, self.busy(key, arrival)));
                }
                if state.closed && state.waiting == 0 {
                    return None;
                }
            }
            if let Some(before_waiting) = before_waiting.take() {
                before_waiting.await;
                continue;
            }
            changed.await;
        }
    }

    /// Up to `most` jobs: waits for the first, then takes what is ready, waiting up to `linger`
    /// for more: first the jobs waiting behind the keys the batch holds (behind its earlier jobs
    /// of that key), then the oldest job of a free key. `before_waiting` runs once, before the
    /// first wait, if any. Empty once the scheduler is closed and nothing waits.
    pub(crate) async fn take_up_to(
        &self,
        most: usize,
        linger: Duration,
        before_waiting: impl Future<Output = ()>,
    ) -> Vec<(T, Busy<'_, T>)> {
        let mut before_waiting = Some(before_waiting);
        let Some(first) = self.take(&mut before_waiting).await else {
            return Vec::new();
        };
        let filling = self.fill(&first.1.key);
        let mut taken = vec![first];
        let deadline = tokio::time::Instant::now() + linger;
        while taken.len() < most {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next = self.lock().take_ready(filling.batch);
            match next {
                Some((key, arrival, job)) => taken.push((job, self.busy(key, arrival))),
                None if linger.is_zero() || self.lock().closed => break,
                None => {
                    if let Some(before_waiting) = before_waiting.take() {
                        before_waiting.await;
                        continue;
                    }
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        break;
                    }
                }
            }
        }
        taken
    }

    fn busy(&self, key: Key, arrival: u64) -> Busy<'_, T> {
        Busy {
            scheduler: self,
            key,
            arrival,
            put_back: false,
        }
    }

    /// Starts filling a batch that holds `key`.
    fn fill(&self, key: &Key) -> Filling<'_, T> {
        let mut state = self.lock();
        let batch = state.batches;
        state.batches += 1;
        state.filling.insert(batch, Held::default());
        state.hold(batch, key);
        Filling {
            scheduler: self,
            batch,
        }
    }

    /// The keys of the `taken` jobs that were [stopped](Busy::stop), each as its handler and
    /// its aggregate (or message id): one look, and none while no key is stopped.
    pub(crate) fn stopped(&self, taken: &[Busy<'_, T>]) -> Vec<(&'static str, String)> {
        let state = self.lock();
        if state.stopped.is_empty() {
            return Vec::new();
        }
        let stopped = taken
            .iter()
            .filter(|busy| state.stopped.contains(&busy.key));
        stopped
            .map(|busy| (busy.key.0, busy.key.1.name().to_owned()))
            .collect()
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
            busy: 0,
            filling: None,
        });
        if queue.jobs.is_empty() {
            match (queue.busy, queue.filling) {
                (0, _) => {
                    self.ready.insert(arrival, key);
                }
                (_, Some(batch)) if key.1.shares_batches() => {
                    if let Some(held) = self.filling.get_mut(&batch) {
                        held.behind.insert(arrival, key);
                    }
                }
                // Busy elsewhere, or in a batch that takes one job of it: it waits to be free.
                _ => {}
            }
        }
        queue.jobs.push_back((arrival, job));
    }

    /// Removes the oldest waiting job whose key is free and marks the key busy. A job never
    /// overtakes an earlier one of its key: only a key's first waiting job can be taken, and
    /// only while the key is free.
    fn take_free(&mut self) -> Option<(Key, u64, T)> {
        let (_, key) = self.ready.pop_first()?;
        let (arrival, job) = self.take_first_of(&key)?;
        Some((key, arrival, job))
    }

    /// Removes, for `batch`, the oldest job waiting behind a key the batch holds (busy with its
    /// earlier jobs), or else the oldest job of a free key, which the batch holds from then on.
    /// Taking an aggregate's later jobs first fills a batch with fewer aggregates, and leaves
    /// more of them to the other workers.
    fn take_ready(&mut self, batch: u64) -> Option<(Key, u64, T)> {
        let held = self.filling.get_mut(&batch)?;
        let key = match held.behind.pop_first() {
            Some((_, key)) => key,
            None => self.ready.pop_first()?.1,
        };
        let (arrival, job) = self.take_first_of(&key)?;
        self.hold(batch, &key);
        Some((key, arrival, job))
    }

    /// Marks `key` as held by `batch`, its next waiting job (if any) one the batch may take.
    fn hold(&mut self, batch: u64, key: &Key) {
        let (Some(queue), Some(held)) = (self.keys.get_mut(key), self.filling.get_mut(&batch))
        else {
            return;
        };
        if queue.filling.replace(batch).is_none() {
            held.keys.push(key.clone());
        }
        if let Some((arrival, _)) = queue.jobs.front().filter(|_| key.1.shares_batches()) {
            held.behind.insert(*arrival, key.clone());
        }
    }

    /// Ends the filling of `batch`: the jobs behind its keys wait for the keys to be free.
    fn filled(&mut self, batch: u64) {
        let Some(held) = self.filling.remove(&batch) else {
            return;
        };
        for key in held.keys {
            if let Some(queue) = self.keys.get_mut(&key) {
                queue.filling = None;
            }
        }
    }

    /// Removes `key`'s first waiting job, counting it as being handled.
    fn take_first_of(&mut self, key: &Key) -> Option<(u64, T)> {
        let queue = self.keys.get_mut(key)?;
        let taken = queue.jobs.pop_front()?;
        queue.busy += 1;
        self.waiting -= 1;
        Some(taken)
    }

    /// Queues a job that `key`'s busy worker took back in its place by `arrival`, ahead of the
    /// key's later jobs; the key stays busy until [`State::free`].
    fn put_back(&mut self, key: &Key, arrival: u64, job: T) {
        let queue = self.keys.entry(key.clone()).or_insert_with(|| KeyQueue {
            jobs: VecDeque::new(),
            busy: 1,
            filling: None,
        });
        let at = queue
            .jobs
            .partition_point(|(earlier, _)| *earlier < arrival);
        queue.jobs.insert(at, (arrival, job));
        self.waiting += 1;
    }

    /// Ends one of a key's jobs; once none is being handled, its next waiting job becomes ready,
    /// or the key is forgotten.
    fn free(&mut self, key: &Key) {
        let Some(queue) = self.keys.get_mut(key) else {
            return;
        };
        queue.busy -= 1;
        if queue.busy > 0 {
            return;
        }
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

impl<T> Drop for Filling<'_, T> {
    fn drop(&mut self) {
        self.scheduler.lock().filled(self.batch);
    }
}

impl<T> Busy<'_, T> {
    /// Stops the key for the rest of the run: its job went back to the broker with nothing
    /// recorded, and the key's later jobs must not overtake it, so they go back too, unrun.
    pub(crate) fn stop(&self) {
        self.scheduler.lock().stopped.insert(self.key.clone());
    }
}

impl<T> Drop for Busy<'_, T> {
    fn drop(&mut self) {
        if self.put_back {
            return;
        }
        self.scheduler.lock().free(&self.key);
        self.scheduler.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::future::ready;

    use super::*;

    fn key(aggregate: &str) -> Key {
        ("handler", Serial::Aggregate(aggregate.to_owned()))
    }

    fn jobs<T: Copy>(taken: &[(T, Busy<'_, T>)]) -> Vec<T> {
        taken.iter().map(|(job, _)| *job).collect()
    }

    #[tokio::test]
    async fn a_busy_key_holds_back_only_its_own_jobs_and_the_oldest_free_job_comes_first() {
        let scheduler = Scheduler::new(1, 16);
        for (aggregate, job) in [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("b", 5)] {
            scheduler.push(key(aggregate), job);
        }
        let (first, busy_a) = scheduler.take(&mut Some(ready(()))).await.expect("a job");
        let taken = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(
            (first, jobs(&taken)),
            (1, vec![3, 5, 4]),
            "a is busy elsewhere; b's second job follows its first into the batch, before c's"
        );
        drop(busy_a);
        drop(taken);
        let rest = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(jobs(&rest), vec![2], "a's next job, once a is free");
        drop(rest);
        scheduler.close();
        assert!(scheduler.take(&mut Some(ready(()))).await.is_none());
    }

    #[tokio::test]
    async fn a_batch_takes_one_job_of_a_strict_key() {
        let scheduler = Scheduler::new(2, 16);
        let strict = ("strict", Serial::Strict("a".to_owned()));
        scheduler.push(strict.clone(), 1);
        scheduler.push(key("b"), 2);
        scheduler.push(strict.clone(), 3);
        scheduler.push(key("b"), 4);

        let taken = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        scheduler.push(strict, 5);
        scheduler.push(key("c"), 6);
        let other = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;

        assert_eq!(
            jobs(&taken),
            vec![1, 2, 4],
            "a's later jobs wait for the batch to end"
        );
        assert_eq!(
            jobs(&other),
            vec![6],
            "nor does another batch take them meanwhile"
        );
        drop((taken, other));
        let next = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(jobs(&next), vec![3], "then the next one, alone");
    }

    #[tokio::test]
    async fn a_key_stays_busy_until_every_job_a_batch_took_of_it_ends() {
        let scheduler = Scheduler::new(2, 16);
        for (aggregate, job) in [("a", 1), ("b", 2), ("a", 3)] {
            scheduler.push(key(aggregate), job);
        }
        let mut batch = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(jobs(&batch), vec![1, 3, 2], "a's jobs, then b's");
        scheduler.push(key("a"), 4);
        drop(batch.remove(0));
        let other = tokio::time::timeout(
            Duration::from_millis(50),
            scheduler.take(&mut Some(ready(()))),
        )
        .await;
        assert!(other.is_err(), "a's job 3 is still in hand");
        drop(batch);
        let next = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(jobs(&next), vec![4]);
    }

    #[tokio::test]
    async fn a_job_put_back_comes_first_once_due_and_its_key_waits_for_it() {
        let scheduler = Arc::new(Scheduler::new(1, 16));
        for (aggregate, job) in [("a", 1), ("a", 2), ("b", 3)] {
            scheduler.push(key(aggregate), job);
        }
        let (first, busy) = scheduler.take(&mut Some(ready(()))).await.expect("a job");
        scheduler.put_back(busy, first, Duration::from_secs(1));
        scheduler.push(key("a"), 4);

        let (other, busy_b) = scheduler.take(&mut Some(ready(()))).await.expect("b's job");
        assert_eq!(other, 3, "a waits for the job put back");
        drop(busy_b);
        let early = tokio::time::timeout(
            Duration::from_millis(200),
            scheduler.take(&mut Some(ready(()))),
        )
        .await;
        assert!(early.is_err(), "not before its delay");
        let again = scheduler.take_up_to(10, Duration::ZERO, ready(())).await;
        assert_eq!(jobs(&again), vec![1, 2, 4], "then first, in arrival order");
    }

    #[tokio::test]
    async fn a_job_put_back_is_due_at_once_when_the_scheduler_closes() {
        let scheduler = Arc::new(Scheduler::new(1, 16));
        scheduler.push(key("a"), 1);
        let (job, busy) = scheduler.take(&mut Some(ready(()))).await.expect("a job");
        scheduler.put_back(busy, job, Duration::from_secs(3_600));
        scheduler.close();
        let again =
            tokio::time::timeout(Duration::from_secs(5), scheduler.take(&mut Some(ready(()))))
                .await;
        assert_eq!(again.expect("due").map(|(job, _)| job), Some(1));
        assert!(
            scheduler.take(&mut Some(ready(()))).await.is_none(),
            "then nothing waits"
        );
    }

    #[tokio::test]
    async fn a_job_that_arrives_behind_a_key_the_filling_batch_holds_joins_it() {
        let scheduler = Scheduler::new(1, 16);
        scheduler.push(key("a"), 1);
        let arrive = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            scheduler.push(key("a"), 2);
            scheduler.close();
        };
        let (taken, ()) = tokio::join!(
            scheduler.take_up_to(10, Duration::from_secs(5), ready(())),
            arrive
        );
        assert_eq!(jobs(&taken), vec![1, 2]);
    }

    #[tokio::test]
    async fn what_runs_before_waiting_runs_only_when_no_job_is_free() {
        let scheduler = Scheduler::new(1, 16);
        let ran = std::cell::Cell::new(0);
        let count = || async { ran.set(ran.get() + 1) };
        scheduler.push(key("a"), 1);
        let (job, busy) = scheduler.take(&mut Some(count())).await.expect("a job");
        assert_eq!((job, ran.get()), (1, 0), "a free job is taken without it");

        scheduler.push(key("a"), 2);
        let arrive = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(busy);
        };
        let mut waiting = Some(count());
        let (taken, ()) = tokio::join!(scheduler.take(&mut waiting), arrive);
        assert_eq!(taken.map(|(job, _)| job), Some(2));
        assert_eq!(ran.get(), 1, "once, before waiting for a's key");
    }

    #[tokio::test]
    async fn what_runs_before_waiting_runs_before_a_batch_lingers() {
        let scheduler = Scheduler::new(1, 16);
        let ran = std::cell::Cell::new(0);
        let count = || async { ran.set(ran.get() + 1) };
        scheduler.push(key("a"), 1);
        let taken = scheduler.take_up_to(10, Duration::ZERO, count()).await;
        assert_eq!((jobs(&taken), ran.get()), (vec![1], 0), "no wait, no run");
        drop(taken);

        scheduler.push(key("b"), 2);
        let taken = scheduler.take_up_to(10, Duration::from_millis(20), count());
        assert_eq!(
            (jobs(&taken.await), ran.get()),
            (vec![2], 1),
            "once, before lingering"
        );
    }

    #[tokio::test]
    async fn a_full_room_lets_its_waiter_go_once_a_quarter_of_it_is_free() {
        use futures::FutureExt;

        let scheduler = Scheduler::<u32>::new(2, 8);
        let mut taken: Vec<_> = (0..8).map(|_| scheduler.room(1).now_or_never()).collect();
        assert!(
            taken.iter().all(|room| matches!(room, Some(Ok(_)))),
            "8 free"
        );
        let waiter = scheduler.room(1);
        tokio::pin!(waiter);
        assert!((&mut waiter).now_or_never().is_none(), "the room is full");
        taken.pop();
        assert!(
            (&mut waiter).now_or_never().is_none(),
            "one unit free is not yet a quarter of 8"
        );
        taken.pop();
        let room = (&mut waiter).now_or_never().expect("a quarter free");
        assert_eq!(
            room.expect("room").num_permits(),
            1,
            "it takes what it asked for"
        );
        assert!(
            matches!(scheduler.room(1).now_or_never(), Some(Ok(_))),
            "and leaves the rest for the next call, which does not wait"
        );
    }
}
