//! The admin listener: health, readiness and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use http::{Response, StatusCode};
use idemgate_engine::{ClientKey, ScopedKey, Store};
use idemgate_telemetry::Telemetry;

/// What the admin endpoints look at.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The gateway's (instrumented) store.
    pub(crate) store: Arc<dyn Store>,
    /// False once shutdown has begun.
    pub(crate) ready: Arc<AtomicBool>,
    /// The metrics pipeline.
    pub(crate) telemetry: &'static Telemetry,
}

/// The admin router.
pub(crate) fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

/// The key `/healthz` reads: never written, so the answer is always "absent".
fn probe_key() -> Option<ScopedKey> {
    ClientKey::parse("healthz-probe")
        .ok()
        .map(|k| ScopedKey::new("idemgate", "health", k))
}

async fn healthz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    let Some(key) = probe_key() else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "probe key invalid\n");
    };
    match tokio::time::timeout(Duration::from_secs(2), s.store.get(&key)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ok\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "health check: store failed");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store timed out\n"),
    }
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
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
