//! Metrics and logs for idemgate.
//!
//! The idempotency hit ratio is the earliest failure
//! signal: when an upstream slows, clients time out and retry, their retries
//! are answered from stored results and the ratio climbs, minutes before the
//! error rate moves (docs/design.md, "Metrics"). The names below are
//! stable: dashboards and alert rules depend on them
//! (`idempotency_hit_total`, `idempotency_inflight_conflict_total`,
//! `idempotency_hit_ratio`, …), and labels stay low-cardinality: a route at
//! most, never a key, never a tenant.
//!
//! # Layout
//! - [`names`]: every metric name, in one place.
//! - [`Telemetry`]: the process-wide counters and the derived series that
//!   need state (the sliding hit ratio, requests-per-key histogram),
//!   refreshed at each scrape; [`RouteTelemetry`] is its handle for one
//!   route; [`Snapshot`] the figures a dashboard polls.
//! - `outcome`: [`RequestOutcome`], how a keyed request ended.
//! - `release`: [`ReleaseReason`], why an owner gave its key back.
//! - `window`: the sliding hit ratio, its baseline, requests per key.
//! - `route`: [`RouteTelemetry`], the handle that labels by route, and
//!   [`RunningKey`].
//! - `recent`: [`RecentKeys`], the bounded table of keys the dashboard
//!   lists (most retried, in flight, conflicts, fenced).
//! - `counters`: the per-request counters of one label set, each looked
//!   up in the recorder once.
//! - `trace`: [`TraceContext`], the trace context a downstream call
//!   carries, as exported over OTLP.
//! - `store`: [`InstrumentedStore`], a [`Store`](idemgate_engine::Store) decorator
//!   timing every operation by backend and op, and counting errors.
//! - [`logging`]: the JSON-lines log format, for capturing logs in tests
//!   (the `idemgate` binary sets up its own subscriber with the same format).
//! - `otlp` (cargo feature `otlp`): OTLP/HTTP export of the request spans,
//!   a layer beside the logs; [`exported_trace_context`] is the trace
//!   context that makes a downstream call a child of an exported span.
//!
//! # The key decision
//! Recording and exporting are separate: libraries (the idempotency layer)
//! record through [`Telemetry::shared`], which never installs anything, and
//! the program (the gateway) calls [`Telemetry::global`] once to install the
//! Prometheus recorder. A service that embeds the layer and brings its own
//! recorder keeps it; the gateway gets one pipeline for everything.
//!
//! Histograms are exported with buckets (true Prometheus histograms), not the
//! exporter's default summaries: summaries cannot be aggregated across
//! gateway replicas.

mod counters;
pub mod logging;
pub mod names;
#[cfg(feature = "otlp")]
pub mod otlp;
mod outcome;
mod recent;
mod release;
mod route;
mod store;
mod trace;
mod window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use counters::Counters;
use metrics::Label;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use std::hash::{DefaultHasher, Hash, Hasher};

use idemgate_engine::ScopedKey;
use idemgate_engine::backend::now_ms;

pub use outcome::RequestOutcome;
pub use recent::{RecentKey, RecentKeys, RecentSnapshot};
pub use release::ReleaseReason;
pub use route::{RouteTelemetry, RunningKey};
pub use store::InstrumentedStore;
pub use trace::{TraceContext, exported_trace_context};
pub use window::{KeyCounts, RatioHistory, RatioWindow};

/// Sliding window of the hit ratio.
const RATIO_WINDOW: Duration = Duration::from_secs(300);
/// Window over which requests per key are counted.
const KEY_WINDOW: Duration = Duration::from_secs(600);
/// Keys the recent-keys table holds at most (a few hundred: what a person
/// can scan, in well under a megabyte).
pub const RECENT_KEYS: usize = 500;

/// The id of a scoped key in the requests-per-key distribution: a hash,
/// kept in memory only.
pub fn key_id(key: &ScopedKey) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The metrics state of one process: the counters behind the derived
/// gauges and the dashboard, and (once [`Telemetry::global`] ran) the
/// Prometheus recorder.
#[derive(Debug, Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    handle: OnceLock<Option<PrometheusHandle>>,
    /// Held for one short update per request, never across `.await`.
    ratio: Mutex<RatioWindow>,
    history: Mutex<RatioHistory>,
    keys: Mutex<KeyCounts>,
    recent: Mutex<RecentKeys>,
    totals: Totals,
    /// The counters of requests counted without a route.
    unrouted: Counters,
    /// Every route's counters, by route id, for the per-route figures.
    routes: Mutex<Vec<(Arc<str>, Arc<Counters>)>>,
}

