//! A fetch from a broker that a stopping run does not lose.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::SourceError;

/// A fetch on a task of its own. A run that stops while [`Source::next`](super::Source::next)
/// waits for a fetch drops that future, but not the fetch: the broker may already have given
/// its messages to this consumer (a claim that committed, a blocking read the server answered).
/// The source keeps the fetch here, the next call to `next` takes its answer, and
/// [`Source::drain`](super::Source::drain) waits for it and hands back what it fetched.
pub(crate) struct InFlight<T>(Option<JoinHandle<Result<T, SourceError>>>);

impl<T: Send + 'static> InFlight<T> {
    /// Nothing in flight.
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// The answer of the fetch in flight, or of `fetch`, started now if none is.
    pub(crate) async fn answer<F>(&mut self, fetch: impl FnOnce() -> F) -> Result<T, SourceError>
    where
        F: Future<Output = Result<T, SourceError>> + Send + 'static,
    {
        let fetching = self.0.get_or_insert_with(|| tokio::spawn(fetch()));
        let answer = fetching.await;
        self.0 = None;
        answer?
    }

    /// At shutdown: the answer of the fetch in flight, if one is and it answers `within`.
    pub(crate) async fn finish(&mut self, within: Duration) -> Option<T> {
        let fetching = self.0.take()?;
        match tokio::time::timeout(within, fetching).await {
            Ok(Ok(Ok(fetched))) => Some(fetched),
            Ok(Ok(Err(error))) => {
                tracing::debug!(%error, "the last fetch failed");
                None
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "the last fetch did not finish");
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the last fetch did not answer in time; what it fetched comes back after \
                     the broker's timeout"
                );
                None
            }
        }
    }
}

impl<T> Drop for InFlight<T> {
    /// A source dropped without [`Source::drain`](super::Source::drain) (its run cancelled)
    /// stops its fetch as a cancelled call to `next` would.
    fn drop(&mut self) {
        if let Some(fetching) = self.0.take() {
            fetching.abort();
        }
    }
}
