//! `LeaseGuard::complete` with `Completion::holding`: a result is not
//! thrown away because the store blinked when it was written. The store
//! here is the memory store behind testkit's `BlinkingStore`, whose
//! switches make `complete` (and, in one case, `renew`) fail with
//! temporary errors, apply the write and then lose its reply, or refuse
//! it for good.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    AttemptOutcome, Begin, Claim, ClientKey, Completion, Engine, Fenced, Lease, LeaseGuard,
    MemoryStore, Policy, ScopedKey, Store, StoreError, StoreErrorKind,
};
use idemgate_testkit::{BlinkingStore, Switches, fp};

struct Setup {
    store: Arc<BlinkingStore>,
    faults: Arc<Switches>,
    engine: Engine,
    key: ScopedKey,
}

fn setup(pending_ttl: Duration) -> Setup {
    let store = Arc::new(BlinkingStore::new(Arc::new(MemoryStore::new())));
    let faults = store.switches();
    let policy = Policy {
        pending_ttl,
        heartbeat: Some(pending_ttl / 4),
        ..Policy::default()
    };
    let engine = Engine::new(Arc::clone(&store) as Arc<dyn Store>).with_policy(policy);
    let key = ScopedKey::new("t", "hold", ClientKey::parse(&rand_key()).unwrap());
    Setup {
        store,
        faults,
        engine,
        key,
    }
}

fn rand_key() -> String {
    format!("k-{}", Lease::new_token())
}

/// A fresh setup with a lease of `pending_ttl`, and the guard of its key.
async fn owned(pending_ttl: Duration) -> (Setup, LeaseGuard) {
    let s = setup(pending_ttl);
    match s.engine.begin(&s.key, &fp("hold")).await.expect("begin") {
        Begin::Owner(guard) => (s, guard),
        other => panic!("expected to own the key, got {other:?}"),
    }
}

async fn executed(s: &Setup) -> usize {
    s.store
        .timeline(&s.key)
        .await
        .unwrap()
        .iter()
        .filter(|a| a.outcome == AttemptOutcome::Executed)
        .count()
}

/// Completes `guard` with `payload`, holding the result through temporary
/// store errors; returns the outcome and how many times it held.
async fn complete_holding(
    guard: LeaseGuard,
    payload: &'static [u8],
    status: Option<u16>,
) -> (Result<Fenced, StoreError>, usize) {
    let mut held = 0;
    let written = guard
        .complete(
            Bytes::from_static(payload),
            Completion::result(status).holding(&mut |_| held += 1),
        )
        .await;
    (written, held)
}

/// The store refuses the completion for longer than the lease lasts
/// unrenewed; the heartbeat keeps the lease meanwhile, nobody else can
/// take the key, and the result lands once the store is back.
#[tokio::test]
async fn a_result_is_held_across_a_blink_longer_than_the_lease() {
    let (s, guard) = owned(Duration::from_millis(400)).await;
    s.faults.complete_down.store(true, Ordering::SeqCst);
    let held = Arc::new(AtomicUsize::new(0));
    let writing = {
        let held = Arc::clone(&held);
        tokio::spawn(async move {
            let mut on_held = move |e: &StoreError| {
                assert!(e.is_temporary());
                held.fetch_add(1, Ordering::SeqCst);
            };
            let how = Completion::result(Some(200)).holding(&mut on_held);
            guard.complete(Bytes::from_static(b"r"), how).await
        })
    };
    // Wait past twice the lease while the completion keeps failing.
    for _ in 0..200 {
        if s.faults.completes.load(Ordering::SeqCst) >= 6 || writing.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !writing.is_finished(),
        "the owner gave up while its lease was kept"
    );
    match s
        .store
        .claim(&s.key, &fp("hold"), Duration::from_secs(1))
        .await
    {
        Ok(Claim::Existing(rec)) => assert!(!rec.is_done()),
        other => panic!("the held key was taken over: {other:?}"),
    }
    s.faults.complete_down.store(false, Ordering::SeqCst);
    let written = writing.await.unwrap().expect("completed after the blink");
    assert_eq!(written, Fenced::Applied);
    assert!(held.load(Ordering::SeqCst) >= 6);
    let rec = s.store.get(&s.key).await.unwrap().expect("a record");
    assert_eq!(rec.payload(), Some(&Bytes::from_static(b"r")));
    assert_eq!(executed(&s).await, 1);
}

/// The write lands but its reply is lost: the retry is acknowledged, the
/// record is DONE once.
#[tokio::test]
async fn a_lost_reply_is_retried_into_one_completion() {
    let (s, guard) = owned(Duration::from_secs(5)).await;
    s.faults.lose_next_reply.store(true, Ordering::SeqCst);
    let (written, held) = complete_holding(guard, b"once", Some(200)).await;
    assert_eq!(written.expect("completed"), Fenced::Applied);
    assert_eq!(held, 1);
    assert_eq!(s.faults.completes.load(Ordering::SeqCst), 2);
    assert_eq!(executed(&s).await, 1);
}

/// When neither the completion nor the heartbeat gets through, the owner
/// gives up before its lease may lapse, with the store's temporary error;
/// the key is released once the store is back.
#[tokio::test]
async fn the_owner_gives_up_before_the_lease_may_lapse() {
    let (s, guard) = owned(Duration::from_millis(500)).await;
    s.faults.complete_down.store(true, Ordering::SeqCst);
    s.faults.renew_down.store(true, Ordering::SeqCst);
    let (written, held) = complete_holding(guard, b"r", Some(200)).await;
    let err = written.expect_err("completed while the store was down");
    assert!(err.is_temporary());
    assert!(held >= 1);
    // Still within the lease: nobody else took the key.
    assert!(
        s.store
            .get(&s.key)
            .await
            .unwrap()
            .is_some_and(|r| !r.is_done())
    );
    s.faults.renew_down.store(false, Ordering::SeqCst);
    s.faults.complete_down.store(false, Ordering::SeqCst);
    let mut released = false;
    for _ in 0..100 {
        if s.store.get(&s.key).await.unwrap().is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "the key was not given back");
}

/// A permanent error is not retried.
#[tokio::test]
async fn a_permanent_error_is_not_retried() {
    let (s, guard) = owned(Duration::from_secs(5)).await;
    s.faults.refuse_next_complete.store(true, Ordering::SeqCst);
    let (written, held) = complete_holding(guard, b"r", None).await;
    let err = written.expect_err("a refused completion");
    assert_eq!(err.kind(), StoreErrorKind::Rejected);
    assert_eq!(held, 0);
    assert_eq!(s.faults.completes.load(Ordering::SeqCst), 1);
}
