//! The dashboard: the page itself (public, holding no data) and the two
//! JSON feeds it polls with the admin token: `/admin/stats` (the figures,
//! and the hit ratio against its alert) and `/admin/recent` (the keys worth
//! a look, each opening its timeline).

use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::State;
use http::{HeaderMap, HeaderValue, Response, header};
use idemgate_telemetry::{RecentKey, RouteRequests, Snapshot};

use super::alert::{self, HitRatioRule};
use super::{AdminState, RouteName, refuse_unauthorized};

/// The dashboard: one self-contained page (HTML, CSS and JS from
/// `assets/`, inlined; no external resources, no build step).
pub(super) static DASHBOARD: LazyLock<String> = LazyLock::new(|| {
    include_str!("../../assets/dashboard.html")
        .replacen("/*STYLE*/", include_str!("../../assets/dashboard.css"), 1)
        .replacen("/*SCRIPT*/", include_str!("../../assets/dashboard.js"), 1)
});

/// Only this page's own inline code, and requests to this listener.
const DASHBOARD_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(super) async fn page() -> Response<Body> {
    let mut resp = Response::new(Body::from(DASHBOARD.as_str()));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(DASHBOARD_CSP),
    );
    // The page may carry the admin token in its query: never pass it on.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `GET /admin/stats`: the dashboard's figures, behind the admin token like
/// every `/admin/` endpoint (only `/healthz`, `/readyz` and `/metrics`, for
/// probes and scrapers, are open; the dashboard page itself holds no data).
pub(super) async fn stats(State(s): State<AdminState>, headers: HeaderMap) -> Response<Body> {
    if let Some(refusal) = refuse_unauthorized(&s, &headers) {
        return refusal;
    }
    let snap = s.telemetry.snapshot();
    let outcomes: serde_json::Map<String, serde_json::Value> = snap
        .requests
        .iter()
        .map(|(o, n)| (o.as_str().to_owned(), (*n).into()))
        .collect();
    let now_ms = idemgate_engine::backend::now_ms();
    let routes: Vec<serde_json::Value> = snap.routes.iter().map(route_row).collect();
    let body = serde_json::json!({
        "routes": routes,
        "time_ms": now_ms,
        "requests_total": snap.requests_total,
        "hits": snap.hits,
        "hit_ratio": snap.hit_ratio,
        "inflight_conflicts": snap.inflight_conflicts,
        "tokens_saved": snap.tokens_saved,
        "stream_events_lost": snap.stream_events_lost,
        "requests_per_key": { "p50": snap.requests_per_key_p50, "p99": snap.requests_per_key_p99 },
        "outcomes": outcomes,
        "hit_ratio_alert": hit_ratio_alert(&s.hit_ratio_rule, &snap),
    });
    json(&body)
}

/// A route's requests and the share that ran protected (`null` before its
/// first request).
fn route_row(r: &RouteRequests) -> serde_json::Value {
    let unprotected = r.unprotected_no_key + r.unprotected_store_error;
    let share = (r.requests > 0).then(|| 1.0 - unprotected as f64 / r.requests as f64);
    serde_json::json!({
        "route": r.route,
        "requests": r.requests,
        "unprotected_no_key": r.unprotected_no_key,
        "unprotected_store_error": r.unprotected_store_error,
        "protected_share": share,
    })
}

/// The hit ratio against the alert: the baseline, the ratio at which the
/// alert fires, and whether the ratio is above it now (the rule then fires
/// after five minutes of it). This replica's own figures: the rule itself
/// runs in Prometheus over every replica's counters.
pub(super) fn hit_ratio_alert(rule: &HitRatioRule, snap: &Snapshot) -> serde_json::Value {
    let keyed_rate = snap.keyed_requests_5m as f64 / RATE_WINDOW_SECS;
    let threshold = snap.hit_ratio_baseline.map(|b| rule.threshold(b));
    let state = match threshold {
        None => "no_baseline",
        Some(t) if snap.hit_ratio > t && keyed_rate > rule.min_rate => "above",
        Some(t) if snap.hit_ratio > t => "above_low_traffic",
        Some(_) => "below",
    };
    serde_json::json!({
        "alert": alert::ALERT,
        "factor": rule.factor,
        "floor": rule.floor,
        "min_rate": rule.min_rate,
        "source": rule.source,
        "ratio": snap.hit_ratio,
        "baseline": snap.hit_ratio_baseline,
        "threshold": threshold,
        "minutes_to_baseline": snap.minutes_to_baseline,
        "keyed_rate": keyed_rate,
        "state": state,
    })
}

/// The window of the ratio and of the rule's request rate, in seconds.
const RATE_WINDOW_SECS: f64 = 300.0;

/// Rows per list of `/admin/recent`.
const RECENT_ROWS: usize = 20;

/// `GET /admin/recent`: the recent keys of this process (most retried, in
/// flight, latest conflicts, latest fenced completions), each row naming
/// the key as its timeline does (tenant id, route id and prefix, key).
/// Behind the admin token like every `/admin/` endpoint.
pub(super) async fn recent(State(s): State<AdminState>, headers: HeaderMap) -> Response<Body> {
    if let Some(refusal) = refuse_unauthorized(&s, &headers) {
        return refusal;
    }
    let snap = s.telemetry.recent_keys(RECENT_ROWS);
    let rows = |list: &[RecentKey]| -> Vec<serde_json::Value> {
        list.iter().map(|r| recent_row(&s.routes, r)).collect()
    };
    let body = serde_json::json!({
        "time_ms": idemgate_engine::backend::now_ms(),
        "tracked": snap.tracked,
        "capacity": snap.capacity,
        "inflight": rows(&snap.inflight),
        "most_retried": rows(&snap.most_retried),
        "conflicts": rows(&snap.conflicts),
        "fenced": rows(&snap.fenced),
    });
    json(&body)
}

fn recent_row(routes: &[RouteName], r: &RecentKey) -> serde_json::Value {
    let prefix = routes
        .iter()
        .find(|route| route.id == r.key.namespace)
        .map(|route| route.prefix.as_str());
    serde_json::json!({
        "key": r.key.key.as_str(),
        "tenant": r.key.tenant,
        "namespace": r.key.namespace,
        "prefix": prefix,
        "requests": r.requests,
        "conflicts": r.conflicts,
        "fenced": r.fenced,
        "last_outcome": r.last_outcome.map(idemgate_telemetry::RequestOutcome::as_str),
        "last_seen_ms": r.last_seen_ms,
        "running_since_ms": r.running_since_ms,
        "last_conflict_ms": r.last_conflict_ms,
        "last_fenced_ms": r.last_fenced_ms,
    })
}

/// A JSON answer that no cache keeps.
fn json(body: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Body::from(body.to_string()));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests;
