//! The admin listener: health, readiness, `/metrics`, the dashboard (`/`,
//! a static page polling `/admin/stats` and `/admin/recent` with the admin
//! token; in `dashboard`, the hit-ratio alert it mirrors in `alert`), the
//! timeline of one key (`GET /admin/keys/{key}/timeline`) and the operator's forget
//! (`DELETE /admin/keys/{key}`: clears a key, such as an outcome-unknown
//! answer on a charging route, once the upstream's side has been checked),
//! both behind the admin token. A raw credential goes in the
//! `X-Idemgate-Credential` header, and is refused in the query.
//!
//! The token is compared in constant time: both sides are hashed (so their
//! lengths do not show either) and the digests compared with `subtle`.
//! Without a configured token the token-protected endpoints are off (403),
//! never open.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::routing::{delete, get};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use idemgate_engine::{Attempt, AttemptOutcome, ClientKey, RecordState, ScopedKey, Store};
use idemgate_layer::StoredResponse;
use idemgate_telemetry::Telemetry;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::problem::problem;

pub(crate) use alert::HitRatioRule;

mod alert;
mod dashboard;
mod host;

/// A route as the admin endpoints name it.
#[derive(Clone, Debug)]
pub(crate) struct RouteName {
    /// The route id: the namespace of its records.
    pub(crate) id: String,
    /// Its path prefix.
    pub(crate) prefix: String,
    /// How long its keys' timelines are kept (its `done_ttl`).
    pub(crate) done_ttl: Duration,
}

/// What the admin endpoints look at.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The gateway's (instrumented) store.
    pub(crate) store: Arc<dyn Store>,
    /// False once shutdown has begun.
    pub(crate) ready: Arc<AtomicBool>,
    /// The metrics pipeline.
    pub(crate) telemetry: &'static Telemetry,
    /// The token of the protected endpoints; `None` turns them off.
    pub(crate) admin_token: Option<Secret>,
    /// The configured routes, for namespace lookups.
    pub(crate) routes: Arc<[RouteName]>,
    /// The hit-ratio alert the dashboard compares the ratio with.
    pub(crate) hit_ratio_rule: Arc<HitRatioRule>,
    /// Host names answered besides IP addresses and `localhost`.
    pub(crate) admin_hosts: Arc<[String]>,
}

/// The admin router.
pub(crate) fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/", get(dashboard::page))
        .route("/admin/stats", get(dashboard::stats))
        .route("/admin/recent", get(dashboard::recent))
        .route("/admin/keys/{key}/timeline", get(timeline))
        .route("/admin/keys/{key}", delete(forget))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            host::check,
        ))
        .with_state(state)
}

/// Whether `given` equals `expected`, in time independent of where they
/// differ and of either length (both are hashed first).
pub(crate) fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    let a = Sha256::digest(given);
    let b = Sha256::digest(expected);
    a.as_slice().ct_eq(b.as_slice()).into()
}

/// The bearer token of an `Authorization` header.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

/// `None` when the request may use a protected endpoint; otherwise the
/// refusal: 403 while no token is configured, 401 without the right one.
pub(crate) fn refuse_unauthorized(s: &AdminState, headers: &HeaderMap) -> Option<Response<Body>> {
    let Some(expected) = &s.admin_token else {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "admin-disabled",
            "Admin endpoint disabled",
            "no admin token is configured: set `admin_token` in the configuration \
             (or IDEMGATE_ADMIN_TOKEN) to enable the protected admin endpoints",
        ));
    };
    match bearer(headers) {
        Some(given) if token_matches(given, expected.expose().as_bytes()) => None,
        _ => {
            let mut resp = problem(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "send the admin token as `Authorization: Bearer <token>`",
            );
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idemgate-admin\""),
            );
            Some(resp)
        }
    }
}

fn bad_request(detail: &str) -> Response<Body> {
    problem(
        StatusCode::BAD_REQUEST,
        "bad-request",
        "Bad request",
        detail,
    )
}

/// Why a namespace names no route.
#[derive(Debug, PartialEq, Eq)]
enum RouteLookup {
    /// No route has this id or prefix.
    Unknown(String),
    /// None given, and several routes exist.
    Ambiguous,
}

