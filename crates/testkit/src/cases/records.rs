//! Cases on the record itself: claim, renew, complete, release, expiry,
//! mismatch, timelines, tenants, forget — one store call at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use idemgate_engine::{
    AttemptOutcome, Engine, ExecuteError, Fenced, Lease, MAX_TIMELINE, RecordState, Repeated,
    ScopedKey, Store,
};

use super::{Shows, assert_only_the_new_owner_completes, complete, eventually_shows, outcomes};
use crate::{
    LONG, PAST_SHORT_TTL, SHORT_TTL, acquired, attempt, eventually, executed, existing, fp,
    fresh_key,
};

/// Claim on an absent key acquires a lease and leaves a PENDING record.
pub async fn claim_on_absent(store: Arc<dyn Store>) {
    let key = fresh_key();
    assert_eq!(store.get(&key).await.unwrap(), None);
    let before = idemgate_engine::backend::now_ms();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(lease.key, key);
    assert!(lease.fence >= 1);
    assert!(
        lease.expires_at_ms >= before + 299_000,
        "lease expiry {lease:?}"
    );
    let rec = store.get(&key).await.unwrap().expect("record after claim");
    assert_eq!(rec.fingerprint, fp("a"));
    assert!(matches!(rec.state, RecordState::Pending { fence, .. } if fence == lease.fence));
}

