//! How long a route's executions take, to tell a client that met its key in
//! flight when to look again.
//!
//! A 409 `in-flight` used to say `Retry-After` = the time left on the
//! holder's lease, which with the heartbeat is most of `pending_ttl`: the
//! SDKs then slept ~30 s for an answer that was ready in 1.5 s. The poll
//! interval is instead a quarter of the route's recent execution latency
//! (an exponentially weighted moving average, so it follows a slowdown
//! within a few executions), clamped to [1 s, 10 s]: a fast route is
//! polled every second, a ten-minute generation every ten seconds, and no
//! client ever sleeps past the lease (it is capped by that too).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The shortest poll interval a 409 advises (`Retry-After` counts whole
/// seconds, and the SDKs treat 0 as "no advice").
pub(crate) const MIN_POLL: Duration = Duration::from_secs(1);
/// The longest poll interval a 409 advises.
pub(crate) const MAX_POLL: Duration = Duration::from_secs(10);
/// The fraction of the latency estimate a client waits before polling.
const POLL_FRACTION: f64 = 0.25;
/// Weight of the newest observation in the moving average.
const ALPHA: f64 = 0.2;

/// The route's execution latency estimate. Lock-free: one atomic holding
/// the average in microseconds (0 until the first observation).
#[derive(Debug, Default)]
pub(crate) struct RouteLatency {
    micros: AtomicU64,
}

impl RouteLatency {
    /// Adds one execution's duration to the estimate.
    pub(crate) fn observe(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // A lost update under contention only drops one sample.
        let old = self.micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (ALPHA * sample as f64 + (1.0 - ALPHA) * old as f64) as u64
        };
        self.micros.store(new.max(1), Ordering::Relaxed);
    }

    /// The current estimate, `None` before any execution ended.
    pub(crate) fn estimate(&self) -> Option<Duration> {
        match self.micros.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// When a client that met the key in flight should poll again: a
    /// quarter of the estimate in [`MIN_POLL`, `MAX_POLL`] (`MIN_POLL`
    /// with no estimate yet), and never past the holder's `lease_left`.
    pub(crate) fn poll_interval(&self, lease_left: Duration) -> Duration {
        let guess = self
            .estimate()
            .map_or(MIN_POLL, |e| e.mul_f64(POLL_FRACTION))
            .clamp(MIN_POLL, MAX_POLL);
        guess.min(lease_left).max(MIN_POLL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_estimate_polls_every_second() {
        let l = RouteLatency::default();
        assert_eq!(l.estimate(), None);
        assert_eq!(l.poll_interval(Duration::from_secs(29)), MIN_POLL);
    }

    #[test]
    fn a_fast_route_polls_at_the_floor_not_the_lease() {
        let l = RouteLatency::default();
        l.observe(Duration::from_millis(1500));
        assert_eq!(l.poll_interval(Duration::from_secs(29)), MIN_POLL);
    }

    #[test]
    fn the_interval_is_a_quarter_of_the_estimate_within_bounds() {
        let l = RouteLatency::default();
        l.observe(Duration::from_secs(20));
        assert_eq!(
            l.poll_interval(Duration::from_secs(29)),
            Duration::from_secs(5)
        );
        let slow = RouteLatency::default();
        slow.observe(Duration::from_secs(600));
        assert_eq!(slow.poll_interval(Duration::from_secs(29)), MAX_POLL);
        // Never past the lease, never under a second.
        assert_eq!(
            slow.poll_interval(Duration::from_secs(3)),
            Duration::from_secs(3)
        );
        assert_eq!(slow.poll_interval(Duration::ZERO), MIN_POLL);
    }

    #[test]
    fn the_estimate_follows_new_observations() {
        let l = RouteLatency::default();
        l.observe(Duration::from_secs(4));
        for _ in 0..50 {
            l.observe(Duration::from_secs(40));
        }
        let e = l.estimate().expect("an estimate");
        assert!(
            e > Duration::from_secs(39) && e <= Duration::from_secs(40),
            "{e:?}"
        );
    }
}
