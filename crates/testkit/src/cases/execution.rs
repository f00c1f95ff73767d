//! Cases through the engine: racing claimers, work that fails, panics or
//! is cancelled, waiting on a key in flight, the heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemgate_engine::{
    AttemptOutcome, Begin, Claim, Completion, Engine, ExecuteError, Fenced, OnInflight, Policy,
    ScopedKey, Settled, Store,
};

use super::{Shows, assert_only_the_new_owner_completes, complete, eventually_shows, outcomes};
use crate::{LONG, SHORT_TTL, acquired, attempt, fp, fresh_key, payload};

/// 64 concurrent claimers on one key: exactly one wins, every time.
pub async fn race_one_winner(store: Arc<dyn Store>) {
    const CLAIMERS: usize = 64;
    const ROUNDS: usize = 30;
    for round in 0..ROUNDS {
        let key = fresh_key();
        let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
        let mut tasks = Vec::with_capacity(CLAIMERS);
        for _ in 0..CLAIMERS {
            let (store, key, barrier) = (Arc::clone(&store), key.clone(), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&key, &fp("race"), LONG).await
            }));
        }
        let mut winners = 0;
        for t in tasks {
            match t.await.unwrap().unwrap() {
                Claim::Acquired(_) => winners += 1,
                Claim::Existing(r) => assert_eq!(r.fingerprint, fp("race")),
            }
        }
        assert_eq!(winners, 1, "round {round}: {winners} claimers won one key");
    }
}

/// 64 concurrent `execute` calls that wait: the work runs once, every caller
/// gets its value.
pub async fn race_execute_once(store: Arc<dyn Store>) {
    const CALLERS: usize = 64;
    const ROUNDS: usize = 10;
    let engine = Engine::new(Arc::clone(&store))
        .with_policy(Policy::default().on_inflight(OnInflight::Wait(Duration::from_secs(20))));
    for _ in 0..ROUNDS {
        let key = fresh_key();
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(CALLERS));
        let mut tasks = Vec::new();
        for i in 0..CALLERS {
            let (engine, key, runs, barrier) = (
                engine.clone(),
                key.clone(),
                Arc::clone(&runs),
                Arc::clone(&barrier),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                engine
                    .execute(&key, &fp("same"), || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        Ok::<_, std::io::Error>(format!("value-from-{i}"))
                    })
                    .await
            }));
        }
        let mut values = Vec::new();
        for t in tasks {
            values.push(t.await.unwrap().unwrap().value);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(
            values.windows(2).all(|w| w[0] == w[1]),
            "callers saw different values"
        );
    }
}

/// An error inside the work releases the key at once.
pub async fn error_releases_key(store: Arc<dyn Store>) {
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&store));
    let r = engine
        .execute(&key, &fp("a"), || async {
            Err::<u8, _>(std::io::Error::other("upstream 503"))
        })
        .await;
    assert!(matches!(r, Err(ExecuteError::Work(_))));
    let again = engine
        .execute(&key, &fp("a"), || async { Ok::<_, std::io::Error>(1u8) })
        .await
        .unwrap();
    assert!(!again.replayed(), "retry after a failure must run the work");
}

/// A panic inside the work releases the key (and the panic goes on).
pub async fn panic_releases_key(store: Arc<dyn Store>) {
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&store));
    let (e2, k2) = (engine.clone(), key.clone());
    let joined = tokio::spawn(async move {
        e2.execute(&k2, &fp("a"), || async { Ok::<u8, std::io::Error>(boom()) })
            .await
    })
    .await;
    assert!(joined.expect_err("panic must propagate").is_panic());
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "panic must release before unwinding on"
    );
}

fn boom() -> u8 {
    panic!("work panicked")
}

/// Dropping the `execute` future (cancellation) releases the key.
pub async fn cancel_releases_key(store: Arc<dyn Store>) {
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&store));
    let (e2, k2) = (engine.clone(), key.clone());
    let task = tokio::spawn(async move {
        e2.execute(&k2, &fp("a"), || async {
            tokio::time::sleep(LONG).await;
            Ok::<u8, std::io::Error>(0)
        })
        .await
    });
    let claimed = eventually_shows(&store, &key, Shows::Record(true)).await;
    assert!(claimed, "work never claimed the key");
    task.abort();
    let released = eventually_shows(&store, &key, Shows::Record(false)).await;
    assert!(released, "cancelled work left the key PENDING");
}

