#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::Fenced;
use crate::{AttemptOutcome, ClientKey, MemoryStore};

const LONG: Duration = Duration::from_secs(3600);

// The engine's own unit tests cannot use `idemgate_testkit::{key_n, fp,
// executed}`: the testkit depends on the engine, so in this crate's test
// build it sees a second copy of the engine whose `ScopedKey` and
// `Attempt` are other types than `crate::`'s.

fn key(n: usize) -> ScopedKey {
    ScopedKey::new("t", "ns", ClientKey::parse(&format!("k{n}")).unwrap())
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_request("POST", "/c", s.as_bytes(), &[])
}

fn attempt() -> Attempt {
    Attempt {
        at_ms: crate::record::now_ms(),
        replica: "r".into(),
        outcome: AttemptOutcome::Executed,
        status: None,
        latency_us: 0,
        repeated: None,
    }
}

/// Leaves `key` DONE with `payload` in `store`, for `ttl`.
async fn done(store: &dyn Store, key: &ScopedKey, payload: &[u8], ttl: Duration) {
    let Claim::Acquired(lease) = store.claim(key, &fp("a"), LONG).await.unwrap() else {
        panic!("fresh key is free");
    };
    let applied = store
        .complete(&lease, Bytes::copy_from_slice(payload), ttl, &attempt())
        .await
        .unwrap();
    assert_eq!(applied, Fenced::Applied);
}

