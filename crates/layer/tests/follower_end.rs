//! A duplicate following a live stream ends the way the owner's write
//! ended: a clean end (the stream is the key's answer) only when the
//! store applied it. When the owner is fenced at completion (another
//! owner, or an operator's forget, took the key) or its write fails for
//! good (the key is released), the follower's stream breaks, so its
//! client retries instead of keeping an answer the store does not hold.
//!
//! The fenced owner's own client is not handed its result as the key's
//! answer either: a JSON client gets 503 `lease-lost` (retryable), a
//! stream breaks.
//!
//! Real HTTP on 127.0.0.1:0; the store is the memory store behind
//! testkit's `BlinkingStore`, whose switches fence (or fail) the next
//! completion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use idemgate_engine::{Engine, MemoryStore, Policy};
use idemgate_layer::{IdempotencyLayer, LayerConfig, OnInflight};
use idemgate_testkit::{BlinkingStore, Switches};
use support::app::{App, AppState, exec_answer, keyed_post, read_events, read_until_broken, until};
use tokio::sync::mpsc;

/// What the next `complete` does.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// It writes.
    Pass,
    /// The key is forgotten just before the write: the write is fenced.
    Fence,
    /// The write fails with a permanent store error: the key is released.
    Fail,
}

/// Three events, a wait for the gate, then three more and `[DONE]`.
async fn sse(State(app): State<AppState>) -> Response {
    let n = app.count_run();
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let mut gate = app.gate.clone();
    tokio::spawn(async move {
        for i in 1..=6 {
            if i == 4 {
                let _ = gate.wait_for(|open| *open).await;
            }
            let ev = format!("data: {{\"exec\":{n},\"i\":{i}}}\n\n");
            if tx.send(Ok(Bytes::from(ev))).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

/// Waits for the gate, then answers JSON.
async fn json(State(app): State<AppState>) -> Response {
    let n = app.count_run();
    app.wait_for_gate().await;
    exec_answer(n)
}

struct Harness {
    base: String,
    faults: Arc<Switches>,
    /// The app behind the layer: its gate, counter and layer.
    app: App,
}

impl Harness {
    async fn start() -> Self {
        let store = Arc::new(BlinkingStore::new(Arc::new(MemoryStore::new())));
        let faults = store.switches();
        let engine =
            Engine::new(store).with_policy(Policy::default().pending_ttl(Duration::from_secs(5)));
        let config = LayerConfig {
            on_inflight: OnInflight::Attach(Duration::from_secs(20)),
            ..LayerConfig::new("test")
        };
        let layer = IdempotencyLayer::new(engine, config);
        let routes = Router::new()
            .route("/sse", post(sse))
            .route("/json", post(json));
        let app = App::with_routes(layer, routes);
        let base = app.serve().await;
        Self { base, faults, app }
    }

    async fn open(&self, key: &str) -> reqwest::Response {
        self.post("/sse", key).await
    }

    async fn post(&self, path: &str, key: &str) -> reqwest::Response {
        keyed_post(&self.base, path, key)
            .send()
            .await
            .expect("the gateway answers")
    }

    /// Makes the next completion do `what`.
    fn arm(&self, what: Next) {
        let switch = match what {
            Next::Pass => return,
            Next::Fence => &self.faults.fence_next_complete,
            Next::Fail => &self.faults.refuse_next_complete,
        };
        switch.store(true, Ordering::SeqCst);
    }

    /// The owner streams its first three events and a duplicate attaches;
    /// then the next completion does `what` and the owner finishes.
    /// Returns how the duplicate's stream ended (true: cleanly) and
    /// whether it was marked replayed.
    async fn follower_end(&self, key: &str, what: Next) -> (bool, Option<String>, bool) {
        let mut owner = self.open(key).await;
        read_events(&mut owner, 3).await;
        let mut attached = self.open(key).await;
        let replayed = attached
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned());
        read_events(&mut attached, 3).await;
        self.arm(what);
        self.app.gate.send_replace(true);
        let (_, broken) = read_until_broken(&mut attached).await;
        let (_, owner_broken) = read_until_broken(&mut owner).await;
        (!broken, replayed, !owner_broken)
    }
}

#[tokio::test]
async fn a_follower_of_a_stored_stream_ends_cleanly() {
    let h = Harness::start().await;
    let (clean, replayed, owner_clean) = h.follower_end("stored", Next::Pass).await;
    assert_eq!(replayed.as_deref(), Some("true"));
    assert!(clean, "the stream is the key's answer: a clean end");
    assert!(owner_clean);
    assert_eq!(h.app.executions(), 1);
}

/// On a fresh harness, runs [`Harness::follower_end`] for `key` with the
/// next completion doing `what`, and asserts that the follower's stream
/// broke (`why` it must); the harness, and whether the owner's ended
/// cleanly.
async fn follower_breaks(key: &str, what: Next, why: &str) -> (Harness, bool) {
    let h = Harness::start().await;
    let (clean, _, owner_clean) = h.follower_end(key, what).await;
    assert!(!clean, "{why}: the follower must not get a clean end");
    (h, owner_clean)
}

#[tokio::test]
async fn a_follower_of_a_fenced_owner_sees_its_stream_break() {
    let why = "the store does not hold this stream";
    let (_, owner_clean) = follower_breaks("fenced", Next::Fence, why).await;
    assert!(
        !owner_clean,
        "nor the owner's own client: the stream is not the key's answer"
    );
}

#[tokio::test]
async fn a_fenced_json_owner_answers_lease_lost_not_its_result() {
    let h = Harness::start().await;
    let owner = tokio::spawn({
        let req = keyed_post(&h.base, "/json", "fenced-json");
        async move { req.send().await.expect("the gateway answers") }
    });
    until("the owner's work runs", || h.app.executions() == 1).await;
    h.arm(Next::Fence);
    h.app.gate.send_replace(true);
    let res = owner.await.unwrap();
    assert_eq!(res.status(), 503);
    assert!(res.headers().contains_key("retry-after"));
    let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "https://idemgate.dev/problems/lease-lost");
}

#[tokio::test]
async fn a_follower_of_an_owner_whose_write_failed_sees_its_stream_break() {
    let (h, _) = follower_breaks("failed", Next::Fail, "the key was released").await;
    // Nothing was stored: the retry runs the work again.
    until("the failed owner is done", || h.app.layer.detached() == 0).await;
    h.app.gate.send_replace(true);
    let retry = h.open("failed").await;
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "false",
        "a retry runs again"
    );
    let _ = retry.bytes().await;
    assert_eq!(h.app.executions(), 2);
}
