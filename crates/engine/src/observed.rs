//! [`ObservedStore`]: a store wrapper that shows every operation to a
//! [`StoreObserver`], as it starts and as it returns.
//!
//! Metrics (latency and errors by operation) and test doubles (calls
//! counted by operation) watch every call and change none. Written as
//! [`LayeredStore`](crate::LayeredStore)s, each would spell out every
//! method of [`Store`] only to wrap it the same way; here the wrapping is
//! written once and a watcher states what it does with one call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Attempt, Claim, Fenced, Lease, Record};
use crate::store::{BoxFuture, Store, StoreError};

/// One operation of [`Store`], as an observer sees it. (`changed`, a wait
/// for a wake-up rather than a call, is passed through unobserved.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOp {
    /// [`Store::claim`].
    Claim,
    /// [`Store::renew`].
    Renew,
    /// [`Store::complete`].
    Complete,
    /// [`Store::release`].
    Release,
    /// [`Store::get`].
    Get,
    /// [`Store::forget`].
    Forget,
    /// [`Store::record_attempt`].
    RecordAttempt,
    /// [`Store::timeline`].
    Timeline,
}

impl StoreOp {
    /// Every operation, in [`StoreOp::index`] order.
    pub const ALL: [StoreOp; 8] = [
        Self::Claim,
        Self::Renew,
        Self::Complete,
        Self::Release,
        Self::Get,
        Self::Forget,
        Self::RecordAttempt,
        Self::Timeline,
    ];

    /// The method's name (a metric label: stable).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Renew => "renew",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Get => "get",
            Self::Forget => "forget",
            Self::RecordAttempt => "record_attempt",
            Self::Timeline => "timeline",
        }
    }

    /// The operation's position in [`StoreOp::ALL`], for per-operation
    /// tables.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Watches the operations an [`ObservedStore`] passes on.
pub trait StoreObserver: Send + Sync + std::fmt::Debug {
    /// `op` is about to be sent to the wrapped store (counted even if the
    /// caller drops the future before it returns).
    fn started(&self, op: StoreOp) {
        let _ = op;
    }

    /// `op` returned after `elapsed`; `failed` when it returned an error.
    fn finished(&self, op: StoreOp, elapsed: Duration, failed: bool) {
        let _ = (op, elapsed, failed);
    }
}

/// A shared observer: the wrapper holds one handle, the caller another
/// (to read what was observed).
impl<O: StoreObserver + ?Sized> StoreObserver for Arc<O> {
    fn started(&self, op: StoreOp) {
        (**self).started(op);
    }

    fn finished(&self, op: StoreOp, elapsed: Duration, failed: bool) {
        (**self).finished(op, elapsed, failed);
    }
}

/// Passes every call to the wrapped store and shows it to `O`.
#[derive(Debug)]
pub struct ObservedStore<O> {
    inner: Arc<dyn Store>,
    observer: O,
}

impl<O: StoreObserver> ObservedStore<O> {
    /// Wraps `inner`, showing its operations to `observer`.
    pub fn new(inner: Arc<dyn Store>, observer: O) -> Self {
        Self { inner, observer }
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    fn around<'a, T: Send + 'a>(
        &'a self,
        op: StoreOp,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        self.observer.started(op);
        Box::pin(async move {
            let sent = Instant::now();
            let result = call.await;
            self.observer.finished(op, sent.elapsed(), result.is_err());
            result
        })
    }
}

impl<O: StoreObserver> Store for ObservedStore<O> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let call = self.inner.claim(key, fingerprint, pending_ttl);
        self.around(StoreOp::Claim, call)
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        let call = self.inner.renew(lease, pending_ttl);
        self.around(StoreOp::Renew, call)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        let call = self.inner.complete(lease, payload, done_ttl, attempt);
        self.around(StoreOp::Complete, call)
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        let call = self.inner.release(lease, attempt, timeline_ttl);
        self.around(StoreOp::Release, call)
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let call = self.inner.forget(key, attempt, timeline_ttl);
        self.around(StoreOp::Forget, call)
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.around(StoreOp::Get, self.inner.get(key))
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let call = self.inner.record_attempt(key, attempt, ttl);
        self.around(StoreOp::RecordAttempt, call)
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        self.around(StoreOp::Timeline, self.inner.timeline(key))
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        self.inner.changed(key, max)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{ClientKey, MemoryStore};

    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<(StoreOp, bool)>>);

    impl StoreObserver for Log {
        fn finished(&self, op: StoreOp, _: Duration, failed: bool) {
            self.0.lock().expect("log").push((op, failed));
        }
    }

    #[tokio::test]
    async fn every_operation_is_shown_with_its_result() {
        let store = ObservedStore::new(Arc::new(MemoryStore::new()), Log::default());
        let key = ScopedKey::new("t", "n", ClientKey::parse("k").expect("key"));
        let fp = Fingerprint::from_bytes([1; 32]);
        let Claim::Acquired(lease) = store
            .claim(&key, &fp, Duration::from_secs(5))
            .await
            .expect("claim")
        else {
            panic!("a fresh key is acquired");
        };
        assert!(store.get(&key).await.expect("get").is_some());
        let mut stale = lease.clone();
        stale.token ^= 1;
        assert_eq!(
            store
                .renew(&mut stale, Duration::from_secs(5))
                .await
                .expect("renew"),
            Fenced::Stale
        );
        let log = store.observer().0.lock().expect("log").clone();
        assert_eq!(
            log,
            [
                (StoreOp::Claim, false),
                (StoreOp::Get, false),
                (StoreOp::Renew, false)
            ]
        );
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }
}