/// Process totals, mirrored from the counters so a dashboard can read them
/// without parsing the exposition text.
#[derive(Debug, Default)]
struct Totals {
    by_outcome: [AtomicU64; RequestOutcome::ALL.len()],
    hits: AtomicU64,
    conflicts: AtomicU64,
    tokens_saved: AtomicU64,
    events_lost: AtomicU64,
}

/// The figures of [`Telemetry::snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Keyed requests by outcome, since start.
    pub requests: Vec<(RequestOutcome, u64)>,
    /// All keyed requests counted, since start.
    pub requests_total: u64,
    /// Hits (replayed or attached), since start.
    pub hits: u64,
    /// Hits / requests over the sliding five-minute window.
    pub hit_ratio: f64,
    /// Keyed requests in that window (the alert needs more than 0.1/s).
    pub keyed_requests_5m: u64,
    /// The hit ratio's baseline as the shipped alert rule computes it (the
    /// mean over the hour that ended 15 minutes ago); `None` until this
    /// process has that much history.
    pub hit_ratio_baseline: Option<f64>,
    /// Minutes until the baseline has its first sample (0 once it has).
    pub minutes_to_baseline: u64,
    /// Requests that met a PENDING key, since start.
    pub inflight_conflicts: u64,
    /// Tokens not billed again thanks to replays, since start.
    pub tokens_saved: u64,
    /// Stream events relayed but lost with their broken stream, since start.
    pub stream_events_lost: u64,
    /// Median requests per key over the last ten minutes.
    pub requests_per_key_p50: f64,
    /// 99th percentile of requests per key over the last ten minutes.
    pub requests_per_key_p99: f64,
    /// Each route's requests and how many ran unprotected, since start.
    pub routes: Vec<RouteRequests>,
}

/// One route's requests in a [`Snapshot`]: the share that ran protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRequests {
    /// The route id.
    pub route: String,
    /// Requests counted on the route, every outcome.
    pub requests: u64,
    /// Forwarded unprotected: no key on a route where it is optional.
    pub unprotected_no_key: u64,
    /// Forwarded unprotected: the store failed under `fail_open`.
    pub unprotected_store_error: u64,
}

static SHARED: OnceLock<Telemetry> = OnceLock::new();