impl RouteLookup {
    fn response(&self) -> Response<Body> {
        match self {
            Self::Unknown(n) => {
                let shown: String = n.chars().take(100).collect();
                problem(
                    StatusCode::NOT_FOUND,
                    "unknown-namespace",
                    "Unknown namespace",
                    &format!("no route has the id or prefix `{shown}`"),
                )
            }
            Self::Ambiguous => bad_request(
                "several routes are configured: name one with `namespace=<route id or prefix>`",
            ),
        }
    }
}

/// Which route `namespace` names (its id or its prefix); with no
/// namespace, the only route.
fn find_route<'a>(
    routes: &'a [RouteName],
    namespace: Option<&str>,
) -> Result<&'a RouteName, RouteLookup> {
    match namespace {
        Some(n) => routes
            .iter()
            .find(|r| r.id == n)
            .or_else(|| routes.iter().find(|r| r.prefix == n))
            .ok_or_else(|| RouteLookup::Unknown(n.to_owned())),
        None => match routes {
            [only] => Ok(only),
            _ => Err(RouteLookup::Ambiguous),
        },
    }
}

/// The header that carries a raw credential to the key endpoints. Never
/// the query: URLs end up in access logs, proxies and browser history.
pub(crate) const CREDENTIAL_HEADER: &str = "x-idemgate-credential";

/// The record a key endpoint names: `{key}`, `?tenant=…&namespace=…` or
/// the credential in the `X-Idemgate-Credential` header; or the refusal.
fn addressed<'a>(
    s: &'a AdminState,
    raw_key: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<(ScopedKey, &'a RouteName), Box<Response<Body>>> {
    let refuse = |detail: &str| Err(Box::new(bad_request(detail)));
    let Ok(key) = ClientKey::parse(raw_key) else {
        return refuse("the key is not a valid idempotency key");
    };
    let (mut tenant, mut namespace) = (None, None);
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "tenant" => tenant = Some(v.into_owned()),
            "credential" => {
                return refuse(
                    "a credential in the URL is refused (URLs are logged): send it in the \
                     `X-Idemgate-Credential` header, or give the tenant id as `tenant=`",
                );
            }
            "namespace" => namespace = Some(v.into_owned()),
            _ => {}
        }
    }
    let credential = headers.get(CREDENTIAL_HEADER).map(|v| v.as_bytes());
    let tenant = match (tenant, credential) {
        (Some(_), Some(_)) => return refuse("give `tenant` or `credential`, not both"),
        (Some(t), None) if !t.is_empty() => t,
        (Some(_), None) => return refuse("`tenant` is empty"),
        // The tenant a request with this credential (or tenant header)
        // value lands in; the credential itself is neither kept nor logged.
        (None, Some(c)) => idemgate_layer::key::tenant_id(c),
        (None, None) => idemgate_layer::key::ANONYMOUS.to_owned(),
    };
    let route = find_route(&s.routes, namespace.as_deref().filter(|n| !n.is_empty()))
        .map_err(|e| Box::new(e.response()))?;
    Ok((ScopedKey::new(tenant, route.id.clone(), key), route))
}

fn store_unavailable(detail: &str) -> Response<Body> {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
        "Store unavailable",
        detail,
    )
}

