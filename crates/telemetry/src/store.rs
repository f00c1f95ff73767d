//! A `Store` decorator that times every operation by backend and op.
//!
//! A decorator rather than code in each backend, so that every store
//! (including one written outside this workspace) reports the same
//! metrics, and a backend stays free of metrics code.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};
use metrics::Histogram;

use crate::names;

/// The operations timed, as their `op` label.
const OPS: [&str; 8] = [
    "claim",
    "renew",
    "complete",
    "release",
    "get",
    "forget",
    "record_attempt",
    "timeline",
];

/// Wraps a store; records `idemgate_store_operation_seconds{backend,op}` and
/// `idemgate_store_errors_total{backend,op}` around each call.
#[derive(Debug, Clone)]
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    /// The timing histogram of each op in [`OPS`], looked up in the
    /// recorder on its first use rather than on every call.
    timings: Arc<[OnceLock<Histogram>; OPS.len()]>,
}

impl InstrumentedStore {
    /// Wraps `inner`. Registers the error counters of every op at zero, so
    /// an alert on their rate sees the series before the first failure.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let backend = inner.backend();
        for op in OPS {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => op).increment(0);
        }
        Self {
            inner,
            timings: Arc::default(),
        }
    }

    fn observe<T>(&self, op: &'static str, started: Instant, r: &Result<T, StoreError>) {
        let backend = self.inner.backend();
        let elapsed = started.elapsed().as_secs_f64();
        let cell = OPS
            .iter()
            .position(|o| *o == op)
            .and_then(|i| self.timings.get(i));
        let histogram =
            || metrics::histogram!(names::STORE_OPERATION, "backend" => backend, "op" => op);
        match cell {
            Some(cell) => cell.get_or_init(histogram).record(elapsed),
            None => histogram().record(elapsed),
        }
        if r.is_err() {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => op).increment(1);
        }
    }
}

impl idemgate_engine::LayeredStore for InstrumentedStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.claim(key, fingerprint, pending_ttl).await;
            self.observe("claim", t, &r);
            r
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.renew(lease, pending_ttl).await;
            self.observe("renew", t, &r);
            r
        })
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.complete(lease, payload, done_ttl, attempt).await;
            self.observe("complete", t, &r);
            r
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.release(lease, attempt, timeline_ttl).await;
            self.observe("release", t, &r);
            r
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.forget(key, attempt, timeline_ttl).await;
            self.observe("forget", t, &r);
            r
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.get(key).await;
            self.observe("get", t, &r);
            r
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.record_attempt(key, attempt, ttl).await;
            self.observe("record_attempt", t, &r);
            r
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.timeline(key).await;
            self.observe("timeline", t, &r);
            r
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.inner.changed(key, max).await;
        })
    }
}
