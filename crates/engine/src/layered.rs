//! [`LayeredStore`]: the base of every `Store` wrapper, whose methods pass
//! the call to the wrapped store unless the wrapper says otherwise.
//!
//! A wrapper (the replay cache, the timeline gatherer, sealing,
//! instrumentation, test doubles that inject faults) changes one or two
//! operations and passes the rest through. Written against [`Store`]
//! directly, each such wrapper repeats every pass-through by hand, and
//! one that forgets a method it does not care about silently gets the
//! trait's default instead of the wrapped store's behaviour: a wrapper
//! without `changed` makes waiters poll every 50 ms even when the store
//! below notifies at once. Here every method forwards to [`inner`] by
//! default, and every `LayeredStore` is a [`Store`], so a wrapper states
//! only what it changes. (The pattern is opendal's `LayeredAccess`.)
//!
//! [`inner`]: LayeredStore::inner

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::key::ScopedKey;
use crate::record::{Attempt, Claim, Fenced, Lease, Record};
use crate::store::{BoxFuture, Store, StoreError};

/// A [`Store`] that wraps another: each method forwards to
/// [`inner`](LayeredStore::inner) unless overridden. Every `LayeredStore`
/// is a `Store`; the contracts of the methods are [`Store`]'s.
pub trait LayeredStore: Send + Sync + std::fmt::Debug {
    /// The wrapped store.
    fn inner(&self) -> &dyn Store;

    /// As [`Store::backend`]; the wrapped store's name by default.
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }

    /// As [`Store::claim`].
    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.inner().claim(key, fingerprint, pending_ttl)
    }

    /// As [`Store::renew`].
    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        self.inner().renew(lease, pending_ttl)
    }

    /// As [`Store::complete`].
    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        self.inner().complete(lease, payload, done_ttl, attempt)
    }

    /// As [`Store::release`].
    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        self.inner().release(lease, attempt, timeline_ttl)
    }

    /// As [`Store::forget`].
    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner().forget(key, attempt, timeline_ttl)
    }

    /// As [`Store::get`].
    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.inner().get(key)
    }

    /// As [`Store::record_attempt`].
    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner().record_attempt(key, attempt, ttl)
    }

    /// As [`Store::timeline`].
    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        self.inner().timeline(key)
    }

    /// As [`Store::changed`]: the wrapped store's notifications by default.
    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        self.inner().changed(key, max)
    }
}

impl<T: LayeredStore> Store for T {
    fn backend(&self) -> &'static str {
        LayeredStore::backend(self)
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        LayeredStore::claim(self, key, fingerprint, pending_ttl)
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        LayeredStore::renew(self, lease, pending_ttl)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        LayeredStore::complete(self, lease, payload, done_ttl, attempt)
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        LayeredStore::release(self, lease, attempt, timeline_ttl)
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        LayeredStore::forget(self, key, attempt, timeline_ttl)
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        LayeredStore::get(self, key)
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        LayeredStore::record_attempt(self, key, attempt, ttl)
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        LayeredStore::timeline(self, key)
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        LayeredStore::changed(self, key, max)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{ClientKey, MemoryStore};

    /// Over a memory store, counts the calls that reach its `changed`.
    #[derive(Debug)]
    struct Probe {
        inner: MemoryStore,
        changed: AtomicUsize,
    }

    impl LayeredStore for Probe {
        fn inner(&self) -> &dyn Store {
            &self.inner
        }
        fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
            self.changed.fetch_add(1, Ordering::SeqCst);
            self.inner.changed(key, max)
        }
    }

    /// States nothing but what it wraps.
    #[derive(Debug)]
    struct Plain(Arc<dyn Store>);

    impl LayeredStore for Plain {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }
    }

    #[tokio::test]
    async fn a_wrapper_passes_on_what_it_does_not_override() {
        let probe = Arc::new(Probe {
            inner: MemoryStore::new(),
            changed: AtomicUsize::new(0),
        });
        let plain: Arc<dyn Store> = Arc::new(Plain(probe.clone()));
        let key = ScopedKey::new("t", "n", ClientKey::parse("k").unwrap());
        let fp = Fingerprint::of_request("POST", "/", b"{}", &[]);
        // `changed` reaches the wrapped store instead of the trait's
        // polling default.
        plain.changed(&key, Duration::from_millis(1)).await;
        assert_eq!(probe.changed.load(Ordering::SeqCst), 1);
        // So do the operations, and the backend's name.
        assert_eq!(plain.backend(), probe.inner.backend());
        let claim = plain
            .claim(&key, &fp, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(claim, Claim::Acquired(_)));
        assert!(probe.inner.get(&key).await.unwrap().is_some());
    }
}