fn hits(c: &CachedStore) -> u64 {
    c.stats().hits.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_copy_is_trusted_for_the_window_then_read_again() {
    let store = Arc::new(MemoryStore::new());
    let cached = CachedStore::new(store.clone(), DEFAULT_BYTES);
    done(&*store, &key(1), b"answer", LONG).await;
    assert!(matches!(
        cached.claim(&key(1), &fp("a"), LONG).await.unwrap(),
        Claim::Existing(_)
    ));
    assert_eq!(hits(&cached), 0, "the first read goes to the store");
    let again = cached.claim(&key(1), &fp("a"), LONG).await.unwrap();
    assert_eq!(hits(&cached), 1, "the second is answered from memory");
    let Claim::Existing(record) = again else {
        panic!("DONE stays DONE");
    };
    assert_eq!(record.payload().unwrap().as_ref(), b"answer");
    tokio::time::advance(TRUST).await;
    cached.claim(&key(1), &fp("a"), LONG).await.unwrap();
    assert_eq!(hits(&cached), 1, "past the window the store is asked again");
}

#[tokio::test(start_paused = true)]
async fn a_record_near_its_expiry_is_not_cached() {
    let store = Arc::new(MemoryStore::new());
    let cached = CachedStore::new(store.clone(), DEFAULT_BYTES);
    done(&*store, &key(1), b"short", EXPIRY_MARGIN).await;
    cached.claim(&key(1), &fp("a"), LONG).await.unwrap();
    cached.claim(&key(1), &fp("a"), LONG).await.unwrap();
    assert_eq!(hits(&cached), 0);
    assert!(cached.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_byte_bound_evicts_the_oldest() {
    let store = Arc::new(MemoryStore::new());
    let payload = vec![b'x'; 1000];
    let per_entry = 1000 + key_bytes(&key(10)) + ENTRY_OVERHEAD;
    let cached = CachedStore::new(store.clone(), 4 * per_entry);
    for n in 10..20 {
        done(&*store, &key(n), &payload, LONG).await;
        cached.get(&key(n)).await.unwrap();
        assert!(cached.bytes() <= 4 * per_entry, "{} bytes", cached.bytes());
    }
    assert_eq!(cached.len(), 4);
    // The newest four are held; the oldest went first.
    let before = hits(&cached);
    for n in 16..20 {
        cached.get(&key(n)).await.unwrap();
    }
    assert_eq!(hits(&cached), before + 4);
    cached.get(&key(10)).await.unwrap();
    assert_eq!(hits(&cached), before + 4, "key 10 was evicted");
}

#[tokio::test(start_paused = true)]
async fn lapsed_entries_are_dropped_as_new_ones_come() {
    let store = Arc::new(MemoryStore::new());
    let cached = CachedStore::new(store.clone(), DEFAULT_BYTES);
    for n in 0..50 {
        done(&*store, &key(n), b"v", LONG).await;
        cached.get(&key(n)).await.unwrap();
    }
    assert_eq!(cached.len(), 50);
    tokio::time::advance(TRUST).await;
    done(&*store, &key(99), b"v", LONG).await;
    cached.get(&key(99)).await.unwrap();
    assert_eq!(cached.len(), 1, "only the fresh entry is held");
}

#[tokio::test(start_paused = true)]
async fn reinserting_one_key_does_not_grow_the_order() {
    let store = Arc::new(MemoryStore::new());
    let cached = CachedStore::new(store.clone(), DEFAULT_BYTES);
    done(&*store, &key(1), b"v", LONG).await;
    done(&*store, &key(2), b"v", LONG).await;
    for _ in 0..1000 {
        cached.invalidate(&key(2));
        cached.get(&key(1)).await.unwrap();
        cached.get(&key(2)).await.unwrap();
    }
    assert!(cached.lock().order.len() <= 2 * 2 + 64);
}

#[tokio::test(start_paused = true)]
async fn after_a_forget_returns_no_replica_serves_the_record() {
    let store = Arc::new(MemoryStore::new());
    let here = CachedStore::new(store.clone(), DEFAULT_BYTES);
    let there = Arc::new(CachedStore::new(store.clone(), DEFAULT_BYTES));
    done(&*store, &key(1), b"v", LONG).await;
    here.get(&key(1)).await.unwrap();
    there.get(&key(1)).await.unwrap();
    // While the forget runs, the other replica may still answer from its
    // copy (the forget has not returned yet)...
    let (k, note) = (key(1), attempt());
    let forget = here.forget(&k, &note, LONG);
    tokio::pin!(forget);
    assert!(
        tokio::time::timeout(Duration::from_millis(1), &mut forget)
            .await
            .is_err(),
        "the forget waits out the window"
    );
    assert!(matches!(
        there.claim(&key(1), &fp("a"), LONG).await.unwrap(),
        Claim::Existing(_)
    ));
    assert!(forget.await.unwrap());
    // ...and once it has returned, neither replica does.
    assert!(here.is_empty(), "the local copy went at once");
    assert!(matches!(
        there.claim(&key(1), &fp("a"), LONG).await.unwrap(),
        Claim::Acquired(_)
    ));
    assert!(matches!(
        here.claim(&key(1), &fp("a"), LONG).await.unwrap(),
        Claim::Existing(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_fingerprint_mismatch_is_answered_as_the_store_would() {
    let store = Arc::new(MemoryStore::new());
    let cached = Arc::new(CachedStore::new(store.clone(), DEFAULT_BYTES));
    done(&*store, &key(1), b"v", LONG).await;
    let engine = crate::Engine::new(cached.clone());
    assert!(matches!(
        engine.begin(&key(1), &fp("a")).await,
        Ok(crate::Begin::Done(_))
    ));
    assert!(matches!(
        engine.begin(&key(1), &fp("other")).await,
        Err(crate::BeginError::Mismatch)
    ));
    assert_eq!(hits(&cached), 1, "the mismatch was decided from the copy");
    let direct = crate::Engine::new(store.clone());
    assert!(matches!(
        direct.begin(&key(1), &fp("other")).await,
        Err(crate::BeginError::Mismatch)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_zero_bound_caches_nothing() {
    let store = Arc::new(MemoryStore::new());
    let cached = CachedStore::new(store.clone(), 0);
    done(&*store, &key(1), b"v", LONG).await;
    cached.get(&key(1)).await.unwrap();
    cached.get(&key(1)).await.unwrap();
    assert_eq!(hits(&cached), 0);
    assert!(cached.is_empty());
}
