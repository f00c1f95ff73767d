//! What a result held through a store outage may promise. While the
//! owner's completion write fails with a temporary error, the result is
//! held by the owner alone: the key is PENDING in the store, and a retry
//! is handled as for any key in flight (409 with `reject`, a wait with
//! `wait`), never answered from memory as replayed. Once the write lands,
//! the owner's client gets its answer and the waiting duplicate the stored
//! one. An outage that outlasts the lease does not discard the result:
//! the owner's client gets it marked `Idempotent-Stored: false` (a stream
//! breaks instead: its head went out long before), and the key is free.
//!
//! Real HTTP on 127.0.0.1:0; the store is the memory store behind
//! testkit's `BlinkingStore`, whose switches make `complete` (and
//! `renew`) fail as an unreachable store would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Counts executions; answers JSON naming the execution.
async fn json(State(executions): State<Arc<AtomicUsize>>) -> Response {
    let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
    (
        [("content-type", "application/json")],
        format!("{{\"exec\":{n}}}"),
    )
        .into_response()
}

/// A short stream naming the execution.
async fn sse(State(executions): State<Arc<AtomicUsize>>) -> Response {
    let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
    let events = (1..=3)
        .map(move |i| Ok::<_, std::io::Error>(Bytes::from(format!("data: {n}-{i}\n\n"))))
        .chain(std::iter::once(Ok(Bytes::from_static(b"data: [DONE]\n\n"))));
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(futures_util::stream::iter(events)),
    )
        .into_response()
}

struct Harness {
    base: String,
    switches: Arc<Switches>,
    executions: Arc<AtomicUsize>,
}

impl Harness {
    async fn start(on_inflight: OnInflight, pending_ttl: Duration) -> Self {
        let store = Arc::new(BlinkingStore::new(Arc::new(MemoryStore::new())));
        let switches = store.switches();
        let engine = Engine::new(store).with_policy(Policy::default().pending_ttl(pending_ttl));
        let config = LayerConfig {
            on_inflight,
            ..LayerConfig::new("test")
        };
        let layer = IdempotencyLayer::new(engine, config);
        let executions = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/json", post(json))
            .route("/sse", post(sse))
            .layer(layer)
            .with_state(Arc::clone(&executions));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base,
            switches,
            executions,
        }
    }

    fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .header("authorization", "Bearer t")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body("{}")
    }

    /// Sends the owner's JSON request with the store refusing completions,
    /// and returns once its write has failed at least twice (the result is
    /// held).
    async fn held_owner(&self, key: &str) -> tokio::task::JoinHandle<reqwest::Response> {
        self.switches.complete_down.store(true, Ordering::SeqCst);
        let owner = tokio::spawn({
            let req = self.post("/json", key);
            async move { req.send().await.expect("the layer answers") }
        });
        for _ in 0..500 {
            if self.switches.completes.load(Ordering::SeqCst) >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            self.switches.completes.load(Ordering::SeqCst) >= 2,
            "the owner never tried to store its result"
        );
        owner
    }
}

fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// `reject`: a retry while the result is held is refused 409 (the key is
/// in flight), not answered from memory; once the write lands the retry
/// replays the stored answer, which is the owner's.
#[tokio::test]
async fn a_retry_during_a_hold_is_refused_in_flight_then_replays() {
    let h = Harness::start(OnInflight::Reject, Duration::from_secs(5)).await;
    let owner = h.held_owner("reject").await;
    let during = h.post("/json", "reject").send().await.unwrap();
    assert_eq!(during.status(), 409, "the key is in flight while held");
    assert_ne!(
        header(&during, "idempotent-replayed").as_deref(),
        Some("true")
    );
    assert!(
        !owner.is_finished(),
        "the owner's client waits for the store"
    );

    h.switches.complete_down.store(false, Ordering::SeqCst);
    let owner = owner.await.unwrap();
    assert_ok_replayed(&owner, "false");
    assert_eq!(header(&owner, "idempotent-stored"), None);
    let owner_body = owner.bytes().await.unwrap();
    let retry = h.post("/json", "reject").send().await.unwrap();
    assert_ok_replayed(&retry, "true");
    assert_eq!(retry.bytes().await.unwrap(), owner_body);
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
}

