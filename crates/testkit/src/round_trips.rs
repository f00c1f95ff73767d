//! The steps of the tests that count what a store sends to its server
//! (statements, script calls): a warm-up that uses every operation once,
//! first executions and replays, and the polls that wait for timeline
//! entries written in the background (each poll is a read the test
//! subtracts).

use std::time::Duration;

use idemgate_engine::{AttemptOutcome, Claim, Engine, Executed, Fenced, ScopedKey, Store};

use crate::{acquired, complete_executed, executed, fp, fresh_key};

/// Lease and record lifetime of the counted operations: nothing expires
/// during a test.
const LONG: Duration = Duration::from_secs(300);

/// Uses every operation of `store` once on a fresh key (claim, renew,
/// release, record an attempt, get, timeline; then claim and complete), so
/// that what a test counts next is not the first use of a statement or a
/// script.
pub async fn warm_up(store: &dyn Store) {
    let warm = fresh_key();
    let mut lease = acquired(store.claim(&warm, &fp("{}"), LONG).await.unwrap());
    assert_eq!(
        store.renew(&mut lease, LONG).await.unwrap(),
        Fenced::Applied
    );
    let _ = store.release(&lease, &executed(), LONG).await.unwrap();
    store
        .record_attempt(&warm, &executed(), LONG)
        .await
        .unwrap();
    store.get(&warm).await.unwrap();
    timeline_reaches(store, &warm, 2).await;
    assert_eq!(
        claim_and_complete(store, &warm, b"w").await,
        Fenced::Applied
    );
}

/// Polls `key`'s timeline until it holds `n` entries; returns how many
/// timeline reads that took. Panics after 200 reads.
pub async fn timeline_reaches(store: &dyn Store, key: &ScopedKey, n: usize) -> u64 {
    for reads in 1..=200 {
        if store.timeline(key).await.unwrap().len() >= n {
            return reads;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timeline of {key:?} never reached {n} entries");
}

/// Records one attempt for a fresh key and waits until it has landed:
/// the first use of the background writer's batch.
pub async fn warm_up_timeline(store: &dyn Store) {
    let warm = fresh_key();
    store
        .record_attempt(&warm, &executed(), LONG)
        .await
        .unwrap();
    timeline_reaches(store, &warm, 1).await;
}

/// Claims `key`, which must be free, and completes it with `payload`;
/// returns what the completion said.
pub async fn claim_and_complete(
    store: &dyn Store,
    key: &ScopedKey,
    payload: &'static [u8],
) -> Fenced {
    let lease = acquired(store.claim(key, &fp("{}"), LONG).await.unwrap());
    complete_executed(store, &lease, payload, LONG).await
}

/// Claims `key`, which must hold a DONE record: a replay.
pub async fn claim_done(store: &dyn Store, key: &ScopedKey) {
    let claim = store.claim(key, &fp("{}"), LONG).await.unwrap();
    assert!(matches!(claim, Claim::Existing(ref r) if r.is_done()));
}

/// Runs `key` through `engine` with work that answers `value`.
pub async fn run(engine: &Engine, key: &ScopedKey, value: u8) -> Executed<u8> {
    engine
        .execute(
            key,
            &fp("{}"),
            || async move { Ok::<_, std::io::Error>(value) },
        )
        .await
        .unwrap()
}

/// Records `n` replayed attempts for `key` without yielding, their
/// latencies 0, 1, … (their order, to check); the store may batch them.
pub async fn record_replays(store: &dyn Store, key: &ScopedKey, n: u64) {
    for i in 0..n {
        let mut a = executed();
        a.outcome = AttemptOutcome::Replayed;
        a.latency_us = i;
        store.record_attempt(key, &a, LONG).await.unwrap();
    }
}

/// Asserts that `key`'s timeline holds exactly the `n` entries
/// [`record_replays`] wrote, in order.
pub async fn assert_replays_in_order(store: &dyn Store, key: &ScopedKey, n: u64) {
    let tl = store.timeline(key).await.unwrap();
    assert_eq!(u64::try_from(tl.len()).unwrap(), n);
    assert!(tl.iter().map(|a| a.latency_us).eq(0..n), "in order");
}
