//! The record of each attempt of one operation, and the retry bookkeeping
//! that produces it.

use std::fmt;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::time::Instant;

use crate::policy::{Delay, DelaySource, RetryPolicy};

/// One attempt of an operation: what happened, and how long the client
/// waited before the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientAttempt {
    /// 1 for the first attempt, counting every attempt of the operation
    /// (stream resumptions included).
    pub number: u32,
    /// What the attempt ended with.
    pub end: AttemptEnd,
    /// The wait before the next attempt; `None` for the last one.
    pub delay: Option<Delay>,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptEnd {
    /// A response arrived with this status (for a stream: its head).
    Status(StatusCode),
    /// The attempt timeout elapsed first.
    Timeout,
    /// No connection could be made.
    Connect,
    /// The connection broke before a whole response arrived.
    Transport(String),
    /// An event stream broke after delivering `events` new events.
    StreamBroken {
        /// New events this connection delivered.
        events: u64,
    },
    /// An event stream stayed silent past the idle timeout, after
    /// delivering `events` new events; the client dropped it.
    StreamIdle {
        /// New events this connection delivered.
        events: u64,
    },
}

impl fmt::Display for AttemptEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(s) => write!(f, "status {s}"),
            Self::Timeout => f.write_str("attempt timeout"),
            Self::Connect => f.write_str("connection refused or unreachable"),
            Self::Transport(e) => write!(f, "connection broke: {e}"),
            Self::StreamBroken { events } => write!(f, "stream broke after {events} new events"),
            Self::StreamIdle { events } => {
                write!(f, "stream went silent after {events} new events")
            }
        }
    }
}

/// Why the client stopped retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// [`RetryPolicy::attempts`] attempts in a row failed.
    Attempts(u32),
    /// The next attempt could not start before [`RetryPolicy::deadline`]
    /// (the server's delay, or the backoff, would end after it).
    Deadline(Duration),
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Attempts(n) => write!(f, "{n} attempts in a row failed"),
            Self::Deadline(d) => write!(f, "the next attempt would start after the {d:?} deadline"),
        }
    }
}

/// Counts attempts, computes waits, and keeps the log.
#[derive(Debug)]
pub(crate) struct Retrier {
    policy: RetryPolicy,
    /// Start of the deadline's clock (reset on stream progress).
    started: Instant,
    /// Failed attempts since the start or the last progress.
    failures: u32,
    log: Vec<ClientAttempt>,
}