/// `DELETE /admin/keys/{key}?tenant=…&namespace=…` (or the credential
/// header): forgets
/// the key (its record, whatever its state; the timeline notes it). 200
/// with what was forgotten, 404 `key-not-found` when there was no record.
async fn forget(
    State(s): State<AdminState>,
    Path(raw_key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response<Body> {
    if let Some(refusal) = refuse_unauthorized(&s, &headers) {
        return refusal;
    }
    let (scoped, route) = match addressed(&s, &raw_key, query.as_deref(), &headers) {
        Ok(found) => found,
        Err(refusal) => return *refusal,
    };
    let note = Attempt {
        at_ms: idemgate_engine::backend::now_ms(),
        replica: "admin".to_owned(),
        outcome: AttemptOutcome::Forgotten,
        status: None,
        latency_us: 0,
        repeated: None,
    };
    match s.store.forget(&scoped, &note, route.done_ttl).await {
        Ok(true) => {
            tracing::warn!(idempotency_key = %scoped.key.as_str(), namespace = %scoped.namespace, "key forgotten by an operator");
            let body = serde_json::json!({
                "key": scoped.key.as_str(),
                "tenant": scoped.tenant,
                "namespace": scoped.namespace,
                "forgotten": true,
            });
            let mut resp = Response::new(Body::from(body.to_string()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "key-not-found",
            "Key not found",
            "no record for this key (check the tenant or credential, and the namespace)",
        ),
        Err(e) => {
            tracing::warn!(error = %e, "forget failed");
            store_unavailable("the store could not be written")
        }
    }
}

/// `GET /admin/keys/{key}/timeline?tenant=…&namespace=…`, the credential
/// (instead of `tenant`) in the `X-Idemgate-Credential` header.
async fn timeline(
    State(s): State<AdminState>,
    Path(raw_key): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response<Body> {
    if let Some(refusal) = refuse_unauthorized(&s, &headers) {
        return refusal;
    }
    let (scoped, route) = match addressed(&s, &raw_key, query.as_deref(), &headers) {
        Ok(found) => found,
        Err(refusal) => return *refusal,
    };
    let (record, attempts) = match tokio::try_join!(s.store.get(&scoped), s.store.timeline(&scoped))
    {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "timeline lookup failed");
            return store_unavailable("the store could not be read");
        }
    };
    let mut attempts = attempts;
    attempts.sort_by_key(|a| a.at_ms);
    let mut body = serde_json::json!({
        "key": scoped.key.as_str(),
        "tenant": scoped.tenant,
        "namespace": scoped.namespace,
        "prefix": route.prefix,
        "attempts": attempts.iter().map(attempt_json).collect::<Vec<_>>(),
    });
    let state = match record.map(|r| r.state) {
        None => serde_json::json!({ "state": "absent" }),
        Some(RecordState::Pending {
            lease_expires_at_ms,
            ..
        }) => serde_json::json!({
            "state": "pending",
            "lease_expires_at_ms": lease_expires_at_ms,
        }),
        Some(RecordState::Done {
            payload,
            expires_at_ms,
        }) => serde_json::json!({
            "state": "done",
            "status": StoredResponse::decode(&payload).ok().map(|r| r.status.as_u16()),
            "expires_at_ms": expires_at_ms,
        }),
    };
    if let (Some(obj), serde_json::Value::Object(st)) = (body.as_object_mut(), state) {
        obj.extend(st);
    }
    let mut resp = Response::new(Body::from(body.to_string()));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn attempt_json(a: &Attempt) -> serde_json::Value {
    let at = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(a.at_ms));
    serde_json::json!({
        "at_ms": a.at_ms,
        "at": at.to_string(),
        "replica": a.replica,
        "outcome": a.outcome.as_str(),
        "status": a.status,
        "latency_us": a.latency_us,
        "latency_ms": a.latency_us as f64 / 1000.0,
        // Replays gathered over one timeline flush: how many, and the last.
        "count": a.count(),
        "last_at_ms": a.last_at_ms(),
    })
}

/// The key `/readyz` reads: never written, so the answer is always "absent".
fn probe_key() -> Option<ScopedKey> {
    ClientKey::parse("healthz-probe")
        .ok()
        .map(|k| ScopedKey::new("idemgate", "health", k))
}

/// Liveness: the process answers HTTP. It never touches the store, so a
/// store outage does not get every replica restarted by its orchestrator
/// (a restart cannot fix the store; readiness takes the replica out of
/// the load balancer instead).
async fn healthz() -> (StatusCode, &'static str) {
    (StatusCode::OK, "ok\n")
}

/// Readiness: not draining, and the store answers a read within 2 s.
async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if !s.ready.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    let Some(key) = probe_key() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "probe key invalid\n");
    };
    match tokio::time::timeout(Duration::from_secs(2), s.store.get(&key)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness check: store failed");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store timed out\n"),
    }
}

async fn metrics_text(State(s): State<AdminState>) -> Response<Body> {
    let mut resp = Response::new(Body::from(s.telemetry.render()));
    if !s.telemetry.is_exporting() {
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return resp;
    }
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

#[cfg(test)]
mod tests;
