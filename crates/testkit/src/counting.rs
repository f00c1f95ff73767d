//! [`CountingStore`]: a pass-through [`Store`] that counts the calls that
//! reach it, so a test can show that a wrapper above it (a cache, a
//! gatherer of timeline entries) saved a round trip, with a real store
//! underneath answering every call that does get through.

use idemgate_engine::{LayeredStore, ObservedStore, Store, StoreObserver, StoreOp};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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

impl StoreObserver for Calls {
    fn started(&self, op: StoreOp) {
        let n = match op {
            StoreOp::Claim => &self.claim,
            StoreOp::Renew => &self.renew,
            StoreOp::Complete => &self.complete,
            StoreOp::Release => &self.release,
            StoreOp::Forget => &self.forget,
            StoreOp::Get => &self.get,
            StoreOp::RecordAttempt => &self.record_attempt,
            StoreOp::Timeline => &self.timeline,
            _ => return,
        };
        n.fetch_add(1, Ordering::SeqCst);
    }
}

/// Forwards every call to `inner` and counts it in [`CountingStore::calls`].
#[derive(Debug)]
pub struct CountingStore(ObservedStore<Arc<Calls>>);

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self(ObservedStore::new(inner, Arc::new(Calls::default())))
    }

    /// The counts so far (shared: keep it to read them later).
    pub fn calls(&self) -> Arc<Calls> {
        Arc::clone(self.0.observer())
    }
}

impl LayeredStore for CountingStore {
    fn inner(&self) -> &dyn Store {
        &self.0
    }
}
