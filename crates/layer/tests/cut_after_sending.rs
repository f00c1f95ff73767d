//! An owner cut short after its request was sent (the inner service fired
//! its `SendSignal`): on a route that keeps `outcome-unknown` answers
//! (`charges = true` in the gateway), the key keeps that answer whatever
//! cut the work, a shutdown past its grace or a panic; the retry is
//! answered it, and the work never runs twice. Before the signal, or on a
//! route that releases, the key is released and the retry runs.
//!
//! Real HTTP on 127.0.0.1:0, the memory store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use idemgate_engine::{ClientKey, Engine, MemoryStore, Policy, ScopedKey};
use idemgate_layer::key::tenant_id;
use idemgate_layer::{
    CompletionClock, IdempotencyLayer, LayerConfig, OnInflight, OutcomeUnknownMode, SendSignal,
    StoredResponse,
};
use support::app::{App, AppState, exec_answer, keyed_post, until};

/// Says "sent" unless told `x-unsent`, then panics when told `x-panic`,
/// or waits for the gate; answers JSON.
async fn work(State(app): State<AppState>, req: axum::extract::Request) -> Response {
    let n = app.count_run();
    let headers: HeaderMap = req.headers().clone();
    if !headers.contains_key("x-unsent")
        && let Some(signal) = req.extensions().get::<SendSignal>()
    {
        signal.sent();
    }
    assert!(!headers.contains_key("x-panic"), "told to panic");
    app.wait_for_gate().await;
    exec_answer(n)
}

struct Harness {
    base: String,
    /// The app behind the layer: its gate, counter and layer.
    app: App,
}

impl Harness {
    async fn start(mode: OutcomeUnknownMode) -> Self {
        let engine = Engine::new(Arc::new(MemoryStore::new()))
            .with_policy(Policy::default().pending_ttl(Duration::from_secs(5)));
        let config = LayerConfig {
            on_inflight: OnInflight::Reject,
            completion_clock: CompletionClock::Sent,
            on_outcome_unknown: mode,
            ..LayerConfig::new("test")
        };
        let layer = IdempotencyLayer::new(engine, config);
        let app = App::with_routes(layer, Router::new().route("/work", post(work)));
        let base = app.serve().await;
        Self { base, app }
    }

    fn post(&self, key: &str) -> reqwest::RequestBuilder {
        keyed_post(&self.base, "/work", key)
    }

    /// Starts a request that waits at the gate, then shuts the layer down
    /// with a short grace: the request is cut while its work runs.
    async fn shut_down_mid_work(&self, key: &str, sent: bool) -> usize {
        let mut req = self.post(key);
        if !sent {
            req = req.header("x-unsent", "1");
        }
        let first = tokio::spawn(async move { req.send().await.map(|r| r.status()) });
        until("the work started", || self.app.executions() == 1).await;
        let report = self.app.layer.shutdown(Duration::from_millis(50)).await;
        let _ = first.await;
        report.cancelled
    }
}

/// Status, `Idempotent-Replayed` and problem slug of an answer.
async fn read(res: reqwest::Response) -> (StatusCode, String, String) {
    let status = StatusCode::from_u16(res.status().as_u16()).unwrap();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body: serde_json::Value =
        serde_json::from_slice(&res.bytes().await.unwrap()).unwrap_or_default();
    let slug = body["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or_default()
        .to_owned();
    (status, replayed, slug)
}

/// What the store holds for `key` once the layer has shut down: the
/// stored answer's status, or `None` when the key was released.
async fn stored_status(h: &Harness, key: &str) -> Option<u16> {
    let scoped = ScopedKey::new(
        tenant_id(b"Bearer t"),
        "test",
        ClientKey::parse(key).unwrap(),
    );
    let record = h.app.layer.engine().store().get(&scoped).await.unwrap()?;
    let payload = record.payload().expect("DONE, not PENDING");
    Some(StoredResponse::decode(payload).unwrap().status.as_u16())
}

#[tokio::test]
async fn a_shutdown_after_sending_keeps_outcome_unknown() {
    let h = Harness::start(OutcomeUnknownMode::Store).await;
    assert_eq!(h.shut_down_mid_work("sent", true).await, 1);
    assert_eq!(
        stored_status(&h, "sent").await,
        Some(502),
        "kept as the key's outcome-unknown answer"
    );
}

#[tokio::test]
async fn a_shutdown_before_sending_releases_the_key() {
    let h = Harness::start(OutcomeUnknownMode::Store).await;
    assert_eq!(h.shut_down_mid_work("unsent", false).await, 1);
    assert_eq!(stored_status(&h, "unsent").await, None, "released");
}

#[tokio::test]
async fn a_shutdown_after_sending_releases_on_a_route_that_does_not_keep_unknowns() {
    let h = Harness::start(OutcomeUnknownMode::Release).await;
    assert_eq!(h.shut_down_mid_work("released", true).await, 1);
    assert_eq!(stored_status(&h, "released").await, None, "released");
}

async fn retry(h: &Harness, key: &str) -> (StatusCode, String, String) {
    read(h.post(key).send().await.unwrap()).await
}

/// Sends `key` to work that panics, before saying it sent its request
/// when `unsent`; the answer, as [`read`].
async fn panicking(h: &Harness, key: &str, unsent: bool) -> (StatusCode, String, String) {
    let mut req = h.post(key).header("x-panic", "1");
    if unsent {
        req = req.header("x-unsent", "1");
    }
    read(req.send().await.unwrap()).await
}

#[tokio::test]
async fn a_panic_after_sending_keeps_outcome_unknown() {
    let h = Harness::start(OutcomeUnknownMode::Store).await;
    // The outcome-unknown answer, `replayed` or not.
    let unknown = |replayed: &str| {
        let slug = "outcome-unknown".to_owned();
        (StatusCode::BAD_GATEWAY, replayed.to_owned(), slug)
    };
    assert_eq!(panicking(&h, "panicked", false).await, unknown("false"));
    h.app.gate.send_replace(true);
    assert_eq!(retry(&h, "panicked").await, unknown("true"));
    assert_eq!(h.app.executions(), 1, "never run twice");
}

#[tokio::test]
async fn a_panic_before_sending_releases_the_key() {
    let h = Harness::start(OutcomeUnknownMode::Store).await;
    let (status, _, slug) = panicking(&h, "early", true).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(slug, "internal");
    h.app.gate.send_replace(true);
    until("the failed work is done", || h.app.layer.detached() == 0).await;
    let mut ran_again = false;
    for _ in 0..100 {
        let (status, replayed, _) = retry(&h, "early").await;
        if status == StatusCode::OK && replayed == "false" {
            ran_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ran_again, "the released key runs again");
    assert_eq!(h.app.executions(), 2);
}
