//! What a run counts of the deliveries it handed back itself, so that their delays grow and
//! their limits are reached whatever the source counts: a classic RabbitMQ queue says only that
//! a message was delivered before, not how often, and a source of the user's own may count
//! nothing at all.

use std::collections::HashMap;
use std::sync::Mutex;

/// The most message ids a run remembers hand-backs of; past that, one is forgotten for each new
/// one (its next delivery counts from what its source says again).
const REMEMBERED: usize = 10_000;

/// How many times this run handed back a delivery of each message id, until one is settled.
#[derive(Default)]
pub(crate) struct HandBacks {
    counts: Mutex<HashMap<String, u32>>,
}

impl HandBacks {
    /// The attempt of a delivery of `id` that its source counts as `counted`: at least one more
    /// than the times this run handed it back.
    pub(crate) fn attempt(&self, id: &str, counted: u32) -> u32 {
        let handed_back = self.lock().get(id).copied().unwrap_or(0);
        counted.max(handed_back.saturating_add(1))
    }

    /// Counts one more hand-back of `id`.
    pub(crate) fn handed_back(&self, id: &str) {
        let mut counts = self.lock();
        if counts.len() >= REMEMBERED
            && !counts.contains_key(id)
            && let Some(forgotten) = counts.keys().next().cloned()
        {
            counts.remove(&forgotten);
        }
        let count = counts.entry(id.to_owned()).or_default();
        *count = count.saturating_add(1);
    }

    /// Forgets `id`: a delivery of it was settled for good.
    pub(crate) fn settled(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hand_back_adds_an_attempt_to_what_the_source_counts() {
        let hand_backs = HandBacks::default();
        assert_eq!(hand_backs.attempt("m-1", 1), 1);
        hand_backs.handed_back("m-1");
        hand_backs.handed_back("m-1");
        assert_eq!(
            hand_backs.attempt("m-1", 2),
            3,
            "a source that says only `redelivered`"
        );
        assert_eq!(hand_backs.attempt("m-1", 7), 7, "a source that counts more");
        assert_eq!(hand_backs.attempt("m-2", 1), 1, "another message");
    }

    #[test]
    fn a_settled_message_counts_from_its_source_again() {
        let hand_backs = HandBacks::default();
        hand_backs.handed_back("m-1");
        hand_backs.settled("m-1");
        assert_eq!(hand_backs.attempt("m-1", 1), 1);
    }

    #[test]
    fn at_most_so_many_messages_are_remembered() {
        let hand_backs = HandBacks::default();
        for n in 0..REMEMBERED + 5 {
            hand_backs.handed_back(&format!("m-{n}"));
        }
        assert_eq!(hand_backs.lock().len(), REMEMBERED);
        let last = format!("m-{}", REMEMBERED + 4);
        assert_eq!(hand_backs.attempt(&last, 1), 2, "the newest is remembered");
    }
}
