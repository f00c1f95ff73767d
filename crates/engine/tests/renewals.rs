//! Lease renewals without a task per claim: a run that ends within half a
//! heartbeat interval spawns nothing and sends no renewal; a longer run is
//! renewed every interval from its claim, as long as it runs, and not a
//! moment after it ends (completed, released or dropped).
//!
//! The schedule tests run on tokio's paused clock, so their counts are
//! exact. The race test runs many overlapping runs on two workers in real
//! time, with a contender trying each long run's key before it ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Begin, Completion, Engine, Fenced, LeaseGuard, MemoryStore, Policy, ScopedKey, Store,
};
use idemgate_testkit::counting::{Calls, CountingStore};
use idemgate_testkit::{fp, fresh_key};

/// Heartbeat interval: a third of the lease.
const EVERY: Duration = Duration::from_secs(1);

fn engine(pending_ttl: Duration) -> (Engine, Arc<Calls>) {
    let store = CountingStore::new(Arc::new(MemoryStore::new()));
    let calls = store.calls();
    let engine = Engine::new(Arc::new(store) as Arc<dyn Store>)
        .with_policy(Policy::default().pending_ttl(pending_ttl));
    (engine, calls)
}

async fn owner(engine: &Engine, key: &ScopedKey) -> LeaseGuard {
    match engine.begin(key, &fp("renewals")).await.expect("begin") {
        Begin::Owner(guard) => guard,
        other => panic!("expected to own the key, got {other:?}"),
    }
}

/// Completes `guard` with a small result and asserts the write was applied.
async fn complete(guard: LeaseGuard, status: Option<u16>) {
    let written = guard
        .complete(Bytes::from_static(b"ok"), Completion::result(status))
        .await;
    assert_eq!(written.expect("complete"), Fenced::Applied);
}

/// What a paused-clock test checks once its runs have ended: the store
/// calls counted, and how many tasks are alive while nothing but the
/// engine's ticker runs.
struct Rest {
    calls: Arc<Calls>,
    idle: usize,
}

impl Rest {
    /// Lets `quiet` pass, then asserts that `sent` renewals were sent in
    /// all and that no task besides the ticker is alive.
    async fn settles(&self, quiet: Duration, sent: usize, task: &str) {
        tokio::time::sleep(quiet).await;
        assert_eq!(renewals(&self.calls), sent);
        assert_eq!(alive_tasks(), self.idle, "{task}");
    }
}

/// A paused-clock test's engine (a lease of three intervals), and its
/// [`Rest`].
fn engine_at_rest() -> (Engine, Rest) {
    let (engine, calls) = engine(EVERY * 3);
    let idle = alive_tasks() + 1;
    (engine, Rest { calls, idle })
}

fn renewals(calls: &Calls) -> usize {
    calls.renew.load(Ordering::SeqCst)
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// 200 overlapping runs, each shorter than half the interval: no renewal,
/// and the only task they leave is the engine's ticker.
#[tokio::test(start_paused = true)]
async fn short_runs_spawn_nothing_and_send_no_renewal() {
    let (engine, rest) = engine_at_rest();
    let runs: Vec<_> = (0..200u64)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let guard = owner(&engine, &fresh_key()).await;
                tokio::time::sleep(Duration::from_millis(i * 2)).await;
                complete(guard, Some(200)).await;
            })
        })
        .collect();
    for run in runs {
        run.await.expect("run");
    }
    rest.settles(EVERY * 60, 0, "a task besides the ticker is alive")
        .await;
}

