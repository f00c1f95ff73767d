//! [`CountingStore`]: a pass-through [`Store`] that counts the calls that
//! reach it, so a test can show that a wrapper above it (a cache, a
//! gatherer of timeline entries) saved a round trip, with a real store
//! underneath answering every call that does get through.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};

/// Calls that reached the wrapped store, by operation.
#[derive(Debug, Default)]
pub struct Calls {
    /// `claim`
    pub claim: AtomicUsize,
    /// `renew`
    pub renew: AtomicUsize,
    /// `complete`
    pub complete: AtomicUsize,
    /// `release`
    pub release: AtomicUsize,
    /// `forget`
    pub forget: AtomicUsize,
    /// `get`
    pub get: AtomicUsize,
    /// `record_attempt`
    pub record_attempt: AtomicUsize,
    /// `timeline`
    pub timeline: AtomicUsize,
}

impl Calls {
    /// Claims and reads of a record: the calls a replay makes.
    pub fn record_reads(&self) -> usize {
        self.claim.load(Ordering::SeqCst) + self.get.load(Ordering::SeqCst)
    }

    /// `record_attempt` calls.
    pub fn attempts(&self) -> usize {
        self.record_attempt.load(Ordering::SeqCst)
    }
}

/// Forwards every call to `inner` and counts it in [`CountingStore::calls`].
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    calls: Arc<Calls>,
}

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            calls: Arc::new(Calls::default()),
        }
    }

    /// The counts so far (shared: keep it to read them later).
    pub fn calls(&self) -> Arc<Calls> {
        Arc::clone(&self.calls)
    }
}

fn count(n: &AtomicUsize) {
    n.fetch_add(1, Ordering::SeqCst);
}

impl idemgate_engine::LayeredStore for CountingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        count(&self.calls.claim);
        self.inner.claim(key, fingerprint, pending_ttl)
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        count(&self.calls.renew);
        self.inner.renew(lease, pending_ttl)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        count(&self.calls.complete);
        self.inner.complete(lease, payload, done_ttl, attempt)
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        count(&self.calls.release);
        self.inner.release(lease, attempt, timeline_ttl)
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        count(&self.calls.forget);
        self.inner.forget(key, attempt, timeline_ttl)
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        count(&self.calls.get);
        self.inner.get(key)
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        count(&self.calls.record_attempt);
        self.inner.record_attempt(key, attempt, ttl)
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        count(&self.calls.timeline);
        self.inner.timeline(key)
    }
}
