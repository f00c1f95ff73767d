//! `SealedStore` in front of the memory store: the conformance suite passes
//! through it unchanged, the backend only ever holds sealed bytes, and a
//! payload that cannot be opened is a store error, counted, never returned.
#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Claim, Fenced, Fingerprint, Lease, MemoryStore, Record, RecordState, ScopedKey, Store,
    StoreErrorKind,
};
use idemgate_seal::store::failure_reason;
use idemgate_seal::{KeyRing, SealedStore, generate_key_line};
use idemgate_testkit::{BlinkingStore, complete_executed, executed, key};

async fn make() -> Arc<dyn Store> {
    Arc::new(SealedStore::new(
        Arc::new(MemoryStore::new()),
        Arc::new(ring(&["a"], "a")),
    ))
}

idemgate_testkit::conformance_suite!(conformance_sealed_memory, make);

/// A ring of fresh keys with ids `ids`, `active` marked; the same id always
/// gets the same key within one test process.
fn ring(ids: &[&str], active: &str) -> KeyRing {
    static LINES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut lines = LINES.lock().unwrap();
    let mut text = String::new();
    for id in ids {
        let line = match lines.iter().find(|(i, _)| i == id) {
            Some((_, l)) => l.clone(),
            None => {
                let l = generate_key_line(id).unwrap();
                lines.push((id.to_string(), l.clone()));
                l
            }
        };
        if *id == active {
            text.push('*');
        }
        text.push_str(&line);
        text.push('\n');
    }
    KeyRing::parse(&text).unwrap()
}

const TTL: Duration = Duration::from_secs(60);
const SECRET: &[u8] = b"the answer is MARKER-7f3a";

async fn acquire(store: &dyn Store, key: &ScopedKey, fp: &Fingerprint) -> Lease {
    match store.claim(key, fp, TTL).await.unwrap() {
        Claim::Acquired(lease) => lease,
        Claim::Existing(r) => panic!("expected to acquire, found {r:?}"),
    }
}

/// Completes `lease` on `store` with [`SECRET`]; returns what the store
/// said (a store error panics).
async fn complete_secret(store: &dyn Store, lease: &Lease) -> Fenced {
    complete_executed(store, lease, SECRET, TTL).await
}

/// A sealed store under ring `a` over `inner`, and `inner` to look beneath
/// the seal.
fn sealed_over<S: Store + 'static>(inner: S) -> (Arc<S>, SealedStore) {
    let inner = Arc::new(inner);
    let sealed = SealedStore::new(inner.clone(), Arc::new(ring(&["a"], "a")));
    (inner, sealed)
}

/// The fingerprint of the tests' request.
fn request() -> Fingerprint {
    Fingerprint::of_value("req").unwrap()
}

fn stored_payload(record: Option<Record>) -> Bytes {
    match record.unwrap().state {
        RecordState::Done { payload, .. } => payload,
        s => panic!("not done: {s:?}"),
    }
}

fn counting() -> (
    Arc<Mutex<Vec<&'static str>>>,
    idemgate_seal::store::FailureHook,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    (
        seen,
        Arc::new(move |k| s.lock().unwrap().push(failure_reason(k))),
    )
}

#[tokio::test]
async fn the_backend_holds_only_sealed_bytes_and_replay_gets_the_plaintext() {
    let (inner, sealed) = sealed_over(MemoryStore::new());
    let (k, fp) = (key("k1"), request());
    let lease = acquire(&sealed, &k, &fp).await;
    let done = complete_secret(&sealed, &lease).await;
    assert_eq!(done, Fenced::Applied);

    let raw = stored_payload(inner.get(&k).await.unwrap());
    assert!(
        !raw.windows(6).any(|w| w == b"MARKER"),
        "plaintext reached the store"
    );
    assert_eq!(idemgate_seal::sealed_key_id(&raw).unwrap(), "a");
    assert_eq!(stored_payload(sealed.get(&k).await.unwrap()), SECRET);
    match sealed.claim(&k, &fp, TTL).await.unwrap() {
        Claim::Existing(r) => assert_eq!(r.payload().unwrap(), SECRET),
        c => panic!("{c:?}"),
    }
}

#[tokio::test]
async fn a_lease_claimed_around_the_wrapper_is_completed_with_the_records_fingerprint() {
    let (inner, sealed) = sealed_over(MemoryStore::new());
    let (k, fp) = (key("k2"), request());
    let lease = acquire(inner.as_ref(), &k, &fp).await;
    let done = complete_secret(&sealed, &lease).await;
    assert_eq!(done, Fenced::Applied);
    assert_eq!(stored_payload(sealed.get(&k).await.unwrap()), SECRET);
}

#[tokio::test]
async fn a_payload_copied_under_another_key_or_fingerprint_does_not_open_and_is_counted() {
    let inner = Arc::new(MemoryStore::new());
    let (seen, hook) = counting();
    let sealed = SealedStore::new(inner.clone(), Arc::new(ring(&["a"], "a"))).on_failure(hook);
    let fp = request();
    let lease = acquire(&sealed, &key("src"), &fp).await;
    let _ = complete_secret(&sealed, &lease).await;
    let raw = stored_payload(inner.get(&key("src")).await.unwrap());

    // The same sealed bytes written straight into the backend under another
    // key, and under the same key with another fingerprint.
    for (k, fp) in [
        (key("dst"), fp),
        (key("dst2"), Fingerprint::of_value("other").unwrap()),
    ] {
        let lease = acquire(inner.as_ref(), &k, &fp).await;
        let _ = inner
            .complete(&lease, raw.clone(), TTL, &executed())
            .await
            .unwrap();
        let err = sealed.get(&k).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        assert!(err.to_string().contains("could not be opened"), "{err}");
        let err = sealed.claim(&k, &fp, TTL).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    }
    assert_eq!(*seen.lock().unwrap(), vec!["tampered"; 4]);
}