/// `Reject`: a caller meeting a PENDING key is refused with a Retry-After
/// hint, and the handle it gets resolves when the owner finishes.
pub async fn inflight_reject_and_notify(store: Arc<dyn Store>) {
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&store))
        .with_policy(Policy::default().on_inflight(OnInflight::Reject));
    let Begin::Owner(guard) = engine.begin(&key, &fp("a")).await.unwrap() else {
        panic!("first begin must own the key");
    };
    let rejected = engine
        .execute(&key, &fp("a"), || async { Ok::<_, std::io::Error>(0u8) })
        .await;
    let Err(ExecuteError::Inflight(handle)) = rejected else {
        panic!("expected Inflight, got {rejected:?}");
    };
    assert!(handle.retry_after() >= Duration::from_secs(1));
    let waiter = tokio::spawn(async move { handle.settled(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let w = guard
        .complete(payload(b"5"), Completion::result(Some(200)))
        .await
        .unwrap();
    assert_eq!(w, Fenced::Applied);
    match waiter.await.unwrap().unwrap() {
        Settled::Done(r) => assert_eq!(r.payload().map(|p| p.to_vec()), Some(b"5".to_vec())),
        other => panic!("expected Done, got {other:?}"),
    }
}

/// A long run keeps its key through the engine's heartbeat even though
/// `pending_ttl` is shorter than the run.
pub async fn heartbeat_outlives_pending_ttl(store: Arc<dyn Store>) {
    let key = fresh_key();
    // A duplicate is refused at once while the key is held (not made to
    // wait), so the test sees whether the key is still held.
    let policy = Policy::default()
        .pending_ttl(SHORT_TTL)
        .on_inflight(OnInflight::Reject);
    let engine = Engine::new(Arc::clone(&store)).with_policy(policy);
    let runs = Arc::new(AtomicUsize::new(0));
    let (e2, k2, r2) = (engine.clone(), key.clone(), Arc::clone(&runs));
    let long = tokio::spawn(async move {
        e2.execute(&k2, &fp("a"), || async move {
            r2.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(SHORT_TTL * 3).await;
            Ok::<_, std::io::Error>(1u8)
        })
        .await
    });
    tokio::time::sleep(SHORT_TTL * 2).await;
    let dup = engine
        .execute(&key, &fp("a"), || async { Ok::<_, std::io::Error>(2u8) })
        .await;
    assert!(matches!(dup, Err(ExecuteError::Inflight(_))), "{dup:?}");
    assert_eq!(long.await.unwrap().unwrap().value, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Forget deletes a DONE or a PENDING record and notes it in the timeline;
/// the next claim acquires the key with a greater fence, and a forgotten
/// owner is fenced. A key with no record is left alone.
pub async fn forget_clears_the_key(store: Arc<dyn Store>) {
    // Stamped when used: timelines are ordered by the attempts' own time.
    let forgotten = || attempt(AttemptOutcome::Forgotten);
    let key = fresh_key();
    assert!(!store.forget(&key, &forgotten(), LONG).await.unwrap());
    assert!(store.timeline(&key).await.unwrap().is_empty());

    // DONE → absent.
    let first = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let done = attempt(AttemptOutcome::OutcomeUnknown);
    let w = complete(&*store, &first, b"unknown", LONG, &done).await;
    assert_eq!(w, Fenced::Applied);
    assert!(store.forget(&key, &forgotten(), LONG).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
    let outcomes = outcomes(&*store, &key).await;
    assert_eq!(
        outcomes,
        [AttemptOutcome::OutcomeUnknown, AttemptOutcome::Forgotten]
    );

    // PENDING → absent; the next owner's fence is greater, the old one is
    // fenced.
    let second = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert!(second.fence > first.fence);
    assert!(store.forget(&key, &forgotten(), LONG).await.unwrap());
    let third = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert!(third.fence > second.fence);
    assert_only_the_new_owner_completes(&*store, &key, &second, &third).await;

    // Another tenant's record with the same client key is untouched.
    let other = ScopedKey::new("someone-else", key.namespace.clone(), key.key.clone());
    acquired(store.claim(&other, &fp("a"), LONG).await.unwrap());
    assert!(store.forget(&key, &forgotten(), LONG).await.unwrap());
    assert!(store.get(&other).await.unwrap().is_some());
}
