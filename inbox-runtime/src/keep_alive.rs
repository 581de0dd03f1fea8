//! Keeping unsettled deliveries alive: for a source whose broker takes a delivery back after a
//! timeout, every delivery the run holds unsettled (queued behind its aggregate, or in a long
//! handler) is reported in progress at the source's [`keep_alive`](crate::Source::keep_alive)
//! period, until it is settled.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::source::SourceError;

/// A delivery held unsettled.
pub(crate) trait Held: Send + Sync {
    /// Tells the broker the delivery is still being worked on; `None` once it is settled.
    fn in_progress(&self) -> Option<BoxFuture<'static, Result<(), SourceError>>>;
}

/// The deliveries a run holds, reported in progress at a period until they are settled (or
/// dropped, which is when the keeper forgets them).
#[derive(Default)]
pub(crate) struct Keeper {
    held: Mutex<Vec<Weak<dyn Held>>>,
}

impl Keeper {
    /// Keeps `delivery` alive until it is settled or dropped. The list forgets the dropped ones
    /// whenever it is full and then makes room for as many again as are alive, so it holds at
    /// most about twice what is alive, however many deliveries pass between two reports, and
    /// looks through itself once per as many holds as there are alive.
    pub(crate) fn hold(&self, delivery: Weak<dyn Held>) {
        let mut held = self.lock();
        if held.len() == held.capacity() {
            held.retain(|delivery| delivery.strong_count() > 0);
            // Room for as many again as are alive, so that the next pass is that far away.
            let alive = held.len();
            held.reserve_exact(alive);
        }
        held.push(delivery);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn Held>>> {
        // A panic while holding this lock leaves a list of weak references, still usable.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports every held delivery in progress once, forgetting those gone.
    async fn report(&self) {
        let progress: Vec<_> = {
            let mut held = self.lock();
            held.retain(|delivery| delivery.strong_count() > 0);
            held.iter()
                .filter_map(Weak::upgrade)
                .filter_map(|delivery| delivery.in_progress())
                .collect()
        };
        for reported in futures::future::join_all(progress).await {
            if let Err(error) = reported {
                tracing::warn!(%error, "could not tell the broker a delivery is in progress");
            }
        }
    }

    /// Reports the held deliveries every `period` until the sender is dropped.
    pub(crate) fn spawn(
        self: Arc<Self>,
        period: Duration,
    ) -> (oneshot::Sender<()>, JoinHandle<()>) {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let keeper = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(period) => self.report().await,
                }
            }
        });
        (stop, keeper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Settled;

    impl Held for Settled {
        fn in_progress(&self) -> Option<BoxFuture<'static, Result<(), SourceError>>> {
            None
        }
    }

    #[test]
    fn the_list_holds_no_more_than_twice_what_is_alive() {
        let keeper = Keeper::default();
        let alive: Vec<Arc<dyn Held>> = (0..10).map(|_| Arc::new(Settled) as _).collect();
        for delivery in &alive {
            keeper.hold(Arc::downgrade(delivery));
        }

        for _ in 0..100_000 {
            let gone: Arc<dyn Held> = Arc::new(Settled);
            keeper.hold(Arc::downgrade(&gone));
        }

        let held = keeper.lock();
        assert!(
            held.capacity() <= 2 * (alive.len() + 1) + 4,
            "{}",
            held.capacity()
        );
        assert_eq!(held.iter().filter(|d| d.strong_count() > 0).count(), 10);
    }
}
