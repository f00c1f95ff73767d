//! Capped exponential backoff with jitter: the one implementation of the
//! sleep before a retry.
//!
//! Three places need the same arithmetic: the TTL rule, which sizes
//! `done_ttl` from the longest sleeps ([`crate::RetryPolicy`]); the Rust
//! client (`idemgate-client`), which takes the sleeps; and `idemgate demo`,
//! which draws a whole schedule from a seed. They share [`Backoff`], so what
//! `idemgate check` sizes a TTL for is exactly what the client does.
//!
//! It lives in this crate because it is the lowest one the three can share:
//! it depends on no other idemgate crate, and on nothing the client does not
//! already use (serde, rand).

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// How a backoff sleep is randomized (`[client_retry] jitter` in the
/// gateway's configuration: `none`, `full` or `equal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Jitter {
    /// Sleep exactly the computed backoff.
    None,
    /// Sleep uniformly in `[0, backoff]` ("full jitter").
    #[default]
    Full,
    /// Sleep uniformly in `[backoff/2, backoff]` ("equal jitter").
    Equal,
}

impl Jitter {
    /// The configuration's spelling: `none`, `full` or `equal`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Full => "full",
            Self::Equal => "equal",
        }
    }

    /// A sleep of at most `max`, drawn from `rng` as this jitter says.
    pub fn apply<R: Rng + ?Sized>(self, max: Duration, rng: &mut R) -> Duration {
        match self {
            Self::None => max,
            Self::Full => max.mul_f64(rng.random::<f64>()),
            Self::Equal => max / 2 + (max / 2).mul_f64(rng.random::<f64>()),
        }
    }
}

/// Backoff that starts at `base`, doubles for each later retry up to `cap`,
/// and is randomized by `jitter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Sleep before the first retry (before jitter).
    pub base: Duration,
    /// Longest sleep.
    pub cap: Duration,
    /// Randomization of each sleep.
    pub jitter: Jitter,
}

impl Backoff {
    /// Backoff from `base`, doubling up to `cap`, randomized by `jitter`.
    pub const fn new(base: Duration, cap: Duration, jitter: Jitter) -> Self {
        Self { base, cap, jitter }
    }

    /// The longest sleep before retry number `retry` (0-based): jitter only
    /// shortens sleeps, so the bound is `min(cap, base × 2^retry)`. Saturates
    /// instead of overflowing.
    pub fn max(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry);
        self.base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.cap)
    }

    /// A sleep before retry number `retry` (0-based), jitter applied with
    /// the thread's random generator.
    pub fn sleep(&self, retry: u32) -> Duration {
        self.sleep_with(retry, &mut rand::rng())
    }

    /// A sleep before retry number `retry` (0-based), jitter drawn from
    /// `rng` (a seeded one gives a reproducible schedule).
    pub fn sleep_with<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        self.jitter.apply(self.max(retry), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn backoff(jitter: Jitter) -> Backoff {
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(700),
            jitter,
        }
    }

    #[test]
    fn the_bound_doubles_up_to_the_cap_and_saturates() {
        let b = backoff(Jitter::Full);
        let maxes: Vec<u128> = (0..5).map(|r| b.max(r).as_millis()).collect();
        assert_eq!(maxes, [100, 200, 400, 700, 700]);
        assert_eq!(b.max(u32::MAX), Duration::from_millis(700));
        let huge = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::MAX,
            ..b
        };
        assert!(huge.max(200) >= Duration::from_secs(u64::from(u32::MAX)));
    }

    #[test]
    fn jittered_sleeps_stay_within_the_bound() {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
            let b = backoff(jitter);
            for retry in 0..6 {
                for _ in 0..50 {
                    let d = b.sleep(retry);
                    let max = b.max(retry);
                    assert!(d <= max, "{jitter:?}");
                    match jitter {
                        Jitter::None => assert_eq!(d, max),
                        Jitter::Equal => assert!(d >= max / 2),
                        Jitter::Full => {}
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_sleeps() {
        let b = backoff(Jitter::Full);
        let draw = |seed| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            (0..4)
                .map(|r| b.sleep_with(r, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn jitter_is_spelled_as_in_the_configuration() {
        for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
            let json = format!("\"{}\"", jitter.as_str());
            assert_eq!(serde_json::from_str::<Jitter>(&json).ok(), Some(jitter));
        }
        assert!(serde_json::from_str::<Jitter>("\"some\"").is_err());
    }
}
