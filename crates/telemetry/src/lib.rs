//! Metrics and logs for idemgate, named after the seed.
//!
//! The seed's point is that the idempotency hit ratio is the earliest failure
//! signal: when an upstream slows, clients time out and retry, their retries
//! are answered from stored results and the ratio climbs, minutes before the
//! error rate moves. So the names below are the seed's, kept exactly
//! (`idempotency_hit_total`, `idempotency_inflight_conflict_total`,
//! `idempotency_hit_ratio`, …), and labels stay low-cardinality: never a key,
//! never a tenant.
//!
//! # Layout
//! - [`names`]: every metric name, in one place.
//! - [`Telemetry`]: the Prometheus recorder and the derived series that need
//!   state (the sliding hit ratio, requests-per-key quantiles), refreshed at
//!   each scrape.
//! - [`InstrumentedStore`]: a [`Store`](idemgate_engine::Store) decorator
//!   timing every operation by backend and op, and counting errors.
//! - [`logging`]: JSON-lines logs via `tracing`.
//!
//! Histograms are exported with buckets (true Prometheus histograms), not the
//! exporter's default summaries: summaries cannot be aggregated across
//! gateway replicas.

pub mod logging;
pub mod names;
mod store;
mod window;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use store::InstrumentedStore;
pub use window::{KeyCounts, RatioWindow};

/// How a keyed request ended, as counted in `idempotency_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Ran upstream now and was stored.
    Executed,
    /// Answered from a DONE record.
    Replayed,
    /// Joined an in-flight run and got its result.
    Attached,
    /// Met a PENDING key and was refused (or its wait ran out).
    Conflict,
    /// Same key, different payload.
    Mismatch,
    /// Ran upstream and failed retryably: the key was released.
    Failed,
    /// Ran upstream but its lease had been taken over: not stored.
    Fenced,
    /// Refused before any work: missing/malformed key, oversized body.
    Rejected,
    /// The store failed: refused (fail_closed) or forwarded unprotected (fail_open).
    StoreError,
    /// Forwarded without a key on an optional route, or with the store down under fail_open.
    Unprotected,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Attached => "attached",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Failed => "failed",
            Self::Fenced => "fenced",
            Self::Rejected => "rejected",
            Self::StoreError => "store_error",
            Self::Unprotected => "unprotected",
        }
    }

    /// Whether the response came from a stored or live result without an
    /// upstream call of its own (the seed's "hit").
    pub fn is_hit(self) -> bool {
        matches!(self, Self::Replayed | Self::Attached)
    }
}

/// Sliding window of the hit ratio.
const RATIO_WINDOW: Duration = Duration::from_secs(300);
/// Window over which requests per key are counted.
const KEY_WINDOW: Duration = Duration::from_secs(600);

/// The metrics state of one process: the Prometheus recorder plus the
/// windows behind the derived gauges.
#[derive(Debug, Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    handle: Option<PrometheusHandle>,
    /// Held for one short update per request, never across `.await`.
    ratio: Mutex<RatioWindow>,
    keys: Mutex<KeyCounts>,
}

static GLOBAL: OnceLock<Telemetry> = OnceLock::new();

impl Telemetry {
    /// The process-wide telemetry, installing the Prometheus recorder on
    /// first use. If another recorder is already installed, metrics go there
    /// and [`Telemetry::render`] returns only the derived gauges' notice.
    pub fn global() -> &'static Telemetry {
        GLOBAL.get_or_init(|| {
            let handle = recorder_builder()
                .install_recorder()
                .map_err(|e| tracing::warn!(error = %e, "prometheus recorder not installed"))
                .ok();
            Telemetry::with_handle(handle)
        })
    }

    fn with_handle(handle: Option<PrometheusHandle>) -> Self {
        let now = Instant::now();
        Self {
            inner: Arc::new(Inner {
                handle,
                ratio: Mutex::new(RatioWindow::new(RATIO_WINDOW, 10, now)),
                keys: Mutex::new(KeyCounts::new(KEY_WINDOW, 200_000, now)),
            }),
        }
    }

    /// Counts one request and its outcome. `key_id` identifies the scoped
    /// key (a hash; never exported) for the requests-per-key distribution.
    pub fn request(&self, outcome: Outcome, key_id: Option<u64>) {
        metrics::counter!(names::REQUESTS, "outcome" => outcome.as_str()).increment(1);
        if outcome.is_hit() {
            metrics::counter!(names::HIT).increment(1);
        }
        if outcome == Outcome::Fenced {
            metrics::counter!(names::FENCED).increment(1);
        }
        let now = Instant::now();
        self.inner
            .ratio
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(outcome.is_hit(), now);
        if let Some(id) = key_id {
            self.inner
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(id, now);
        }
    }

    /// Counts a request that met a PENDING key (whatever happened next).
    pub fn inflight_conflict(&self) {
        metrics::counter!(names::INFLIGHT_CONFLICT).increment(1);
    }

    /// Adds the tokens a replay did not pay for (from the stored `usage`).
    pub fn tokens_saved(&self, tokens: u64) {
        metrics::counter!(names::TOKENS_SAVED).increment(tokens);
    }

    /// Updates the derived gauges (hit ratio, requests-per-key quantiles)
    /// and renders everything in the Prometheus text format.
    pub fn render(&self) -> String {
        self.refresh(Instant::now());
        match &self.inner.handle {
            Some(h) => h.render(),
            None => String::from("# metrics are recorded by another recorder in this process\n"),
        }
    }

    fn refresh(&self, now: Instant) {
        let ratio = self
            .inner
            .ratio
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ratio(now);
        metrics::gauge!(names::HIT_RATIO).set(ratio);
        let keys = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (label, q) in [("0.5", 0.5), ("0.9", 0.9), ("0.99", 0.99)] {
            metrics::gauge!(names::REQUESTS_PER_KEY, "quantile" => label)
                .set(keys.quantile(q, now));
        }
        metrics::gauge!(names::KEYS_TRACKED).set(keys.tracked(now) as f64);
    }
}

fn recorder_builder() -> PrometheusBuilder {
    let latency = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ];
    let builder = PrometheusBuilder::new();
    builder
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
        .unwrap_or_else(|_| PrometheusBuilder::new())
}