impl Retrier {
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            started: Instant::now(),
            failures: 0,
            log: Vec::new(),
        }
    }

    pub(crate) fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The timeout of the attempt about to start: the policy's, shortened
    /// to what is left of the deadline.
    pub(crate) fn attempt_timeout(&self) -> Option<Duration> {
        let timeout = self.policy.attempt_timeout?;
        Some(match self.policy.deadline {
            Some(deadline) => timeout.min(deadline.saturating_sub(self.started.elapsed())),
            None => timeout,
        })
    }

    /// Logs an attempt that ends the operation (success or final status).
    pub(crate) fn last(&mut self, outcome: AttemptEnd) {
        self.push(outcome, None);
    }

    /// Logs a failed attempt and decides: the wait before the next attempt
    /// (the server's `asked` delay if any, cut to the policy's
    /// `max_server_delay`, else the backoff), or why there is none.
    pub(crate) fn failed(
        &mut self,
        outcome: AttemptEnd,
        asked: Option<Delay>,
    ) -> Result<Duration, GiveUpReason> {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.policy.attempts.max(1) {
            self.push(outcome, None);
            return Err(GiveUpReason::Attempts(self.policy.attempts.max(1)));
        }
        let delay = match asked {
            Some(asked) => asked.at_most(self.policy.max_server_delay),
            None => Delay::new(self.policy.backoff(self.failures - 1), DelaySource::Backoff),
        };
        if let Some(deadline) = self.policy.deadline
            && self.started.elapsed().saturating_add(delay.duration) >= deadline
        {
            self.push(outcome, None);
            return Err(GiveUpReason::Deadline(deadline));
        }
        self.push(outcome, Some(delay));
        Ok(delay.duration)
    }

    /// Takes back the last entry (a stream's head, logged as a success) so
    /// that the same attempt can be logged again as it really ended.
    pub(crate) fn reopen_last(&mut self) {
        self.log.pop();
    }

    /// A stream delivered new events: the attempt count and the deadline
    /// start again.
    pub(crate) fn progress(&mut self) {
        self.failures = 0;
        self.started = Instant::now();
    }

    pub(crate) fn log(&self) -> &[ClientAttempt] {
        &self.log
    }

    pub(crate) fn attempts(&self) -> u32 {
        u32::try_from(self.log.len()).unwrap_or(u32::MAX)
    }

    pub(crate) fn into_log(self) -> Vec<ClientAttempt> {
        self.log
    }

    fn push(&mut self, outcome: AttemptEnd, delay: Option<Delay>) {
        let number = self.attempts().saturating_add(1);
        self.log.push(ClientAttempt {
            number,
            end: outcome,
            delay,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Jitter;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(1),
            jitter: Jitter::None,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn attempts_are_bounded_and_logged() {
        let mut r = Retrier::new(policy());
        assert_eq!(
            r.failed(AttemptEnd::Timeout, None),
            Ok(Duration::from_millis(100))
        );
        let asked = Delay::new(Duration::from_secs(7), DelaySource::RetryAfterSeconds);
        assert_eq!(
            r.failed(AttemptEnd::Status(StatusCode::CONFLICT), Some(asked)),
            Ok(Duration::from_secs(7)),
            "a server's delay is honoured whole, beyond the backoff cap, up to max_server_delay"
        );
        assert_eq!(
            r.failed(AttemptEnd::Connect, None),
            Err(GiveUpReason::Attempts(3))
        );
        let log = r.log();
        assert_eq!(log.len(), 3);
        assert_eq!(log[1].number, 2);
        assert_eq!(log[1].delay, Some(asked));
        assert_eq!(log[2].delay, None);
    }

    #[test]
    fn progress_restarts_the_count() {
        let mut r = Retrier::new(RetryPolicy {
            attempts: 2,
            ..policy()
        });
        for _ in 0..5 {
            assert!(
                r.failed(AttemptEnd::StreamBroken { events: 1 }, None)
                    .is_ok()
            );
            r.progress();
        }
        assert!(r.failed(AttemptEnd::Timeout, None).is_ok());
        assert!(r.failed(AttemptEnd::Timeout, None).is_err());
        assert_eq!(r.attempts(), 7);
    }

    #[test]
    fn a_servers_delay_is_cut_to_max_server_delay_whatever_its_source() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.max_server_delay, Duration::from_secs(60));
        assert_eq!(policy.deadline, Some(Duration::from_secs(30 * 60)));
        for source in [
            DelaySource::RetryAfterMs,
            DelaySource::RetryAfterSeconds,
            DelaySource::RetryAfterDate,
            DelaySource::StreamRetry,
        ] {
            let mut r = Retrier::new(RetryPolicy {
                attempts: 5,
                ..RetryPolicy::default()
            });
            let huge = Delay::new(Duration::from_secs(1_000_000_000), source);
            assert_eq!(
                r.failed(AttemptEnd::Timeout, Some(huge)),
                Ok(Duration::from_secs(60))
            );
            let max = Delay::new(Duration::MAX, source);
            assert_eq!(
                r.failed(AttemptEnd::Timeout, Some(max)),
                Ok(Duration::from_secs(60))
            );
            let within = Delay::new(Duration::from_secs(59), source);
            assert_eq!(
                r.failed(AttemptEnd::Timeout, Some(within)),
                Ok(Duration::from_secs(59))
            );
            let log = r.log();
            assert_eq!(
                log[0].delay,
                Some(Delay::capped(Duration::from_secs(60), source))
            );
            assert!(log[0].delay.is_some_and(|d| d.capped));
            assert_eq!(log[2].delay, Some(within), "not capped");
        }
    }

    #[test]
    fn the_default_deadline_bounds_a_cap_set_past_it() {
        let mut r = Retrier::new(RetryPolicy {
            max_server_delay: Duration::from_secs(24 * 3600),
            ..RetryPolicy::default()
        });
        let huge = Delay::new(
            Duration::from_secs(1_000_000_000),
            DelaySource::RetryAfterDate,
        );
        assert_eq!(
            r.failed(
                AttemptEnd::Status(StatusCode::SERVICE_UNAVAILABLE),
                Some(huge)
            ),
            Err(GiveUpReason::Deadline(Duration::from_secs(30 * 60)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_refuses_a_wait_that_ends_after_it() {
        let mut r = Retrier::new(RetryPolicy {
            attempts: 10,
            deadline: Some(Duration::from_secs(10)),
            attempt_timeout: Some(Duration::from_secs(4)),
            ..policy()
        });
        assert_eq!(r.attempt_timeout(), Some(Duration::from_secs(4)));
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(
            r.attempt_timeout(),
            Some(Duration::from_secs(2)),
            "shortened to what is left"
        );
        let asked = Delay::new(Duration::from_secs(3), DelaySource::RetryAfterSeconds);
        assert_eq!(
            r.failed(
                AttemptEnd::Status(StatusCode::TOO_MANY_REQUESTS),
                Some(asked)
            ),
            Err(GiveUpReason::Deadline(Duration::from_secs(10)))
        );
    }
}
