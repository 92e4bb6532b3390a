//! How often, and how patiently, the client tries again after a transient
//! failure.

use std::future::Future;
use std::time::Duration;

use tonic::Status;

use crate::error::Error;

/// Capped exponential backoff with jitter, and a bound on attempts.
///
/// The `n`-th retry waits about `initial_backoff × 2ⁿ⁻¹`, never more than
/// `max_backoff`, randomised between half and all of that so that many
/// clients do not retry in step. A `RATE_LIMITED` answer's `RetryInfo`
/// delay replaces the backoff for that retry.
///
/// ```
/// use std::time::Duration;
/// use sessionstore_client::RetryPolicy;
///
/// let patient = RetryPolicy::default()
///     .max_attempts(10)
///     .initial_backoff(Duration::from_millis(50))
///     .max_backoff(Duration::from_secs(2));
/// assert_eq!(patient.attempts(), 10);
/// assert_eq!(RetryPolicy::never().attempts(), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, backing off from 100 ms up to 5 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries.
    pub fn never() -> Self {
        RetryPolicy::default().max_attempts(1)
    }

    /// At most this many attempts in all, the first included (at least 1).
    /// For a watch: this many reconnection attempts in a row without
    /// receiving an event before the stream gives up.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The wait before the first retry.
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.initial_backoff = backoff;
        self
    }

    /// The longest wait between two attempts.
    pub fn max_backoff(mut self, backoff: Duration) -> Self {
        self.max_backoff = backoff;
        self
    }

    /// The bound on attempts.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The wait before retry number `retry` (1 for the first retry), with
    /// jitter.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(30);
        let full = self
            .initial_backoff
            .saturating_mul(1_u32 << doublings)
            .min(self.max_backoff);
        let half = full / 2;
        half + half.mul_f64(jitter())
    }

    /// The wait before retry number `retry` after `error`: the server's
    /// `RetryInfo` delay if it gave one, else the backoff.
    pub(crate) fn delay_after(&self, error: &Error, retry: u32) -> Duration {
        error.retry_after().unwrap_or_else(|| self.backoff(retry))
    }
}

/// A number in [0, 1), different on every call (from std's per-instance
/// random hash keys; good enough to spread retries, not for anything else).
fn jitter() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    // The top 53 bits as a fraction.
    (hasher.finish() >> 11) as f64 / (1_u64 << 53) as f64
}

/// Runs `attempt` until it succeeds, fails permanently, or `policy` runs
/// out of attempts. Only for calls that are safe to repeat.
pub(crate) async fn retrying<T, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let mut tries = 1;
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(status) => Error::from(status),
        };
        if tries >= policy.max_attempts || !error.is_transient() {
            return Err(error);
        }
        tokio::time::sleep(policy.delay_after(&error, tries)).await;
        tries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let policy = RetryPolicy::default()
            .initial_backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_secs(1));
        for (retry, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (40, 1000),
        ] {
            let wait = policy.backoff(retry);
            let full = Duration::from_millis(full);
            assert!(wait >= full / 2 && wait <= full, "retry {retry}: {wait:?}");
        }
    }

    #[test]
    fn jitter_varies() {
        let draws: Vec<f64> = (0..8).map(|_| jitter()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
