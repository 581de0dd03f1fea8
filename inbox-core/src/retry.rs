//! When a failed message is tried again, and when the inbox gives up on it.

use std::time::Duration;

/// Exponential backoff with jitter and an attempt limit.
///
/// ```
/// use std::time::Duration;
/// # use inbox_core as inbox;
/// use inbox::RetryPolicy;
///
/// let policy = RetryPolicy::new(3).backoff(Duration::from_millis(100), Duration::from_secs(1)).jitter(0.0);
/// assert_eq!(policy.delay_after(1), Some(Duration::from_millis(100)));
/// assert_eq!(policy.delay_after(2), Some(Duration::from_millis(200)));
/// assert_eq!(policy.delay_after(3), None, "the third failure is the last");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_delay: Duration,
    max_delay: Duration,
    jitter: f64,
    attempt_timeout: Duration,
}

/// How long one attempt of a handler may run before it counts as failed, unless the policy says
/// otherwise (see [`RetryPolicy::attempt_timeout`]).
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for RetryPolicy {
    /// Five attempts, waiting 1 s, 2 s, 4 s, 8 s between them (±20%), each attempt at most a
    /// minute.
    fn default() -> Self {
        Self::new(5)
    }
}

impl RetryPolicy {
    /// At most `max_attempts` attempts in all (at least 1), 1 s before the first retry, doubling
    /// up to 5 minutes, ±20% jitter, each attempt at most [`DEFAULT_ATTEMPT_TIMEOUT`].
    pub fn new(max_attempts: u32) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            jitter: 0.2,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }

    /// The delay before the first retry, doubling after each failure up to `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_delay = initial;
        self.max_delay = max.max(initial);
        self
    }

    /// How much each delay varies at random, as a fraction (0.2: ±20%), so that messages that
    /// failed together do not all come back at once.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// How long one attempt may run: a handler still running then is stopped, its transaction
    /// rolled back (releasing its stream lock, and on SQLite the write lock), and the attempt
    /// recorded as failed like any other error.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use inbox_core as inbox;
    /// use inbox::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new(3).attempt_timeout(Duration::from_secs(5));
    /// assert_eq!(policy.timeout(), Duration::from_secs(5));
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long one attempt may run.
    pub fn timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The first and the longest delay, in milliseconds.
    pub(crate) fn bounds_ms(&self) -> (i64, i64) {
        let ms = |delay: Duration| i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        (ms(self.initial_delay), ms(self.max_delay))
    }

    /// The most attempts a message gets.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How long to wait after the `failed_attempts`-th failure, or `None` if that was the last
    /// attempt and the message is dead.
    pub fn delay_after(&self, failed_attempts: u32) -> Option<Duration> {
        if failed_attempts >= self.max_attempts {
            return None;
        }
        Some(self.backoff_after(failed_attempts))
    }

    /// How long to wait after the `failed_attempts`-th failure, whatever the attempt limit: for
    /// what is tried again without end (a broker that cannot be reached). The jitter never takes
    /// a delay past the maximum.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use inbox_core as inbox;
    /// use inbox::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new(2).backoff(Duration::from_secs(1), Duration::from_secs(5)).jitter(0.0);
    /// assert_eq!(policy.backoff_after(9), Duration::from_secs(5));
    /// ```
    pub fn backoff_after(&self, failed_attempts: u32) -> Duration {
        let doublings = failed_attempts.saturating_sub(1).min(31);
        let delay = self
            .initial_delay
            .saturating_mul(1 << doublings)
            .min(self.max_delay);
        let spread = 1.0 + self.jitter * (2.0 * fastrand::f64() - 1.0);
        delay.mul_f64(spread).min(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_spreads_delays_but_never_past_the_maximum() {
        let (initial, max) = (Duration::from_secs(1), Duration::from_secs(5));
        let policy = RetryPolicy::new(10).backoff(initial, max).jitter(0.5);

        let capped: Vec<Duration> = (0..200).map(|_| policy.backoff_after(9)).collect();
        let first: Vec<Duration> = (0..200).map(|_| policy.backoff_after(1)).collect();

        assert!(capped.iter().all(|delay| *delay <= max), "{capped:?}");
        assert!(
            capped.iter().any(|delay| *delay < max),
            "still spread below the cap"
        );
        assert!(
            first.iter().any(|delay| *delay > initial),
            "spread both ways below it"
        );
        assert!(first.iter().all(|delay| *delay >= initial / 2), "{first:?}");
    }
}