/// Asserts a 200 answer whose `Idempotent-Replayed` is `replayed`.
#[track_caller]
fn assert_ok_replayed(res: &reqwest::Response, replayed: &str) {
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(res, "idempotent-replayed").as_deref(),
        Some(replayed)
    );
}

/// `wait`: a retry while the result is held waits for the key; it gets the
/// stored answer once the write lands, the owner's bytes.
#[tokio::test]
async fn a_retry_during_a_hold_waits_for_the_stored_answer() {
    let h = Harness::start(
        OnInflight::Wait(Duration::from_secs(20)),
        Duration::from_secs(5),
    )
    .await;
    let owner = h.held_owner("wait").await;
    let waiter = tokio::spawn({
        let req = h.post("/json", "wait");
        async move { req.send().await.expect("the layer answers") }
    });
    // The store keeps refusing: the waiter has nothing stored to get.
    let tries = h.switches.completes.load(Ordering::SeqCst);
    for _ in 0..500 {
        if h.switches.completes.load(Ordering::SeqCst) >= tries + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !waiter.is_finished(),
        "the waiting retry was answered while nothing was stored"
    );

    h.switches.complete_down.store(false, Ordering::SeqCst);
    let owner = owner.await.unwrap();
    assert_eq!(owner.status(), 200);
    let owner_body = owner.bytes().await.unwrap();
    let waiter = waiter.await.unwrap();
    assert_ok_replayed(&waiter, "true");
    assert_eq!(waiter.bytes().await.unwrap(), owner_body);
    assert_eq!(h.executions.load(Ordering::SeqCst), 1);
}

/// An outage longer than the lease (neither the write nor the heartbeat
/// gets through): the owner's client still gets its result, marked
/// `Idempotent-Stored: false`, and the key is free: the retry runs again.
#[tokio::test]
async fn a_result_the_lease_outlived_is_delivered_marked_not_stored() {
    let h = Harness::start(OnInflight::Reject, Duration::from_millis(600)).await;
    h.switches.renew_down.store(true, Ordering::SeqCst);
    let owner = h.held_owner("outlived").await;
    let owner = owner.await.unwrap();
    assert_eq!(owner.status(), 200);
    assert_eq!(
        header(&owner, "idempotent-stored").as_deref(),
        Some("false")
    );
    assert_eq!(
        header(&owner, "idempotent-replayed").as_deref(),
        Some("false")
    );
    assert_eq!(owner.bytes().await.unwrap(), "{\"exec\":1}");

    h.switches.complete_down.store(false, Ordering::SeqCst);
    h.switches.renew_down.store(false, Ordering::SeqCst);
    // The released key (given back as the owner gave up) runs again.
    let mut retry = h.post("/json", "outlived").send().await.unwrap();
    for _ in 0..100 {
        if retry.status() != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        retry = h.post("/json", "outlived").send().await.unwrap();
    }
    assert_ok_replayed(&retry, "false");
    assert_eq!(header(&retry, "idempotent-stored"), None);
    assert_eq!(retry.bytes().await.unwrap(), "{\"exec\":2}");
    assert_eq!(h.executions.load(Ordering::SeqCst), 2);
}

/// A stream whose write the lease outlived cannot be marked (its head went
/// out first): it breaks, so its client does not take it for the key's
/// answer.
#[tokio::test]
async fn a_stream_the_lease_outlived_breaks() {
    let h = Harness::start(OnInflight::Reject, Duration::from_millis(600)).await;
    h.switches.renew_down.store(true, Ordering::SeqCst);
    h.switches.complete_down.store(true, Ordering::SeqCst);
    let mut res = h.post("/sse", "stream").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let mut got = Vec::new();
    let broke = loop {
        match res.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(broke, "the stream was not stored: it must not end cleanly");
    assert!(String::from_utf8_lossy(&got).contains("data: [DONE]"));
}
