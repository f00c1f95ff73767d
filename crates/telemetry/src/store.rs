//! A `Store` decorator that times every operation by backend and op.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_engine::{
    Attempt, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};

use crate::names;

/// The operations timed, as their `op` label.
const OPS: [&str; 7] = [
    "claim",
    "renew",
    "complete",
    "release",
    "get",
    "record_attempt",
    "timeline",
];

/// Wraps a store; records `idemgate_store_operation_seconds{backend,op}` and
/// `idemgate_store_errors_total{backend,op}` around each call.
#[derive(Debug, Clone)]
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
}

impl InstrumentedStore {
    /// Wraps `inner`. Registers the error counters of every op at zero, so
    /// an alert on their rate sees the series before the first failure.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let backend = inner.backend();
        for op in OPS {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => op).increment(0);
        }
        Self { inner }
    }

    fn observe<T>(&self, op: &'static str, started: Instant, r: &Result<T, StoreError>) {
        let backend = self.inner.backend();
        metrics::histogram!(names::STORE_OPERATION, "backend" => backend, "op" => op)
            .record(started.elapsed().as_secs_f64());
        if r.is_err() {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => op).increment(1);
        }
    }
}

#[async_trait]
impl Store for InstrumentedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn claim(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        pending_ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let t = Instant::now();
        let r = self.inner.claim(key, fingerprint, pending_ttl).await;
        self.observe("claim", t, &r);
        r
    }

    async fn renew(&self, lease: &mut Lease, pending_ttl: Duration) -> Result<Fenced, StoreError> {
        let t = Instant::now();
        let r = self.inner.renew(lease, pending_ttl).await;
        self.observe("renew", t, &r);
        r
    }

    async fn complete(
        &self,
        lease: &Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &Attempt,
    ) -> Result<Fenced, StoreError> {
        let t = Instant::now();
        let r = self.inner.complete(lease, payload, done_ttl, attempt).await;
        self.observe("complete", t, &r);
        r
    }

    async fn release(
        &self,
        lease: &Lease,
        attempt: &Attempt,
        timeline_ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        let t = Instant::now();
        let r = self.inner.release(lease, attempt, timeline_ttl).await;
        self.observe("release", t, &r);
        r
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let t = Instant::now();
        let r = self.inner.get(key).await;
        self.observe("get", t, &r);
        r
    }

    async fn record_attempt(
        &self,
        key: &ScopedKey,
        attempt: &Attempt,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.record_attempt(key, attempt, ttl).await;
        self.observe("record_attempt", t, &r);
        r
    }

    async fn timeline(&self, key: &ScopedKey) -> Result<Vec<Attempt>, StoreError> {
        let t = Instant::now();
        let r = self.inner.timeline(key).await;
        self.observe("timeline", t, &r);
        r
    }

    async fn changed(&self, key: &ScopedKey, max: Duration) {
        self.inner.changed(key, max).await;
    }
}
