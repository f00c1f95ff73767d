//! The workload: every operation's key, and the latency of each of its
//! attempts and each backoff sleep, drawn once from `--seed` so both runs
//! face exactly the same conditions.

use std::time::Duration;

use idemgate_check::{Backoff, Jitter};
use idemgate_engine::ClientKey;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Timing;

/// One business operation: a report for one account.
#[derive(Clone, Debug)]
pub(crate) struct Operation {
    /// Business id (`report-07`), what the ledger charges under.
    pub(crate) id: String,
    /// The account charged.
    pub(crate) account: String,
    /// Minted once, before the first attempt, and sent on every attempt.
    pub(crate) key: ClientKey,
    /// How long the LLM takes on attempt `i`.
    pub(crate) latencies: Vec<Duration>,
    /// Sleep before retry `i` (full jitter under the capped doubling).
    pub(crate) backoffs: Vec<Duration>,
}

fn uniform(rng: &mut StdRng, min: Duration, max: Duration) -> Duration {
    let (lo, hi) = (min.as_millis() as u64, max.as_millis() as u64);
    Duration::from_millis(rng.random_range(lo..=hi.max(lo)))
}

pub(crate) fn workload(n: usize, seed: u64, t: &Timing) -> Vec<Operation> {
    let mut rng = StdRng::seed_from_u64(seed);
    let backoff = Backoff::new(t.backoff_base, t.backoff_cap, Jitter::Full);
    (0..n)
        .map(|i| {
            let latencies = (0..t.attempts)
                .map(|_| uniform(&mut rng, t.latency_min, t.latency_max))
                .collect();
            let backoffs = (0..t.attempts.saturating_sub(1))
                .map(|retry| backoff.sleep_with(retry, &mut rng))
                .collect();
            Operation {
                id: format!("report-{:02}", i + 1),
                account: format!("acct-{:02}", i + 1),
                key: ClientKey::mint(),
                latencies,
                backoffs,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_within_bounds() {
        let t = Timing::new(false);
        let a = workload(12, 7, &t);
        let b = workload(12, 7, &t);
        let c = workload(12, 8, &t);
        let sched = |w: &[Operation]| -> Vec<(Vec<Duration>, Vec<Duration>)> {
            w.iter()
                .map(|o| (o.latencies.clone(), o.backoffs.clone()))
                .collect()
        };
        assert_eq!(sched(&a), sched(&b));
        assert_ne!(sched(&a), sched(&c));
        for op in &a {
            assert_eq!(op.latencies.len(), 3);
            assert_eq!(op.backoffs.len(), 2);
            assert!(
                op.latencies
                    .iter()
                    .all(|l| (t.latency_min..=t.latency_max).contains(l))
            );
            assert!(op.backoffs[0] <= t.backoff_base);
            assert!(op.backoffs[1] <= t.backoff_base * 2);
        }
        // Keys are per operation, not per attempt.
        assert_ne!(a[0].key, a[1].key);
    }
}
