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
//! Real HTTP on 127.0.0.1:0; the store is the memory store behind a
//! switch that fences (or fails) the next completion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, BoxFuture, Engine, Fenced, Lease, MemoryStore, Policy, Store,
    StoreError, StoreErrorKind,
};
use idemgate_layer::{IdempotencyLayer, LayerConfig, OnInflight};
use support::app::{App, AppState, read_events};
use tokio::sync::{mpsc, watch};

/// What the next `complete` does.
const PASS: u8 = 0;
/// The key is forgotten just before the write: the write is fenced.
const FENCE: u8 = 1;
/// The write fails with a permanent store error: the key is released.
const FAIL: u8 = 2;

#[derive(Debug)]
struct Switched {
    inner: MemoryStore,
    next_complete: Arc<AtomicU8>,
}

impl idemgate_engine::LayeredStore for Switched {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            match self.next_complete.swap(PASS, Ordering::SeqCst) {
                FENCE => {
                    let forgot = Attempt {
                        outcome: AttemptOutcome::Forgotten,
                        ..attempt.clone()
                    };
                    self.inner
                        .forget(&lease.key, &forgot, Duration::from_secs(60))
                        .await?;
                }
                FAIL => {
                    return Err(StoreError::new(
                        StoreErrorKind::Rejected,
                        "switched",
                        "write refused",
                    ));
                }
                _ => {}
            }
            self.inner.complete(lease, payload, done_ttl, attempt).await
        })
    }
}

/// Three events, a wait for the gate, then three more and `[DONE]`.
async fn sse(State(app): State<AppState>) -> Response {
    let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
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
    let n = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let mut gate = app.gate.clone();
    let _ = gate.wait_for(|open| *open).await;
    (
        [("content-type", "application/json")],
        format!("{{\"exec\":{n}}}"),
    )
        .into_response()
}

struct Harness {
    base: String,
    next_complete: Arc<AtomicU8>,
    gate: watch::Sender<bool>,
    executions: Arc<AtomicUsize>,
    layer: IdempotencyLayer,
}

impl Harness {
    async fn start() -> Self {
        let next_complete = Arc::new(AtomicU8::new(PASS));
        let store = Arc::new(Switched {
            inner: MemoryStore::new(),
            next_complete: Arc::clone(&next_complete),
        });
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
        Self {
            base,
            next_complete,
            gate: app.gate,
            executions: app.executions,
            layer: app.layer,
        }
    }

    async fn open(&self, key: &str) -> reqwest::Response {
        self.post("/sse", key).await
    }

    async fn post(&self, path: &str, key: &str) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .header("authorization", "Bearer t")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .expect("the gateway answers")
    }

    /// The owner streams its first three events and a duplicate attaches;
    /// then the next completion does `what` and the owner finishes.
    /// Returns how the duplicate's stream ended (true: cleanly) and
    /// whether it was marked replayed.
    async fn follower_end(&self, key: &str, what: u8) -> (bool, Option<String>, bool) {
        let mut owner = self.open(key).await;
        read_events(&mut owner, 3).await;
        let mut attached = self.open(key).await;
        let replayed = attached
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned());
        read_events(&mut attached, 3).await;
        self.next_complete.store(what, Ordering::SeqCst);
        self.gate.send_replace(true);
        let clean = loop {
            match attached.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        let owner_clean = loop {
            match owner.chunk().await {
                Ok(Some(_)) => {}
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        (clean, replayed, owner_clean)
    }
}

#[tokio::test]
async fn a_follower_of_a_stored_stream_ends_cleanly() {
    let h = Harness::start().await;
    let (clean, replayed, owner_clean) = h.follower_end("stored", PASS).await;
    assert_eq!(replayed.as_deref(), Some("true"));
    assert!(clean, "the stream is the key's answer: a clean end");
    assert!(owner_clean);
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_follower_of_a_fenced_owner_sees_its_stream_break() {
    let h = Harness::start().await;
    let (clean, _, owner_clean) = h.follower_end("fenced", FENCE).await;
    assert!(
        !clean,
        "the store does not hold this stream: the follower must not get a clean end"
    );
    assert!(
        !owner_clean,
        "nor the owner's own client: the stream is not the key's answer"
    );
}

#[tokio::test]
async fn a_fenced_json_owner_answers_lease_lost_not_its_result() {
    let h = Harness::start().await;
    let owner = tokio::spawn({
        let req = reqwest::Client::new()
            .post(format!("{}/json", h.base))
            .header("authorization", "Bearer t")
            .header("idempotency-key", "fenced-json")
            .header("content-type", "application/json")
            .body("{}");
        async move { req.send().await.expect("the gateway answers") }
    });
    for _ in 0..400 {
        if h.executions.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.next_complete.store(FENCE, Ordering::SeqCst);
    h.gate.send_replace(true);
    let res = owner.await.unwrap();
    assert_eq!(res.status(), 503);
    assert!(res.headers().contains_key("retry-after"));
    let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "https://idemgate.dev/problems/lease-lost");
}

#[tokio::test]
async fn a_follower_of_an_owner_whose_write_failed_sees_its_stream_break() {
    let h = Harness::start().await;
    let (clean, _, _) = h.follower_end("failed", FAIL).await;
    assert!(
        !clean,
        "the key was released: the follower must not get a clean end"
    );
    // Nothing was stored: the retry runs the work again.
    for _ in 0..400 {
        if h.layer.detached() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.gate.send_replace(true);
    let retry = h.open("failed").await;
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "false",
        "a retry runs again"
    );
    let _ = retry.bytes().await;
    assert_eq!(h.executions.load(Ordering::SeqCst), 2);
}
