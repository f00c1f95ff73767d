//! A `Store` decorator that times every operation by backend and op.
//!
//! A decorator rather than code in each backend, so that every store
//! (including one written outside this workspace) reports the same
//! metrics, and a backend stays free of metrics code. The wrapping is the
//! engine's [`ObservedStore`]; this module says what is recorded.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idemgate_engine::{LayeredStore, ObservedStore, Store, StoreObserver, StoreOp};
use metrics::Histogram;

use crate::names;

/// Wraps a store; records `idemgate_store_operation_seconds{backend,op}` and
/// `idemgate_store_errors_total{backend,op}` around each call.
#[derive(Debug, Clone)]
pub struct InstrumentedStore(Arc<ObservedStore<StoreMetrics>>);

/// The metrics of one store's operations.
#[derive(Debug)]
struct StoreMetrics {
    backend: &'static str,
    /// The timing histogram of each op, looked up in the recorder on its
    /// first use rather than on every call.
    timings: [OnceLock<Histogram>; StoreOp::ALL.len()],
}

impl InstrumentedStore {
    /// Wraps `inner`. Registers the error counters of every op at zero, so
    /// an alert on their rate sees the series before the first failure.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let backend = inner.backend();
        for op in StoreOp::ALL {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => op.as_str())
                .increment(0);
        }
        let observer = StoreMetrics {
            backend,
            timings: Default::default(),
        };
        Self(Arc::new(ObservedStore::new(inner, observer)))
    }
}

impl StoreObserver for StoreMetrics {
    fn finished(&self, op: StoreOp, elapsed: Duration, failed: bool) {
        let (backend, label) = (self.backend, op.as_str());
        let histogram =
            || metrics::histogram!(names::STORE_OPERATION, "backend" => backend, "op" => label);
        match self.timings.get(op.index()) {
            Some(cell) => cell.get_or_init(histogram).record(elapsed.as_secs_f64()),
            None => histogram().record(elapsed.as_secs_f64()),
        }
        if failed {
            metrics::counter!(names::STORE_ERRORS, "backend" => backend, "op" => label)
                .increment(1);
        }
    }
}

impl LayeredStore for InstrumentedStore {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }
}