#[tokio::test]
async fn rotation_old_records_open_while_their_key_is_listed_then_fail_as_unknown() {
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (k, fp) = (key("rot"), request());
    let under_a = SealedStore::new(Arc::clone(&inner), Arc::new(ring(&["a"], "a")));
    let lease = acquire(&under_a, &k, &fp).await;
    let _ = complete_secret(&under_a, &lease).await;

    let b_active = SealedStore::new(Arc::clone(&inner), Arc::new(ring(&["a", "b"], "b")));
    assert_eq!(stored_payload(b_active.get(&k).await.unwrap()), SECRET);

    let (seen, hook) = counting();
    let b_only = SealedStore::new(inner, Arc::new(ring(&["b"], "b"))).on_failure(hook);
    let err = b_only.get(&k).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(err.to_string().contains("key id `a`"), "{err}");
    assert_eq!(*seen.lock().unwrap(), vec!["unknown_key_id"]);
}

#[tokio::test]
async fn an_unsealed_record_is_refused_not_replayed() {
    let inner = Arc::new(MemoryStore::new());
    let (k, fp) = (key("plain"), request());
    let lease = acquire(inner.as_ref(), &k, &fp).await;
    let _ = complete_secret(inner.as_ref(), &lease).await;
    let failures = Arc::new(AtomicUsize::new(0));
    let f = Arc::clone(&failures);
    let sealed =
        SealedStore::new(inner, Arc::new(ring(&["a"], "a"))).on_failure(Arc::new(move |_| {
            f.fetch_add(1, Ordering::Relaxed);
        }));
    let err = sealed.get(&k).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt);
    assert!(!err.to_string().contains("MARKER"), "{err}");
    assert_eq!(failures.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_complete_retried_after_a_lost_reply_sends_the_same_sealed_bytes() {
    let (inner, sealed) = sealed_over(BlinkingStore::new(Arc::new(MemoryStore::new())));
    inner
        .switches()
        .lose_next_reply
        .store(true, Ordering::SeqCst);
    let (k, fp) = (key("lost"), request());
    let lease = acquire(&sealed, &k, &fp).await;
    let err = sealed
        .complete(&lease, Bytes::from_static(SECRET), TTL, &executed())
        .await
        .unwrap_err();
    assert!(err.is_temporary());
    assert_eq!(
        sealed.retained_completions(),
        (0, 0),
        "not acknowledged yet: kept with the lease, not in the window"
    );
    // The engine's next try comes after at most 1 s; the bytes are still
    // there however long the lease lasts.
    tokio::time::sleep(idemgate_seal::store::RETRY_WINDOW * 4).await;
    let retried = complete_secret(&sealed, &lease).await;
    assert_eq!(
        retried,
        Fenced::Applied,
        "the store saw its own DONE record"
    );
    let (count, bytes) = sealed.retained_completions();
    assert_eq!(count, 1);
    assert!(bytes > SECRET.len(), "{bytes}");
}

#[tokio::test(start_paused = true)]
async fn acknowledged_completions_are_forgotten_after_the_retry_window_on_a_quiet_store() {
    use idemgate_seal::store::RETRY_WINDOW;
    let (_, sealed) = sealed_over(MemoryStore::new());
    let fp = request();
    let mut leases = Vec::new();
    for name in ["w1", "w2", "w3"] {
        let lease = acquire(&sealed, &key(name), &fp).await;
        let done = complete_secret(&sealed, &lease).await;
        assert_eq!(done, Fenced::Applied);
        leases.push(lease);
    }
    assert_eq!(sealed.retained_completions().0, 3);

    // Within the window (the engine's longest backoff is 1 s), a retry
    // whose acknowledgement was lost above the wrapper is recognised.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = complete_secret(&sealed, &leases[0]).await;
    assert_eq!(again, Fenced::Applied);
    assert_eq!(sealed.retained_completions().0, 3, "counted once");

    // Past the window, with no further call on the store: all gone.
    tokio::time::sleep(RETRY_WINDOW).await;
    assert_eq!(sealed.retained_completions(), (0, 0));

    // A retry that late is sealed anew and is not the stored payload:
    // the store refuses it, and the stored answer is unchanged.
    let late = complete_secret(&sealed, &leases[1]).await;
    assert_eq!(late, Fenced::Stale);
    assert_eq!(
        stored_payload(sealed.get(&key("w2")).await.unwrap()),
        SECRET
    );
}

#[tokio::test(start_paused = true)]
async fn acknowledged_completions_stay_within_16_mib() {
    let (_, sealed) = sealed_over(MemoryStore::new());
    let fp = request();
    let big = Bytes::from(vec![b'x'; 4 * 1024 * 1024]);
    for i in 0..5 {
        let lease = acquire(&sealed, &key(&format!("big{i}")), &fp).await;
        let done = sealed
            .complete(&lease, big.clone(), TTL, &executed())
            .await
            .unwrap();
        assert_eq!(done, Fenced::Applied);
        let (count, bytes) = sealed.retained_completions();
        assert!(
            bytes <= 16 * 1024 * 1024,
            "{count} completions, {bytes} bytes"
        );
    }
    // 4 MiB and the seal's overhead each: three fit, not four.
    assert_eq!(sealed.retained_completions().0, 3);
}