/// A second claim returns the existing record, PENDING then DONE, unchanged.
pub async fn existing_record_returned(store: Arc<dyn Store>) {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let rec = existing(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert!(matches!(rec.state, RecordState::Pending { .. }));
    let body = b"{\"answer\":42}\n\x00binary-safe\xff";
    let w = complete(&*store, &lease, body, LONG, &executed()).await;
    assert_eq!(w, Fenced::Applied);
    let rec = existing(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(rec.fingerprint, fp("a"));
    assert_eq!(rec.payload().map(|p| p.to_vec()), Some(body.to_vec()));
    assert_eq!(store.get(&key).await.unwrap(), Some(rec));
}

/// After the lease expires another claimer takes over with a higher fence,
/// and the old owner is fenced.
pub async fn takeover_after_lease_expiry(store: Arc<dyn Store>) {
    let key = fresh_key();
    let old = acquired(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    existing(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let new = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert!(
        new.fence > old.fence,
        "fence must grow: {} -> {}",
        old.fence,
        new.fence
    );
    assert_only_the_new_owner_completes(&*store, &key, &old, &new).await;
}

/// An owner whose lease was taken over stays fenced after the new owner's
/// result expired: the store remembers the newer fence past the DONE
/// record, so the late completion neither lands nor writes a record.
pub async fn a_taken_over_owner_stays_fenced_after_the_result_expires(store: Arc<dyn Store>) {
    let key = fresh_key();
    let old = acquired(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let new = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let ok = executed();
    assert_eq!(
        complete(&*store, &new, b"new", SHORT_TTL, &ok).await,
        Fenced::Applied
    );
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(store.get(&key).await.unwrap(), None, "the result expired");
    assert_eq!(
        complete(&*store, &old, b"old", LONG, &ok).await,
        Fenced::Stale
    );
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "a fenced completion wrote a record"
    );
    let next = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert!(next.fence > new.fence, "{} -> {}", new.fence, next.fence);
}

/// Renewing the lease keeps the claim past the original expiry.
pub async fn renewal_keeps_the_claim(store: Arc<dyn Store>) {
    let key = fresh_key();
    let mut lease = acquired(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    let first_expiry = lease.expires_at_ms;
    let until = Instant::now() + SHORT_TTL * 3;
    while Instant::now() < until {
        tokio::time::sleep(SHORT_TTL / 4).await;
        assert_eq!(
            store.renew(&mut lease, SHORT_TTL).await.unwrap(),
            Fenced::Applied
        );
        existing(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    }
    assert!(lease.expires_at_ms > first_expiry);
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let taken = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        store.renew(&mut lease, SHORT_TTL).await.unwrap(),
        Fenced::Stale
    );
    assert!(taken.fence > lease.fence);
}

/// complete, release and renew act only for the current owner.
pub async fn fenced_complete_and_release(store: Arc<dyn Store>) {
    let key = fresh_key();
    let ok = attempt(AttemptOutcome::Executed);
    let failed = attempt(AttemptOutcome::Failed);
    let mut a = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        store.release(&a, &failed, LONG).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert_eq!(
        store.release(&a, &failed, LONG).await.unwrap(),
        Fenced::Stale
    );
    assert_eq!(complete(&*store, &a, b"a", LONG, &ok).await, Fenced::Stale);
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "stale complete wrote a record"
    );

    let b = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_ne!(a.token, b.token);
    assert_eq!(complete(&*store, &a, b"a", LONG, &ok).await, Fenced::Stale);
    assert_eq!(
        store.release(&a, &failed, LONG).await.unwrap(),
        Fenced::Stale
    );
    assert_eq!(store.renew(&mut a, LONG).await.unwrap(), Fenced::Stale);
    // A forged lease with the right fence but another token is refused too.
    let forged = Lease {
        token: b.token ^ 1,
        ..b.clone()
    };
    assert_eq!(
        complete(&*store, &forged, b"x", LONG, &ok).await,
        Fenced::Stale
    );
    assert!(matches!(
        store.get(&key).await.unwrap().map(|r| r.state),
        Some(RecordState::Pending { .. })
    ));
    assert_eq!(
        complete(&*store, &b, b"b", LONG, &ok).await,
        Fenced::Applied
    );
    // Once DONE, the owner's own lease no longer releases or rewrites it.
    assert_eq!(
        store.release(&b, &failed, LONG).await.unwrap(),
        Fenced::Stale
    );
    assert_eq!(complete(&*store, &b, b"c", LONG, &ok).await, Fenced::Stale);
    let rec = store.get(&key).await.unwrap().expect("done");
    assert_eq!(rec.payload().map(|p| p.to_vec()), Some(b"b".to_vec()));
}

/// A complete retried with its own lease and payload (its first reply was
/// lost) is acknowledged as applied without writing again: the record and
/// its timeline are unchanged. A different payload, another token or an
/// older lease of the key stays `Stale`.
pub async fn complete_retry_is_idempotent(store: Arc<dyn Store>) {
    let key = fresh_key();
    let ok = attempt(AttemptOutcome::Executed);
    let a = acquired(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let b = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        complete(&*store, &b, b"b", LONG, &ok).await,
        Fenced::Applied
    );
    let done = store.get(&key).await.unwrap().expect("done");
    for _ in 0..2 {
        assert_eq!(
            complete(&*store, &b, b"b", LONG, &ok).await,
            Fenced::Applied,
            "a retried complete of the same lease and payload"
        );
    }
    assert_eq!(store.get(&key).await.unwrap(), Some(done.clone()));
    let executed = store
        .timeline(&key)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.outcome == AttemptOutcome::Executed)
        .count();
    assert_eq!(executed, 1, "the retry appended to the timeline");
    assert_eq!(
        complete(&*store, &b, b"c", LONG, &ok).await,
        Fenced::Stale,
        "same lease, another payload"
    );
    let forged = Lease {
        token: b.token ^ 1,
        ..b.clone()
    };
    assert_eq!(
        complete(&*store, &forged, b"b", LONG, &ok).await,
        Fenced::Stale,
        "another token, same fence and payload"
    );
    assert_eq!(
        complete(&*store, &a, b"b", LONG, &ok).await,
        Fenced::Stale,
        "the lease taken over, same payload"
    );
    assert_eq!(store.get(&key).await.unwrap(), Some(done));
}

/// DONE expires after `done_ttl`; the key is then claimable.
pub async fn done_expiry(store: Arc<dyn Store>) {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let w = complete(&*store, &lease, b"r", SHORT_TTL, &executed()).await;
    assert_eq!(w, Fenced::Applied);
    assert!(store.get(&key).await.unwrap().is_some_and(|r| r.is_done()));
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(store.get(&key).await.unwrap(), None);
    acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
}

/// PENDING expires after `pending_ttl` when not renewed.
pub async fn pending_expiry(store: Arc<dyn Store>) {
    let key = fresh_key();
    acquired(store.claim(&key, &fp("a"), SHORT_TTL).await.unwrap());
    assert!(store.get(&key).await.unwrap().is_some());
    tokio::time::sleep(PAST_SHORT_TTL).await;
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// A different fingerprint gets the existing record (store) and a mismatch
/// error without running the work (engine), PENDING and DONE alike.
pub async fn mismatch(store: Arc<dyn Store>) {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let rec = existing(store.claim(&key, &fp("b"), LONG).await.unwrap());
    assert_eq!(rec.fingerprint, fp("a"));
    let engine = Engine::new(Arc::clone(&store));
    let runs = AtomicUsize::new(0);
    let other_body = || async {
        engine
            .execute(&key, &fp("b"), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(1)
            })
            .await
    };
    let r = other_body().await;
    assert!(matches!(r, Err(ExecuteError::Mismatch)), "{r:?}");
    let w = complete(&*store, &lease, b"1", LONG, &executed()).await;
    assert_eq!(w, Fenced::Applied);
    let r = other_body().await;
    assert!(matches!(r, Err(ExecuteError::Mismatch)), "{r:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Every attempt lands in the timeline, in order, with its replica.
pub async fn timeline_entries(store: Arc<dyn Store>) {
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&store)).with_replica("replica-a");
    let fail = engine
        .execute(&key, &fp("a"), || async {
            Err::<u32, _>(std::io::Error::other("boom"))
        })
        .await;
    assert!(matches!(fail, Err(ExecuteError::Work(_))));
    assert_eq!(store.get(&key).await.unwrap(), None, "failure must release");
    let first = engine
        .execute(&key, &fp("a"), || async { Ok::<_, std::io::Error>(7u32) })
        .await
        .unwrap();
    assert!(!first.replayed());
    let second = engine
        .execute(&key, &fp("a"), || async { Ok::<_, std::io::Error>(8u32) })
        .await
        .unwrap();
    assert!(second.replayed());
    assert_eq!(second.value, 7);
    let mismatch = engine
        .execute(&key, &fp("other"), || async {
            Ok::<_, std::io::Error>(9u32)
        })
        .await;
    assert!(matches!(mismatch, Err(ExecuteError::Mismatch)));

    let expected = [
        AttemptOutcome::Failed,
        AttemptOutcome::Executed,
        AttemptOutcome::Replayed,
        AttemptOutcome::Mismatch,
    ];
    let got = eventually_shows(&store, &key, Shows::Entries(expected.len())).await;
    assert!(got, "timeline never reached {} entries", expected.len());
    let timeline = store.timeline(&key).await.unwrap();
    let outcomes: Vec<_> = timeline.iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, expected);
    assert!(timeline.iter().all(|a| a.replica == "replica-a"));
    assert!(timeline.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    // Another tenant's key with the same client key has its own (empty) timeline.
    let other = ScopedKey::new("someone-else", key.namespace.clone(), key.key.clone());
    assert!(store.timeline(&other).await.unwrap().is_empty());
}

/// An entry that stands for several attempts (replays gathered over one
/// flush) reads back whole: its count and the last attempt's time.
pub async fn timeline_keeps_repeated_entries(store: Arc<dyn Store>) {
    let key = fresh_key();
    let mut gathered = attempt(AttemptOutcome::Replayed);
    gathered.repeated = Some(Repeated {
        count: 37,
        last_at_ms: gathered.at_ms + 900,
    });
    store.record_attempt(&key, &gathered, LONG).await.unwrap();
    let got = eventually_shows(&store, &key, Shows::Entries(1)).await;
    assert!(got, "the entry never landed");
    let timeline = store.timeline(&key).await.unwrap();
    assert_eq!(timeline, vec![gathered]);
    assert_eq!(timeline[0].count(), 37);
}

/// A timeline keeps each key's newest entries: with entries of several
/// keys arriving together (a background writer puts them in one batch),
/// each key reads back exactly its newest [`MAX_TIMELINE`], none of
/// another key's, and none of its newest lost to the trim.
pub async fn timeline_keeps_each_keys_newest_entries(store: Arc<dyn Store>) {
    const EXTRA: u64 = 7;
    let keys = [fresh_key(), fresh_key(), fresh_key()];
    let base = attempt(AttemptOutcome::Replayed).at_ms - 600_000;
    let total = MAX_TIMELINE as u64 + EXTRA;
    for i in 0..total {
        for (k, key) in keys.iter().enumerate() {
            // Not replays, which a gathering wrapper would merge.
            let mut a = attempt(AttemptOutcome::Mismatch);
            // One millisecond per entry and key: times tell them apart.
            a.at_ms = base + i * 10 + k as u64;
            store.record_attempt(key, &a, LONG).await.unwrap();
        }
    }
    for (k, key) in keys.iter().enumerate() {
        let newest = base + (total - 1) * 10 + k as u64;
        let landed = eventually(|| {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move {
                store
                    .timeline(&key)
                    .await
                    .unwrap()
                    .last()
                    .is_some_and(|a| a.at_ms == newest)
            }
        })
        .await;
        assert!(landed, "key {k}: the newest entry never landed");
        let times: Vec<u64> = store
            .timeline(key)
            .await
            .unwrap()
            .iter()
            .map(|a| a.at_ms)
            .collect();
        let expected: Vec<u64> = (EXTRA..total).map(|i| base + i * 10 + k as u64).collect();
        assert_eq!(
            times, expected,
            "key {k}: not its newest {MAX_TIMELINE} entries"
        );
    }
}

/// A timeline reads oldest first by the attempts' own time, whatever order
/// the entries were written in (gathered replays land after later
/// attempts).
pub async fn timeline_is_ordered_by_attempt_time(store: Arc<dyn Store>) {
    let key = fresh_key();
    let mut late = attempt(AttemptOutcome::Replayed);
    let mut early = attempt(AttemptOutcome::Mismatch);
    early.at_ms = late.at_ms.saturating_sub(5_000);
    late.at_ms = early.at_ms + 2_000;
    let mut first = attempt(AttemptOutcome::Conflict);
    first.at_ms = early.at_ms.saturating_sub(1_000);
    for a in [&first, &late, &early] {
        store.record_attempt(&key, a, LONG).await.unwrap();
    }
    let got = eventually_shows(&store, &key, Shows::Entries(3)).await;
    assert!(got, "the entries never landed");
    let outcomes = outcomes(&*store, &key).await;
    assert_eq!(
        outcomes,
        [
            AttemptOutcome::Conflict,
            AttemptOutcome::Mismatch,
            AttemptOutcome::Replayed
        ]
    );
}

/// Two tenants with the same client key never share a record.
pub async fn tenant_isolation(store: Arc<dyn Store>) {
    let a = fresh_key();
    let b = ScopedKey::new(
        format!("{}-b", a.tenant),
        a.namespace.clone(),
        a.key.clone(),
    );
    let la = acquired(store.claim(&a, &fp("x"), LONG).await.unwrap());
    let lb = acquired(store.claim(&b, &fp("x"), LONG).await.unwrap());
    let ok = attempt(AttemptOutcome::Executed);
    assert_eq!(
        complete(&*store, &la, b"A", LONG, &ok).await,
        Fenced::Applied
    );
    assert_eq!(
        store
            .get(&b)
            .await
            .unwrap()
            .and_then(|r| r.payload().cloned()),
        None
    );
    assert_eq!(
        complete(&*store, &lb, b"B", LONG, &ok).await,
        Fenced::Applied
    );
    let ra = store.get(&a).await.unwrap().expect("a");
    let rb = store.get(&b).await.unwrap().expect("b");
    assert_eq!(ra.payload().map(|p| p.to_vec()), Some(b"A".to_vec()));
    assert_eq!(rb.payload().map(|p| p.to_vec()), Some(b"B".to_vec()));
}

/// An owner whose PENDING record an operator forgot cannot write it back:
/// its completion is stale and the key stays absent.
pub async fn a_forgotten_owner_cannot_complete(store: Arc<dyn Store>) {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    let forgotten = attempt(AttemptOutcome::Forgotten);
    assert!(store.forget(&key, &forgotten, LONG).await.unwrap());
    let ok = attempt(AttemptOutcome::Executed);
    assert_eq!(
        complete(&*store, &lease, b"late", LONG, &ok).await,
        Fenced::Stale
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
}
