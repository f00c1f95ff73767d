//! Unit tests of the parent module.

use super::*;

#[test]
fn concurrent_recording_keeps_exact_totals() {
    let t = Telemetry::fresh();
    let threads = 8u64;
    let per_thread = 5_000u64;
    std::thread::scope(|s| {
        for th in 0..threads {
            let t = t.clone();
            s.spawn(move || {
                for i in 0..per_thread {
                    let outcome = match i % 4 {
                        0 => RequestOutcome::Executed,
                        1 | 2 => RequestOutcome::Replayed,
                        _ => RequestOutcome::UnprotectedNoKey,
                    };
                    t.request(outcome, Some(th * per_thread + i / 4));
                    if i % 10 == 0 {
                        t.inflight_conflict();
                    }
                    t.tokens_saved(3);
                }
            });
        }
    });
    let snap = t.snapshot();
    let n = threads * per_thread;
    // Keyed requests only: the unprotected quarter is not among them.
    assert_eq!(snap.requests_total, n - n / 4);
    assert_eq!(snap.hits, n / 2);
    assert_eq!(snap.inflight_conflicts, threads * (per_thread / 10));
    assert_eq!(snap.tokens_saved, 3 * n);
    let count = |o: RequestOutcome| {
        snap.requests
            .iter()
            .find(|(x, _)| *x == o)
            .map_or(0, |(_, c)| *c)
    };
    assert_eq!(count(RequestOutcome::Executed), n / 4);
    assert_eq!(count(RequestOutcome::UnprotectedNoKey), n / 4);
    // Unkeyed requests do not dilute the ratio: 2 hits per 3 keyed.
    assert!(
        (snap.hit_ratio - 2.0 / 3.0).abs() < 1e-9,
        "{}",
        snap.hit_ratio
    );
    // Each key id got 3 keyed requests plus one unprotected: 4 each.
    assert_eq!(snap.requests_per_key_p50, 4.0);
}

#[test]
fn outcome_labels_are_distinct_and_indexed() {
    let mut seen = std::collections::HashSet::new();
    for (i, o) in RequestOutcome::ALL.iter().enumerate() {
        assert!(seen.insert(o.as_str()));
        assert_eq!(o.index(), i);
    }
}
