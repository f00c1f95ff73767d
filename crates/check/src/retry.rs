//! Retry-window arithmetic: how long must a DONE record live?
//!
//! The TTL rule: a record must outlive the longest retry path of the
//! system — every attempt's timeout, every backoff sleep, any asynchronous
//! compensation that replays the operation later — and then that again as
//! margin. A record that expires before the last retry arrives lets that
//! retry through: the duplicate the whole mechanism exists to stop.
//!
//! Only configuration checks need this (`idemgate check`, and the gateway
//! when it loads its configuration), so it lives in this crate rather than
//! in the engine, which runs with whatever TTL it is given.

use std::time::Duration;

use crate::backoff::{Backoff, Jitter};

/// A client's retry policy, as far as the TTL rule needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, the first one included (3 = one try + two retries).
    pub attempts: u32,
    /// The client's timeout for one attempt.
    pub attempt_timeout: Duration,
    /// Backoff before the first retry; doubles for each later retry.
    pub backoff_base: Duration,
    /// Upper bound of one backoff sleep.
    pub backoff_cap: Duration,
    /// Randomization of each sleep.
    pub jitter: Jitter,
    /// Delay of an asynchronous job that may replay the operation after the
    /// client gave up (compensation, reconciliation, a manual replay).
    pub compensation_delay: Duration,
}

impl Default for RetryPolicy {
    /// The official OpenAI and Anthropic clients' defaults: 3 attempts,
    /// 0.5 s base, 8 s cap, a 600 s timeout.
    fn default() -> Self {
        Self {
            attempts: 3,
            attempt_timeout: Duration::from_secs(600),
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(8),
            jitter: Jitter::Full,
            compensation_delay: Duration::ZERO,
        }
    }
}

impl RetryPolicy {
    /// The backoff this policy sleeps by (its sleeps are drawn by
    /// [`Backoff::sleep`]; the TTL rule needs only their bound).
    pub fn backoff_schedule(&self) -> Backoff {
        Backoff::new(self.backoff_base, self.backoff_cap, self.jitter)
    }

    /// The longest sleep before retry number `retry` (0-based): jitter only
    /// shortens sleeps, so the bound is `min(cap, base × 2^retry)`.
    pub fn max_backoff(&self, retry: u32) -> Duration {
        self.backoff_schedule().max(retry)
    }

    /// The longest time from the first send to the end of the last possible
    /// replay: every attempt running to its timeout, every sleep at its
    /// maximum, plus the compensation delay.
    pub fn longest_window(&self) -> Duration {
        let attempts = self.attempts.max(1);
        let mut total = self
            .attempt_timeout
            .checked_mul(attempts)
            .unwrap_or(Duration::MAX);
        for retry in 0..attempts - 1 {
            if total == Duration::MAX {
                break;
            }
            total = total.saturating_add(self.max_backoff(retry));
        }
        total.saturating_add(self.compensation_delay)
    }

    /// The shortest `done_ttl` the TTL rule allows: twice the window.
    pub fn min_done_ttl(&self) -> Duration {
        self.longest_window().saturating_mul(2)
    }
}

/// `done_ttl` is shorter than the rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "done_ttl {done_ttl:?} is shorter than 2 x the longest retry window ({window:?}); use at least {needed:?}"
)]
pub struct TtlTooShort {
    /// The configured TTL.
    pub done_ttl: Duration,
    /// The longest retry window.
    pub window: Duration,
    /// The smallest acceptable TTL.
    pub needed: Duration,
}

/// Checks the TTL rule `done_ttl ≥ 2 × longest retry window`.
///
/// # Errors
/// [`TtlTooShort`] with the figures when the rule is broken.
pub fn check_done_ttl(done_ttl: Duration, policy: &RetryPolicy) -> Result<(), TtlTooShort> {
    let needed = policy.min_done_ttl();
    if done_ttl >= needed {
        Ok(())
    } else {
        Err(TtlTooShort {
            done_ttl,
            window: policy.longest_window(),
            needed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            attempt_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(3),
            jitter: Jitter::Full,
            compensation_delay: Duration::from_secs(300),
        }
    }

    #[test]
    fn window_adds_timeouts_capped_backoffs_and_compensation() {
        let p = policy();
        assert_eq!(p.max_backoff(0), Duration::from_secs(1));
        assert_eq!(p.max_backoff(1), Duration::from_secs(2));
        assert_eq!(p.max_backoff(2), Duration::from_secs(3));
        // 4 × 30 s + (1 + 2 + 3) s + 300 s
        assert_eq!(p.longest_window(), Duration::from_secs(426));
        assert_eq!(p.min_done_ttl(), Duration::from_secs(852));
    }

    #[test]
    fn the_rule_rejects_short_ttls_with_figures() {
        let p = policy();
        assert!(check_done_ttl(Duration::from_secs(852), &p).is_ok());
        let err = check_done_ttl(Duration::from_secs(60), &p).unwrap_err();
        assert_eq!(err.needed, Duration::from_secs(852));
        assert!(err.to_string().contains("852"));
    }

    #[test]
    fn huge_values_saturate_instead_of_overflowing() {
        let p = RetryPolicy {
            attempts: u32::MAX,
            attempt_timeout: Duration::MAX,
            backoff_cap: Duration::MAX,
            ..policy()
        };
        assert_eq!(p.min_done_ttl(), Duration::MAX);
        assert!(p.max_backoff(200) >= Duration::from_secs(u64::from(u32::MAX)));
    }
}
