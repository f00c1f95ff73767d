//! A claim acknowledged too late to be trusted is not a claim. A store
//! whose commit waits out a failover can acknowledge a claim after its
//! lease ran out, when another request may already have taken the key
//! over: the engine gives such a claim back and reports the store as
//! unavailable (a retryable answer), rather than running the work on a
//! lease that may be another's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemgate_engine::{
    Begin, BeginError, BoxFuture, Claim, Engine, Fenced, Fingerprint, LayeredStore, MemoryStore,
    Policy, ScopedKey, Store, StoreError, StoreErrorKind,
};
use idemgate_testkit::{fp, fresh_key};

/// Acknowledges each claim after `delay_ms`, the claim itself applied at
/// once (as a commit whose acknowledgement waited on a standby).
#[derive(Debug)]
struct SlowAck {
    inner: MemoryStore,
    delay_ms: AtomicU64,
}

impl SlowAck {
    /// A memory store whose claims are acknowledged after `delay_ms`.
    fn new(delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            delay_ms: AtomicU64::new(delay_ms),
        })
    }
}

impl LayeredStore for SlowAck {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let claim = self.inner.claim(key, fingerprint, pending_ttl).await;
            let delay = self.delay_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            claim
        })
    }
}

fn engine(store: &Arc<SlowAck>) -> Engine {
    Engine::new(Arc::clone(store) as Arc<dyn Store>)
        .with_policy(Policy::default().pending_ttl(Duration::from_millis(400)))
}

#[tokio::test]
async fn a_claim_acknowledged_past_half_its_lease_is_given_back() {
    let store = SlowAck::new(250);
    let key = fresh_key();
    let late = engine(&store).begin(&key, &fp("a")).await;
    let Err(BeginError::Store(e)) = late else {
        panic!("a late claim must not own the key: {late:?}");
    };
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    assert!(e.is_temporary(), "the client is told to retry");
    // Given back: nobody holds the key, and a prompt claim owns it.
    assert!(store.inner.get(&key).await.unwrap().is_none());
    store.delay_ms.store(0, Ordering::SeqCst);
    let Ok(Begin::Owner(guard)) = engine(&store).begin(&key, &fp("a")).await else {
        panic!("a prompt claim owns the key");
    };
    assert_eq!(guard.release(None).await.unwrap(), Fenced::Applied);
}

#[tokio::test]
async fn a_late_claim_taken_over_meanwhile_leaves_the_new_owner_alone() {
    let store = SlowAck::new(0);
    let key = fresh_key();
    // The first claim's acknowledgement is late; while it is on its way,
    // its lease runs out and another request takes the key over.
    store.delay_ms.store(600, Ordering::SeqCst);
    let slow = {
        let store = Arc::clone(&store);
        let key = key.clone();
        tokio::spawn(async move { engine(&store).begin(&key, &fp("a")).await })
    };
    tokio::time::sleep(Duration::from_millis(450)).await;
    let Claim::Acquired(taker) = store
        .inner
        .claim(&key, &fp("a"), Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("the expired lease is taken over");
    };
    let late = slow.await.unwrap();
    assert!(matches!(late, Err(BeginError::Store(_))), "{late:?}");
    // The late owner's release was fenced: the key is still the taker's.
    let record = store
        .inner
        .get(&key)
        .await
        .unwrap()
        .expect("the taker's record");
    assert!(!record.is_done());
    assert_eq!(
        store
            .inner
            .renew(&mut taker.clone(), Duration::from_secs(5))
            .await
            .unwrap(),
        Fenced::Applied
    );
}