impl Telemetry {
    /// The process-wide telemetry, installing the Prometheus recorder on
    /// first use: the program's call (the gateway makes it at start). If
    /// another recorder is already installed, metrics go there and
    /// [`Telemetry::render`] returns only a notice.
    pub fn global() -> &'static Telemetry {
        let t = Self::shared();
        t.inner.handle.get_or_init(|| {
            let handle = recorder_builder()
                .install_recorder()
                .map_err(|e| tracing::warn!(error = %e, "prometheus recorder not installed"))
                .ok();
            if handle.is_some() {
                describe_all();
            }
            handle
        });
        t
    }

    /// The process-wide telemetry without installing any recorder: what a
    /// library records through. Metrics go to whatever recorder the program
    /// installed (none: they are dropped, the dashboard figures still count).
    pub fn shared() -> &'static Telemetry {
        SHARED.get_or_init(Self::fresh)
    }

    fn fresh() -> Telemetry {
        let now = Instant::now();
        Telemetry {
            inner: Arc::new(Inner {
                handle: OnceLock::new(),
                ratio: Mutex::new(RatioWindow::new(RATIO_WINDOW, 10, now)),
                history: Mutex::new(RatioHistory::new()),
                keys: Mutex::new(KeyCounts::new(KEY_WINDOW, 200_000, now)),
                recent: Mutex::new(RecentKeys::new(RECENT_KEYS)),
                totals: Totals::default(),
                unrouted: Counters::default(),
                routes: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether this process's Prometheus recorder is installed.
    pub fn is_exporting(&self) -> bool {
        matches!(self.inner.handle.get(), Some(Some(_)))
    }

    /// A handle that labels everything it records with `route`.
    ///
    /// Registers the route's counters at zero, so `rate()` and the shipped
    /// alerts see every series from the first scrape on.
    pub fn route(&self, route: impl Into<String>) -> RouteTelemetry {
        let route: Arc<str> = Arc::from(route.into());
        let counters = {
            let mut routes = self
                .inner
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match routes.iter().find(|(r, _)| *r == route) {
                Some((_, c)) => Arc::clone(c),
                None => {
                    let c = Arc::new(Counters::new(vec![Label::new("route", route.to_string())]));
                    routes.push((Arc::clone(&route), Arc::clone(&c)));
                    c
                }
            }
        };
        for counter in [
            counters.hit(),
            counters.conflict(),
            counters.fenced(),
            counters.tokens_saved(),
            counters.events_lost(),
        ] {
            counter.increment(0);
        }
        // The outcomes the shipped rules divide by or alert on; the others
        // appear with their first request.
        for o in [
            RequestOutcome::Executed,
            RequestOutcome::Replayed,
            RequestOutcome::Failed,
        ] {
            if let Some(c) = counters.request(o) {
                c.increment(0);
            }
        }
        RouteTelemetry {
            telemetry: self.clone(),
            route,
            counters,
        }
    }

    /// Counts one request and its outcome. `key_id` identifies the scoped
    /// key (a hash; never exported) for the requests-per-key distribution.
    pub fn request(&self, outcome: RequestOutcome, key_id: Option<u64>) {
        self.count_request(&self.inner.unrouted, outcome, key_id);
    }

    /// Counts a request that met a PENDING key (whatever happened next).
    pub fn inflight_conflict(&self) {
        self.count_conflict(&self.inner.unrouted);
    }

    /// Adds the tokens a replay did not pay for (from the stored `usage`).
    pub fn tokens_saved(&self, tokens: u64) {
        self.count_tokens(&self.inner.unrouted, tokens);
    }

    /// Counts stream events that were relayed but are lost with their
    /// broken stream (not stored: a retry runs again).
    pub fn stream_events_lost(&self, events: u64) {
        self.count_events_lost(&self.inner.unrouted, events);
    }

    /// The counter of replays answered from memory
    /// (`idemgate_replay_cache_hits_total`), resolved once: the replay
    /// cache bumps it on its hot path.
    pub fn replay_cache_hits(&self) -> metrics::Counter {
        metrics::counter!(names::REPLAY_CACHE_HITS)
    }

    /// Counts a stored response that could not be sealed or opened, by
    /// `reason` (a fixed label such as `tampered` or `unknown_key_id`).
    pub fn seal_failure(&self, reason: &'static str) {
        metrics::counter!(names::SEAL_FAILURES, "reason" => reason).increment(1);
    }

    /// A request whose handling panicked, caught `at` (`"execution"` or
    /// `"request"`): `idemgate_panics_total{at}`.
    pub fn panicked(&self, at: &'static str) {
        metrics::counter!(names::PANICS, "at" => at).increment(1);
    }

    /// A connection or request stopped by a connection limit
    /// (`idemgate_connection_limits_total{limit}`; see
    /// [`names::CONNECTION_LIMITS`] for the labels).
    pub fn connection_limit(&self, limit: &'static str) {
        metrics::counter!(names::CONNECTION_LIMITS, "limit" => limit).increment(1);
    }

    /// The gauge of open client connections
    /// (`idemgate_connections_open`), resolved once by the listener.
    pub fn connections_open(&self) -> metrics::Gauge {
        metrics::gauge!(names::CONNECTIONS_OPEN)
    }

    fn count_request(&self, counters: &Counters, outcome: RequestOutcome, key_id: Option<u64>) {
        counters.count(outcome);
        let totals = &self.inner.totals;
        if let Some(c) = totals.by_outcome.get(outcome.index()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if outcome.is_hit() {
            totals.hits.fetch_add(1, Ordering::Relaxed);
            counters.hit().increment(1);
        }
        if outcome == RequestOutcome::Fenced {
            counters.fenced().increment(1);
        }
        if let Some(c) = counters.request(outcome) {
            c.increment(1);
        }
        let now = Instant::now();
        // The ratio is over requests idempotency protects: an unkeyed
        // request on an optional route is neither a hit nor a miss, nor is
        // a read of an operation's result (not a retry).
        if !outcome.is_unprotected() && outcome != RequestOutcome::OperationRead {
            self.inner
                .ratio
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(outcome.is_hit(), now);
        }
        if let Some(id) = key_id {
            let done = {
                let mut keys = self
                    .inner
                    .keys
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                keys.record(id, now);
                keys.take_finished(now)
            };
            observe_per_key(done);
        }
    }

    fn count_conflict(&self, counters: &Counters) {
        self.inner.totals.conflicts.fetch_add(1, Ordering::Relaxed);
        counters.conflict().increment(1);
    }

    fn count_tokens(&self, counters: &Counters, tokens: u64) {
        self.inner
            .totals
            .tokens_saved
            .fetch_add(tokens, Ordering::Relaxed);
        counters.tokens_saved().increment(tokens);
    }

    fn count_events_lost(&self, counters: &Counters, events: u64) {
        self.inner
            .totals
            .events_lost
            .fetch_add(events, Ordering::Relaxed);
        counters.events_lost().increment(events);
    }

    /// The figures a dashboard shows, read now.
    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let totals = &self.inner.totals;
        let requests: Vec<(RequestOutcome, u64)> = RequestOutcome::ALL
            .iter()
            .zip(&totals.by_outcome)
            .map(|(o, c)| (*o, c.load(Ordering::Relaxed)))
            .collect();
        let (hits_5m, keyed_requests_5m) = self
            .inner
            .ratio
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts(now);
        let hit_ratio = if keyed_requests_5m == 0 {
            0.0
        } else {
            hits_5m as f64 / keyed_requests_5m as f64
        };
        let minute = self.sample_history(hit_ratio);
        let (hit_ratio_baseline, minutes_to_baseline) = {
            let h = self
                .inner
                .history
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (h.baseline(minute), h.minutes_to_baseline(minute))
        };
        let (p50, p99) = {
            let keys = self
                .inner
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (keys.quantile(0.5, now), keys.quantile(0.99, now))
        };
        let routes = self
            .inner
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(route, c)| RouteRequests {
                route: route.to_string(),
                requests: RequestOutcome::ALL.iter().map(|o| c.total(*o)).sum(),
                unprotected_no_key: c.total(RequestOutcome::UnprotectedNoKey),
                unprotected_store_error: c.total(RequestOutcome::UnprotectedStoreError),
            })
            .collect();
        Snapshot {
            routes,
            requests_total: requests
                .iter()
                .filter(|(o, _)| !o.is_unprotected())
                .map(|(_, n)| n)
                .sum(),
            requests,
            hits: totals.hits.load(Ordering::Relaxed),
            hit_ratio,
            keyed_requests_5m,
            hit_ratio_baseline,
            minutes_to_baseline,
            inflight_conflicts: totals.conflicts.load(Ordering::Relaxed),
            tokens_saved: totals.tokens_saved.load(Ordering::Relaxed),
            stream_events_lost: totals.events_lost.load(Ordering::Relaxed),
            requests_per_key_p50: p50,
            requests_per_key_p99: p99,
        }
    }

    /// Updates the derived series (hit ratio, requests-per-key histogram)
    /// and renders everything in the Prometheus text format.
    pub fn render(&self) -> String {
        self.refresh(Instant::now());
        match self.inner.handle.get() {
            Some(Some(h)) => h.render(),
            _ => String::from("# metrics are recorded by another recorder in this process\n"),
        }
    }

    /// Drains the recorder's histogram buffers; call it every few seconds
    /// when nothing scrapes (rendering does it too).
    pub fn run_upkeep(&self) {
        let ratio = self
            .inner
            .ratio
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ratio(Instant::now());
        self.sample_history(ratio);
        if let Some(Some(h)) = self.inner.handle.get() {
            h.run_upkeep();
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
        self.sample_history(ratio);
        let mut keys = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        observe_per_key(keys.take_finished(now));
        metrics::gauge!(names::KEYS_TRACKED).set(keys.tracked(now) as f64);
    }

    /// Keeps the five-minute ratio as this minute's baseline sample (the
    /// first one in a minute counts, as a rule evaluated once a minute);
    /// returns the minute.
    fn sample_history(&self, ratio: f64) -> u64 {
        let minute = now_ms() / 60_000;
        self.inner
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sample(minute, ratio);
        minute
    }

    /// The recent-keys lists, each at most `per_list` long.
    pub fn recent_keys(&self, per_list: usize) -> RecentSnapshot {
        self.recent().snapshot(per_list)
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, RecentKeys> {
        self.inner
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every key's requests-per-key count now, observing each total
    /// in the histogram (otherwise a key is observed once it has been quiet
    /// for five to ten minutes): for a final scrape, and for tests.
    pub fn finish_keys(&self) {
        let done = self
            .inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finish_all(Instant::now());
        observe_per_key(done);
    }
}

/// Observes finished keys' totals in the requests-per-key histogram.
fn observe_per_key(totals: Vec<u32>) {
    for n in totals {
        metrics::histogram!(names::REQUESTS_PER_KEY).record(f64::from(n));
    }
}

/// Gives every metric its `# HELP` text, and sets the build info.
fn describe_all() {
    for (name, help) in names::HELP {
        let name = *name;
        let help = *help;
        if name.ends_with("_total") {
            metrics::describe_counter!(name, help);
        } else if name.ends_with("_seconds") || name == names::REQUESTS_PER_KEY {
            metrics::describe_histogram!(name, help);
        } else {
            metrics::describe_gauge!(name, help);
        }
    }
    metrics::gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    // Registered empty, so the histogram is exported from the first scrape
    // (its first observation comes only when a key goes quiet).
    let _ = metrics::histogram!(names::REQUESTS_PER_KEY);
}

/// Buckets of the requests-per-key histogram: most keys are sent once or
/// twice; a Fibonacci-like tail shows retry storms.
const PER_KEY_BUCKETS: [f64; 10] = [1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0];

fn recorder_builder() -> PrometheusBuilder {
    let latency = [
        0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(names::REQUESTS_PER_KEY.into()),
                &PER_KEY_BUCKETS,
            )
        })
        .unwrap_or_else(|_| PrometheusBuilder::new())
}

#[cfg(test)]
mod tests;