/// A run of 3.5 intervals is renewed at 1, 2 and 3 intervals, and not
/// after it completes.
#[tokio::test(start_paused = true)]
async fn a_long_run_is_renewed_every_interval_until_it_completes() {
    let (engine, rest) = engine_at_rest();
    let claimed = tokio::time::Instant::now();
    let guard = owner(&engine, &fresh_key()).await;
    tokio::time::sleep(EVERY / 2 - Duration::from_millis(1)).await;
    assert_eq!(
        alive_tasks(),
        rest.idle,
        "a heartbeat task before half the interval"
    );
    for due in 1..=3u32 {
        tokio::time::sleep_until(claimed + EVERY * due - Duration::from_millis(1)).await;
        assert_eq!(
            renewals(&rest.calls),
            due as usize - 1,
            "renewal {due} early"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(renewals(&rest.calls), due as usize, "renewal {due} late");
    }
    tokio::time::sleep(EVERY / 2).await;
    complete(guard, Some(200)).await;
    rest.settles(EVERY * 10, 3, "the heartbeat outlived its run")
        .await;
}

/// A run that gets its heartbeat task (past half the interval) but ends
/// before its first renewal sends none; a run dropped after two renewals
/// is released and sends no third.
#[tokio::test(start_paused = true)]
async fn runs_that_end_stop_their_heartbeat() {
    let (engine, rest) = engine_at_rest();
    let guard = owner(&engine, &fresh_key()).await;
    tokio::time::sleep(EVERY * 9 / 10).await;
    assert_eq!(
        alive_tasks(),
        rest.idle + 1,
        "no heartbeat task past half the interval"
    );
    let released = guard.release(Some(500)).await.expect("release");
    assert_eq!(released, Fenced::Applied);
    rest.settles(EVERY * 5, 0, "the released run's heartbeat is alive")
        .await;

    let k = fresh_key();
    let guard = owner(&engine, &k).await;
    tokio::time::sleep(EVERY * 5 / 2).await;
    assert_eq!(renewals(&rest.calls), 2);
    drop(guard);
    tokio::time::sleep(EVERY * 5).await;
    assert_eq!(renewals(&rest.calls), 2);
    assert_eq!(
        rest.calls.release.load(Ordering::SeqCst),
        2,
        "the dropped run was not released"
    );
    assert!(engine.store().get(&k).await.expect("get").is_none());
}

/// An engine first used on a runtime that has shut down still renews on
/// the next one: the claim there starts a ticker of its own.
#[test]
fn a_runtime_after_a_shut_down_one_gets_its_own_ticker() {
    let (engine, calls) = engine(EVERY * 3);
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    first.block_on(async {
        complete(owner(&engine, &fresh_key()).await, None).await;
    });
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    second.block_on(async {
        let guard = owner(&engine, &fresh_key()).await;
        tokio::time::sleep(EVERY * 5 / 2).await;
        assert_eq!(renewals(&calls), 2);
        complete(guard, None).await;
    });
}

/// 300 overlapping runs of 0 to 3 s on two workers, with a lease of 1.5 s
/// (renewed every 0.5 s): registrations, ends and the ticker's hand-outs
/// race. Every run past its lease keeps its key (a contender trying it
/// shortly before the run ends is refused), every run's result is stored,
/// and once all have ended no renewal is sent any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_runs_on_two_workers_keep_their_keys() {
    let lease = Duration::from_millis(1500);
    let (engine, calls) = engine(lease);
    let runs: Vec<_> = (0..300u64)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let k = fresh_key();
                let length = Duration::from_millis((i * 37) % 3000);
                let guard = owner(&engine, &k).await;
                if length > lease {
                    tokio::time::sleep(length - Duration::from_millis(100)).await;
                    let contender = engine.begin(&k, &fp("renewals")).await.expect("begin");
                    assert!(
                        matches!(contender, Begin::Inflight(_)),
                        "a run of {length:?} lost its key: {contender:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    tokio::time::sleep(length).await;
                }
                complete(guard, Some(200)).await;
            })
        })
        .collect();
    for run in runs {
        run.await.expect("run");
    }
    assert!(renewals(&calls) > 0, "no run was renewed");
    let after = renewals(&calls);
    tokio::time::sleep(lease).await;
    assert_eq!(renewals(&calls), after, "renewals after every run ended");
}
