//! The layer over real HTTP: an axum app on 127.0.0.1:0 with handlers that
//! count their executions, and a reqwest client. One test per outcome a
//! keyed request can have (first run, replay, in flight, mismatch, failure),
//! plus the races (many concurrent duplicates) and the client-goes-away
//! cases.
#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use idemgate_engine::{ClientKey, Engine, MemoryStore, Policy, ScopedKey, Store};
use idemgate_layer::key::tenant_id;
use idemgate_layer::{
    DeriveTemplate, IdempotencyContext, IdempotencyLayer, KeyMode, LayerConfig, OnInflight,
    OutcomeUnknownMode, StoreErrorMode,
};
use reqwest::header::HeaderValue;
use tokio::sync::{mpsc, watch};

mod support;
use support::DownStore;

// ---------------------------------------------------------------- the app

#[derive(Clone)]
struct AppState {
    executions: Arc<AtomicUsize>,
    /// Handlers sent `x-gate: 1` wait here until the test opens it.
    gate: watch::Receiver<bool>,
}

/// `POST /json`: counts, optionally waits for the gate or sleeps, fails
/// with `x-fail: <status>`; answers JSON naming the execution.
async fn json_handler(State(s): State<AppState>, req: axum::extract::Request) -> Response {
    let n = s.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let headers = req.headers().clone();
    let ctx_key = req
        .extensions()
        .get::<IdempotencyContext>()
        .map(|c| c.key.as_str().to_owned());
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    wait_as_told(&s, &headers).await;
    assert!(!headers.contains_key("x-panic"), "handler told to panic");
    if let Some(status) = headers
        .get("x-fail")
        .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
    {
        return (
            StatusCode::from_u16(status).unwrap(),
            format!("failure {n}"),
        )
            .into_response();
    }
    if headers.contains_key("x-accepted") {
        // A job accepted for later: where it is must survive a replay.
        let at = format!("/jobs/{n}");
        return (
            StatusCode::ACCEPTED,
            [
                ("content-type", "application/json".to_owned()),
                ("location", at.clone()),
                ("operation-location", format!("{at}/status")),
            ],
            "{\"status\":\"accepted\"}",
        )
            .into_response();
    }
    let v = serde_json::json!({
        "execution": n,
        "echo": String::from_utf8_lossy(&body),
        "key_seen": ctx_key,
        "usage": {"prompt_tokens": 11, "completion_tokens": 22},
        "padding": "p".repeat(headers.get("x-pad").map_or(0, |_| 4096)),
    });
    (
        StatusCode::CREATED,
        [
            ("content-type", "application/json"),
            ("x-request-id", "rid"),
        ],
        v.to_string(),
    )
        .into_response()
}

/// `POST /sse`: an event stream of `x-events` events (default 6). With
/// `x-gate: 1` it pauses after `x-gate-after` events (default 3) until the
/// gate opens; with `x-break-after: k` the stream errors after k events.
/// With `x-error-event` it ends with an OpenAI-style error event instead of
/// usage and `[DONE]`; with `x-endless-event` it then sends one event of
/// 64 KiB that never ends.
async fn sse_handler(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let n = s.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let num = |name: &str, default: usize| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(default)
    };
    let events = num("x-events", 6);
    let gate_after = num("x-gate-after", 3);
    let break_after = headers
        .get("x-break-after")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let gated = headers.contains_key("x-gate");
    let error_event = headers.contains_key("x-error-event");
    let endless_event = headers.contains_key("x-endless-event");
    // Time to the first byte: duplicates arriving now find the owner
    // before its response head exists.
    if let Some(ms) = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let mut gate = s.gate.clone();
    tokio::spawn(async move {
        for i in 1..=events {
            if gated && i == gate_after + 1 {
                let _ = gate.wait_for(|open| *open).await;
            }
            if break_after == Some(i - 1) {
                let _ = tx.send(Err(std::io::Error::other("upstream reset"))).await;
                return;
            }
            // Upstream ids are replaced by the layer's own.
            let ev = format!("id: up-{i}\nevent: delta\ndata: {{\"exec\":{n},\"i\":{i}}}\n\n");
            if tx.send(Ok(Bytes::from(ev))).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
        if endless_event {
            let _ = tx.send(Ok(Bytes::from_static(b"data: "))).await;
            for _ in 0..64 {
                if tx.send(Ok(Bytes::from(vec![b'x'; 1024]))).await.is_err() {
                    return;
                }
            }
            return;
        }
        let end = if error_event {
            "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n"
        } else {
            "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n"
        };
        let _ = tx.send(Ok(Bytes::from(end))).await;
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            // For the owner's client only: never stored, never attached.
            ("set-cookie", "session=owner-only"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn wait_as_told(s: &AppState, headers: &HeaderMap) {
    if headers.contains_key("x-gate") {
        let mut gate = s.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
    }
    if let Some(ms) = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

async fn unprotected(State(s): State<AppState>) -> &'static str {
    s.executions.fetch_add(1, Ordering::SeqCst);
    "plain"
}

/// The test service behind the layer, without a socket: tests on tokio's
/// paused clock drive it with `oneshot`.
struct App {
    router: Router,
    executions: Arc<AtomicUsize>,
    gate: watch::Sender<bool>,
    layer: IdempotencyLayer,
}

impl App {
    fn new(store: Arc<dyn Store>, config: LayerConfig) -> Self {
        let engine =
            Engine::new(store).with_policy(Policy::default().pending_ttl(Duration::from_secs(5)));
        let layer = IdempotencyLayer::new(engine, config);
        let executions = Arc::new(AtomicUsize::new(0));
        let (gate, gate_rx) = watch::channel(false);
        let state = AppState {
            executions: Arc::clone(&executions),
            gate: gate_rx,
        };
        let router = Router::new()
            .route("/json", post(json_handler))
            .route("/sse", post(sse_handler))
            .route("/plain", get(unprotected))
            .layer(layer.clone())
            .with_state(state);
        Self {
            router,
            executions,
            gate,
            layer,
        }
    }
}

struct Harness {
    base: String,
    client: reqwest::Client,
    executions: Arc<AtomicUsize>,
    gate: watch::Sender<bool>,
    layer: IdempotencyLayer,
}

impl Harness {
    async fn start(config: LayerConfig) -> Self {
        Self::start_with(Arc::new(MemoryStore::new()), config).await
    }

    async fn start_with(store: Arc<dyn Store>, config: LayerConfig) -> Self {
        let App {
            router: app,
            executions,
            gate,
            layer,
        } = App::new(store, config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            executions,
            gate,
            layer,
        }
    }

    fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        self.post_as("Bearer tenant-a", path, key, body)
    }

    fn post_as(
        &self,
        authorization: &str,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> reqwest::RequestBuilder {
        let mut b = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("authorization", authorization)
            .body(body.to_owned());
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b
    }

    fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    async fn until(&self, what: &str, cond: impl Fn(&Self) -> bool) {
        for _ in 0..2000 {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("timed out waiting for: {what}");
    }
}

fn config(mode: OnInflight) -> LayerConfig {
    LayerConfig {
        on_inflight: mode,
        ..LayerConfig::new("test")
    }
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn replayed(&self) -> Option<&str> {
        self.headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "status {}",
            self.status
        );
        self.json()["type"].as_str().unwrap().to_owned()
    }
}

async fn send(b: reqwest::RequestBuilder) -> Answer {
    let res = b.send().await.unwrap();
    let status = StatusCode::from_u16(res.status().as_u16()).unwrap();
    let headers = res.headers().clone();
    let body = res.bytes().await.unwrap();
    Answer {
        status,
        headers,
        body,
    }
}

fn problem(slug: &str) -> String {
    format!("https://idemgate.dev/problems/{slug}")
}

/// Reads a streaming response until it holds `n` complete events.
async fn read_events(res: &mut reqwest::Response, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while count_events(&got) < n {
        let chunk = res.chunk().await.unwrap().expect("stream ended early");
        got.extend_from_slice(&chunk);
    }
    got
}

fn count_events(b: &[u8]) -> usize {
    b.windows(2).filter(|w| w == b"\n\n").count()
}

/// The numbers of the events in `b` (ids are `RUN-N`).
fn event_ids(b: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| l.strip_prefix("id: ")?.split_once('-')?.1.parse().ok())
        .collect()
}

/// The run the events in `b` belong to (all of them, or the test fails).
fn run_of(b: &[u8]) -> String {
    let runs: Vec<String> = String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| Some(l.strip_prefix("id: ")?.split_once('-')?.0.to_owned()))
        .collect();
    let first = runs.first().cloned().expect("events with ids");
    assert!(runs.iter().all(|r| *r == first), "one run: {runs:?}");
    first
}

/// The id of the last event in `b`, as a client resumes with it.
fn last_id(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("id: ").map(str::to_owned))
        .expect("an event with an id")
}

// ------------------------------------------------ one outcome per test

#[tokio::test]
async fn first_request_runs_and_a_retry_replays_byte_for_byte() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = send(h.post("/json", Some("k-1"), r#"{"a":1}"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(
        first.json()["key_seen"],
        "k-1",
        "the key reaches the inner service"
    );

    // Same key (quoted sf-string form), same JSON with other whitespace.
    let retry = send(h.post("/json", Some("\"k-1\""), r#"{ "a" : 1 }"#)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers["content-type"], "application/json");
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_replayed_202_keeps_where_the_job_is() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = send(h.post("/json", Some("job"), "{}").header("x-accepted", "1")).await;
    let replay = send(h.post("/json", Some("job"), "{}").header("x-accepted", "1")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(
        (first.replayed(), replay.replayed()),
        (Some("false"), Some("true"))
    );
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert_eq!(replay.headers["location"], "/jobs/1");
    assert_eq!(replay.headers["operation-location"], "/jobs/1/status");
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn same_key_with_another_body_is_refused_with_422() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    send(h.post("/json", Some("k"), r#"{"a":1}"#)).await;
    let other = send(h.post("/json", Some("k"), r#"{"a":2}"#)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem_type(), problem("key-mismatch"));
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_duplicate_in_flight_is_rejected_with_409_and_retry_headers() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until("the first request runs", |h| h.executions() == 1)
        .await;
    let dup = send(h.post("/json", Some("k"), "{}")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), problem("in-flight"));
    assert!(dup.headers.contains_key("retry-after"));
    assert_eq!(dup.headers["x-should-retry"], "true");
    // A mismatching duplicate in flight is a mismatch, not a conflict.
    let other = send(h.post("/json", Some("k"), r#"{"b":1}"#)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    h.open_gate();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_waiting_duplicate_gets_the_result() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_secs(20)))).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until("the first request runs", |h| h.executions() == 1)
        .await;
    let dup = tokio::spawn(send(h.post("/json", Some("k"), "{}")));
    h.open_gate();
    let (first, dup) = (first.await.unwrap(), dup.await.unwrap());
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(dup.status, StatusCode::CREATED);
    assert_eq!(dup.replayed(), Some("true"));
    assert_eq!(dup.body, first.body);
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn an_attached_duplicate_joins_the_live_stream() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let mut owner = h
        .post("/sse", Some("s"), "{}")
        .header("x-gate", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(owner.headers()["idempotent-replayed"], "false");
    let mut owner_bytes = read_events(&mut owner, 3).await;
    assert_eq!(h.layer.live_streams(), 1);

    // One attacher from the start, one resuming after event 2.
    let mut full = h.post("/sse", Some("s"), "{}").send().await.unwrap();
    let resumed = h
        .post("/sse", Some("s"), "{}")
        .header("last-event-id", format!("{}-2", run_of(&owner_bytes)))
        .send()
        .await
        .unwrap();
    assert!(
        resumed
            .headers()
            .get("idempotent-stream-restarted")
            .is_none()
    );
    assert_eq!(full.headers()["idempotent-replayed"], "true");
    assert_eq!(full.headers()["content-type"], "text/event-stream");
    let mut full_bytes = read_events(&mut full, 3).await;
    h.open_gate();
    while let Some(c) = owner.chunk().await.unwrap() {
        owner_bytes.extend_from_slice(&c);
    }
    while let Some(c) = full.chunk().await.unwrap() {
        full_bytes.extend_from_slice(&c);
    }
    let resumed_bytes = resumed.bytes().await.unwrap();
    assert_eq!(full_bytes, owner_bytes);
    assert_eq!(event_ids(&owner_bytes), (1..=8).collect::<Vec<_>>());
    assert_eq!(event_ids(&resumed_bytes), (3..=8).collect::<Vec<_>>());
    assert!(owner_bytes.ends_with(&resumed_bytes));
    assert!(!String::from_utf8_lossy(&owner_bytes).contains("up-"));
    assert_eq!(h.executions(), 1);

    // Once DONE, the same key replays the whole transcript.
    let replay = send(h.post("/sse", Some("s"), "{}")).await;
    assert_eq!(replay.body, owner_bytes);
    assert_eq!(h.layer.live_streams(), 0);

    // A follower gets the head a replay gets: the stored headers only.
    assert_eq!(owner.headers()["set-cookie"], "session=owner-only");
    let head = |h: &reqwest::header::HeaderMap| {
        let mut names: Vec<String> = h
            .keys()
            .map(|n| n.as_str().to_owned())
            .filter(|n| !matches!(n.as_str(), "date" | "transfer-encoding" | "content-length"))
            .collect();
        names.sort();
        names
    };
    assert!(full.headers().get("set-cookie").is_none());
    assert_eq!(head(full.headers()), head(&replay.headers));
}

#[tokio::test]
async fn attaching_on_another_replica_waits_for_done_and_replays() {
    // Two replicas (two layers, two servers) sharing one store: the second
    // has no live entry for the stream, so it waits for DONE.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mode = config(OnInflight::Attach(Duration::from_secs(20)));
    let a = Harness::start_with(Arc::clone(&store), mode.clone()).await;
    let b = Harness::start_with(store, mode).await;
    let mut owner = a
        .post("/sse", Some("x"), "{}")
        .header("x-gate", "1")
        .send()
        .await
        .unwrap();
    let mut owner_bytes = read_events(&mut owner, 3).await;
    let other = tokio::spawn(send(b.post("/sse", Some("x"), "{}")));
    a.open_gate();
    while let Some(c) = owner.chunk().await.unwrap() {
        owner_bytes.extend_from_slice(&c);
    }
    let other = other.await.unwrap();
    assert_eq!(other.replayed(), Some("true"));
    assert_eq!(other.body, owner_bytes);
    assert_eq!((a.executions(), b.executions()), (1, 0));
}

#[tokio::test]
async fn a_wait_that_runs_out_answers_409() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_millis(50)))).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until("the first request runs", |h| h.executions() == 1)
        .await;
    let dup = send(h.post("/json", Some("k"), "{}")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), problem("in-flight"));
    h.open_gate();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- races

async fn duplicates(h: &Harness, path: &'static str, key: String, n: usize) -> Vec<Answer> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let req = h.post(path, Some(&key), "{}").header("x-sleep-ms", "30");
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                send(req).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_reject_execute_once() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    for round in 0..5 {
        let answers = duplicates(&h, "/json", format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), round + 1);
        let ok: Vec<_> = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .collect();
        assert!(!ok.is_empty());
        assert!(ok.iter().all(|a| a.body == ok[0].body));
        assert_eq!(
            ok.iter().filter(|a| a.replayed() == Some("false")).count(),
            1
        );
        for a in &answers {
            assert!(
                a.status == StatusCode::CREATED || a.status == StatusCode::CONFLICT,
                "{}",
                a.status
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_wait_execute_once_and_all_get_the_result() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_secs(30)))).await;
    for round in 0..5 {
        let answers = duplicates(&h, "/json", format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), round + 1);
        for a in &answers {
            assert_eq!(a.status, StatusCode::CREATED);
            assert_eq!(a.body, answers[0].body);
        }
        assert_eq!(
            answers
                .iter()
                .filter(|a| a.replayed() == Some("false"))
                .count(),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_attach_execute_once_and_all_get_the_stream() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(30)))).await;
    for round in 0..5 {
        let answers = duplicates(&h, "/sse", format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), 2 * round + 1);
        for a in &answers {
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(a.body, answers[0].body);
        }
        assert_eq!(event_ids(&answers[0].body), (1..=8).collect::<Vec<_>>());
        let json = duplicates(&h, "/json", format!("json-race-{round}"), 32).await;
        assert_eq!(h.executions(), 2 * round + 2);
        assert!(
            json.iter()
                .all(|a| a.status == StatusCode::CREATED && a.body == json[0].body)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_across_two_replicas_execute_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mode = config(OnInflight::Attach(Duration::from_secs(30)));
    let a = Harness::start_with(Arc::clone(&store), mode.clone()).await;
    let b = Harness::start_with(store, mode).await;
    for round in 0..5 {
        let key = format!("multi-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let h = if i % 2 == 0 { &a } else { &b };
                let req = h.post("/sse", Some(&key), "{}").header("x-sleep-ms", "30");
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    send(req).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert_eq!(a.executions() + b.executions(), round + 1);
        for ans in &answers {
            assert_eq!(ans.status, StatusCode::OK);
            assert_eq!(ans.body, answers[0].body);
        }
    }
}

// ---------------------------------------------------------------- the client goes away

#[tokio::test]
async fn a_client_that_times_out_does_not_cancel_the_work() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let gone = h
        .post("/json", Some("slow"), "{}")
        .header("x-gate", "1")
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up");
    h.until("the work started", |h| h.executions() == 1).await;
    h.open_gate();
    h.until("the detached work finished", |h| h.layer.detached() == 0)
        .await;
    let retry = send(h.post("/json", Some("slow"), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.json()["execution"], 1);
    let again = send(h.post("/json", Some("slow"), "{}")).await;
    assert_eq!(again.body, retry.body);
    assert_eq!(h.executions(), 1);
}

/// The request's future is dropped while its work runs (a server that
/// cuts the connection, a timeout in front of the layer): the work moves
/// to a task of its own, finishes and is stored, and the retry replays.
#[tokio::test]
async fn a_dropped_request_does_not_cancel_the_work() {
    use tower::ServiceExt;
    let app = App::new(Arc::new(MemoryStore::new()), config(OnInflight::Reject));
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        app.router.clone().oneshot(gated_request(true)),
    )
    .await;
    assert!(dropped.is_err(), "the request was still running");
    assert_eq!(app.executions.load(Ordering::SeqCst), 1);
    assert_eq!(app.layer.detached(), 1, "the work went on as a task");
    app.gate.send_replace(true);
    let mut replayed = None;
    for _ in 0..2000 {
        let retry = app
            .router
            .clone()
            .oneshot(gated_request(false))
            .await
            .expect("infallible");
        // 409 while the work still runs.
        if retry.status() == StatusCode::CREATED {
            replayed = Some(retry);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retry = replayed.expect("the dropped request's work never finished");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_retry_while_the_abandoned_work_runs_waits_for_it() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let gone = h
        .post("/json", Some("slow"), "{}")
        .header("x-gate", "1")
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(gone.is_err());
    let retry = tokio::spawn(send(h.post("/json", Some("slow"), "{}")));
    h.until("the work started", |h| h.executions() == 1).await;
    h.open_gate();
    let retry = retry.await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_stream_client_that_drops_resumes_with_last_event_id() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let mut owner = h.post("/sse", Some("resume"), "{}").send().await.unwrap();
    let first_part = read_events(&mut owner, 3).await;
    drop(owner);
    h.until("the detached stream finished", |h| h.layer.detached() == 0)
        .await;
    let ids = event_ids(&first_part);
    let k = *ids.last().unwrap();
    let rest = send(
        h.post("/sse", Some("resume"), "{}")
            .header("last-event-id", last_id(&first_part)),
    )
    .await;
    assert!(!rest.headers.contains_key("idempotent-stream-restarted"));
    assert_eq!(rest.replayed(), Some("true"));
    assert_eq!(
        event_ids(&rest.body),
        ((k + 1)..=8).collect::<Vec<_>>(),
        "only the events after {k}"
    );
    let full = send(h.post("/sse", Some("resume"), "{}")).await;
    let mut stitched = first_part.clone();
    stitched.extend_from_slice(&rest.body);
    assert_eq!(full.body, stitched, "the replay is the original transcript");
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- failures release the key

#[tokio::test]
async fn a_retryable_status_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let failed = send(h.post("/json", Some("f"), "{}").header("x-fail", "500")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.body, "failure 1");
    let retry = send(h.post("/json", Some("f"), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
    // A 4xx that is not retryable is final: stored and replayed.
    send(h.post("/json", Some("g"), "{}").header("x-fail", "404")).await;
    let replay = send(h.post("/json", Some("g"), "{}")).await;
    assert_eq!(replay.status, StatusCode::NOT_FOUND);
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(h.executions(), 3);
}

#[tokio::test]
async fn a_stream_broken_midway_is_not_stored() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let mut res = h
        .post("/sse", Some("b"), "{}")
        .header("x-break-after", "2")
        .send()
        .await
        .unwrap();
    let mut got = Vec::new();
    let err = loop {
        match res.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => panic!("a broken stream must not end cleanly"),
            Err(e) => break e,
        }
    };
    drop(err);
    assert_eq!(event_ids(&got), vec![1, 2]);
    h.until("the key is released", |h| h.layer.detached() == 0)
        .await;
    // The client resumes after event 2 of the run that broke: a new run
    // starts, and it gets that run whole, told it restarted, never the
    // new run's events 3… after the old run's 1 and 2.
    let retry = send(
        h.post("/sse", Some("b"), "{}")
            .header("last-event-id", last_id(&got)),
    )
    .await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(retry.headers["idempotent-stream-restarted"], "true");
    assert_eq!(event_ids(&retry.body), (1..=8).collect::<Vec<_>>());
    assert_ne!(
        run_of(&retry.body),
        run_of(&got),
        "event ids name their run"
    );
    assert_eq!(h.executions(), 2);
    // The same resumption once the new run is stored: whole, restarted.
    let late = send(
        h.post("/sse", Some("b"), "{}")
            .header("last-event-id", last_id(&got)),
    )
    .await;
    assert_eq!(late.replayed(), Some("true"));
    assert_eq!(late.headers["idempotent-stream-restarted"], "true");
    assert_eq!(late.body, retry.body);
    // Resuming the stored run itself gives its events after that one.
    let within = send(
        h.post("/sse", Some("b"), "{}")
            .header("last-event-id", format!("{}-3", run_of(&retry.body))),
    )
    .await;
    assert!(!within.headers.contains_key("idempotent-stream-restarted"));
    assert_eq!(event_ids(&within.body), (4..=8).collect::<Vec<_>>());
    assert_eq!(h.executions(), 2);
}

#[tokio::test]
async fn an_attached_client_sees_the_owner_stream_break() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let mut owner = h
        .post("/sse", Some("b"), "{}")
        .header("x-gate", "1")
        .header("x-break-after", "4")
        .send()
        .await
        .unwrap();
    read_events(&mut owner, 3).await;
    let mut attached = h.post("/sse", Some("b"), "{}").send().await.unwrap();
    read_events(&mut attached, 3).await;
    h.open_gate();
    let broke = loop {
        match attached.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(broke, "the attached stream ends with an error");
    h.until("the key is released", |h| h.layer.detached() == 0)
        .await;
    let retry = send(h.post("/sse", Some("b"), "{}")).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}

/// A 200 stream that ends in an error event is relayed whole to the owner
/// and to an attached duplicate, then released: the retry runs again and
/// its good stream is the one stored.
#[tokio::test]
async fn an_error_event_reaches_owner_and_attached_then_the_key_is_released() {
    let h = Harness::start(LayerConfig {
        stream_dialect: Some(idemgate_layer::StreamDialect::Openai),
        ..config(OnInflight::Attach(Duration::from_secs(20)))
    })
    .await;
    let mut owner = h
        .post("/sse", Some("e"), "{}")
        .header("x-gate", "1")
        .header("x-error-event", "1")
        .send()
        .await
        .unwrap();
    read_events(&mut owner, 3).await;
    let mut attached = h.post("/sse", Some("e"), "{}").send().await.unwrap();
    read_events(&mut attached, 3).await;
    h.open_gate();
    for (who, res) in [("owner", &mut owner), ("attached", &mut attached)] {
        let mut rest = Vec::new();
        let broke = loop {
            match res.chunk().await {
                Ok(Some(c)) => rest.extend_from_slice(&c),
                Ok(None) => break false,
                Err(_) => break true,
            }
        };
        assert!(broke, "{who}: the stream ends with an error");
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            rest.contains("\"error\""),
            "{who}: the error event was relayed: {rest}"
        );
    }
    h.until("the key is released", |h| h.layer.detached() == 0)
        .await;
    let retry = send(h.post("/sse", Some("e"), "{}")).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
    let replay = send(h.post("/sse", Some("e"), "{}")).await;
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(h.executions(), 2);
}

/// An event that never ends is not buffered past the stored-body limit:
/// the events before it are relayed, the stream breaks, the key is
/// released.
#[tokio::test]
async fn an_event_that_never_ends_breaks_the_stream_at_the_limit() {
    let h = Harness::start(LayerConfig {
        max_stored_body: 16 * 1024,
        ..config(OnInflight::Reject)
    })
    .await;
    let mut res = h
        .post("/sse", Some("x"), "{}")
        .header("x-endless-event", "1")
        .send()
        .await
        .unwrap();
    let mut got = Vec::new();
    let broke = loop {
        match res.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(broke, "the stream ends with an error");
    assert_eq!(event_ids(&got), (1..=6).collect::<Vec<_>>());
    h.until("the key is released", |h| h.layer.detached() == 0)
        .await;
    let retry = send(h.post("/sse", Some("x"), "{}")).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("p"), "{}").header("x-panic", "1")).await;
    assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(a.problem_type(), problem("internal"));
    h.until("the key is released", |h| h.layer.detached() == 0)
        .await;
    let key = ScopedKey::new(
        tenant_id(b"Bearer tenant-a"),
        "test",
        ClientKey::parse("p").unwrap(),
    );
    for _ in 0..2000 {
        if h.layer.engine().store().get(&key).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retry = send(h.post("/json", Some("p"), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(h.executions(), 2);
}

/// A keyed JSON request of tenant A with key `t`, held at the handler's
/// gate when `gated`.
fn gated_request(gated: bool) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::post("/json")
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", "t");
    if gated {
        b = b.header("x-gate", "1");
    }
    b.body(Body::from("{}")).expect("a valid request")
}

/// On tokio's paused clock: the 30 s completion timeout elapses at once,
/// exactly, while the handler still waits on its gate.
#[tokio::test(start_paused = true)]
async fn work_past_the_completion_timeout_is_abandoned_and_released() {
    use tower::ServiceExt;
    let app = App::new(
        Arc::new(MemoryStore::new()),
        LayerConfig {
            completion_timeout: Duration::from_secs(30),
            ..config(OnInflight::Reject)
        },
    );
    let request = gated_request;
    let a = app
        .router
        .clone()
        .oneshot(request(true))
        .await
        .expect("infallible");
    assert_eq!(a.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = axum::body::to_bytes(a.into_body(), usize::MAX)
        .await
        .expect("read the problem");
    let problem_json: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    assert_eq!(problem_json["type"], problem("upstream-timeout"));
    app.gate.send_replace(true);
    // The abandoned attempt released the key: the retry runs again.
    let retry = app
        .router
        .clone()
        .oneshot(request(false))
        .await
        .expect("infallible");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "false");
    assert_eq!(app.executions.load(Ordering::SeqCst), 2);
}

/// The same timeout on a charging configuration: the handler was called,
/// so the work may have run. The key keeps an outcome-unknown answer and
/// the retry gets it; nothing runs twice.
#[tokio::test(start_paused = true)]
async fn a_charging_completion_timeout_keeps_outcome_unknown() {
    use tower::ServiceExt;
    let app = App::new(
        Arc::new(MemoryStore::new()),
        LayerConfig {
            completion_timeout: Duration::from_secs(30),
            on_outcome_unknown: OutcomeUnknownMode::Store,
            ..config(OnInflight::Reject)
        },
    );
    let request = gated_request;
    let problem_type = |body: &[u8]| {
        let v: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
        v["type"].clone()
    };
    let a = app
        .router
        .clone()
        .oneshot(request(true))
        .await
        .expect("infallible");
    assert_eq!(a.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = axum::body::to_bytes(a.into_body(), usize::MAX)
        .await
        .expect("read the problem");
    assert_eq!(problem_type(&body), problem("outcome-unknown"));
    app.gate.send_replace(true);
    let retry = app
        .router
        .clone()
        .oneshot(request(false))
        .await
        .expect("infallible");
    assert_eq!(retry.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = axum::body::to_bytes(retry.into_body(), usize::MAX)
        .await
        .expect("read the problem");
    assert_eq!(problem_type(&body), problem("outcome-unknown"));
    assert_eq!(app.executions.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_too_large_to_store_is_delivered_but_not_stored() {
    let h = Harness::start(LayerConfig {
        max_stored_body: 1024,
        ..config(OnInflight::Reject)
    })
    .await;
    let a = send(h.post("/json", Some("big"), "{}").header("x-pad", "1")).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.replayed(), Some("false"));
    assert_eq!(a.json()["padding"].as_str().unwrap().len(), 4096);
    let retry = send(h.post("/json", Some("big"), "{}").header("x-pad", "1")).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}

// ---------------------------------------------------------------- keys and tenants

#[tokio::test]
async fn tenants_never_share_records() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("same"), "{}")).await;
    let b = send(h.post_as("Bearer tenant-b", "/json", Some("same"), "{}")).await;
    assert_eq!(a.replayed(), Some("false"));
    assert_eq!(b.replayed(), Some("false"));
    assert_ne!(a.body, b.body);
    assert_eq!(h.executions(), 2);
    let a2 = send(h.post("/json", Some("same"), "{}")).await;
    assert_eq!(a2.body, a.body);
    let key = ScopedKey::new(
        tenant_id(b"Bearer tenant-a"),
        "test",
        ClientKey::parse("same").unwrap(),
    );
    assert!(h.layer.engine().store().get(&key).await.unwrap().is_some());
}

#[tokio::test]
async fn malformed_and_missing_keys_are_refused() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let long = "k".repeat(256);
    let bad: Vec<HeaderValue> = vec![
        HeaderValue::from_static(""),
        HeaderValue::from_static("\"\""),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static("a\tb"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        HeaderValue::from_static("\"open"),
        HeaderValue::from_static("\"a\"b"),
        HeaderValue::from_static("\"a\\nb\""),
    ];
    for v in bad {
        let a = send(
            h.post("/json", None, "{}")
                .header("idempotency-key", v.clone()),
        )
        .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{v:?}");
        assert_eq!(a.problem_type(), problem("malformed-key"), "{v:?}");
    }
    let twice = send(
        h.post("/json", Some("a"), "{}")
            .header("idempotency-key", "b"),
    )
    .await;
    assert_eq!(twice.problem_type(), problem("malformed-key"));
    let missing = send(h.post("/json", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), problem("missing-key"));
    assert_eq!(h.executions(), 0);
    // Other methods pass through.
    let plain = send(h.client.get(format!("{}/plain", h.base))).await;
    assert_eq!(plain.body, "plain");
    assert_eq!(plain.replayed(), None);
}

#[tokio::test]
async fn optional_routes_pass_unkeyed_requests_through_unmerged() {
    let h = Harness::start(LayerConfig {
        key_mode: KeyMode::Optional,
        ..config(OnInflight::Reject)
    })
    .await;
    let a = send(h.post("/json", None, "{}")).await;
    let b = send(h.post("/json", None, "{}")).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(a.replayed(), None);
    assert_ne!(a.body, b.body);
    assert_eq!(h.executions(), 2);
    let big = format!(
        "{{\"x\":\"{}\"}}",
        "y".repeat(LayerConfig::default().body_limit)
    );
    let too_big = send(h.post("/json", None, &big)).await;
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.executions(), 2);
    // A key still protects.
    send(h.post("/json", Some("k"), "{}")).await;
    let r = send(h.post("/json", Some("k"), "{}")).await;
    assert_eq!(r.replayed(), Some("true"));
    assert_eq!(h.executions(), 3);
}

#[tokio::test]
async fn derived_keys_need_their_dimensions() {
    let h = Harness::start(LayerConfig {
        key_mode: KeyMode::Derive(DeriveTemplate::default()),
        ..config(OnInflight::Reject)
    })
    .await;
    let missing = send(h.post("/json", None, "{}").header("x-user-id", "u1")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), problem("missing-key"));
    let req = |session: &str| {
        h.post("/json", None, r#"{"q":"same question"}"#)
            .header("x-user-id", "u1")
            .header("x-session-id", session)
    };
    let first = send(req("s1")).await;
    let second = send(req("s1")).await;
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(second.replayed(), Some("true"));
    let other_session = send(req("s2")).await;
    assert_eq!(other_session.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_before_the_handler() {
    let h = Harness::start(LayerConfig {
        body_limit: 64,
        ..config(OnInflight::Reject)
    })
    .await;
    let big = format!("{{\"x\":\"{}\"}}", "y".repeat(100));
    let a = send(h.post("/json", Some("big"), &big)).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(a.problem_type(), problem("body-too-large"));
    assert_eq!(h.executions(), 0);
    let ok = send(h.post("/json", Some("big"), "{}")).await;
    assert_eq!(ok.status, StatusCode::CREATED, "the key was not claimed");
}

// ---------------------------------------------------------------- respond-async

#[tokio::test]
async fn respond_async_returns_an_operation_to_poll() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let accepted = send(
        h.post("/json", Some("op"), "{}")
            .header("prefer", "respond-async")
            .header("x-gate", "1"),
    )
    .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let location = accepted.headers["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/idemgate/operations/"));
    let url = format!("{}{location}", h.base);
    let auth = |b: reqwest::RequestBuilder| b.header("authorization", "Bearer tenant-a");
    let pending = send(auth(h.client.get(&url))).await;
    assert_eq!(pending.status, StatusCode::ACCEPTED);
    // A duplicate asking for async while it runs gets the same operation.
    let dup = send(
        h.post("/json", Some("op"), "{}")
            .header("prefer", "respond-async"),
    )
    .await;
    assert_eq!(dup.status, StatusCode::ACCEPTED);
    assert_eq!(dup.headers["location"], location.as_str());
    h.open_gate();
    h.until("the operation finished", |h| h.layer.detached() == 0)
        .await;
    let done = send(auth(h.client.get(&url))).await;
    assert_eq!(done.status, StatusCode::CREATED);
    assert_eq!(done.replayed(), Some("true"));
    assert_eq!(done.json()["execution"], 1);
    let stranger = send(
        h.client
            .get(&url)
            .header("authorization", "Bearer tenant-b"),
    )
    .await;
    assert_eq!(stranger.status, StatusCode::NOT_FOUND);
    assert_eq!(stranger.problem_type(), problem("operation-not-found"));
    // An id naming the key but not the request that made it finds nothing:
    // reading needs what a replay needs.
    let id = location.trim_start_matches("/idemgate/operations/");
    let op = idemgate_layer::operations::parse_operation_id(id).unwrap();
    let forged = idemgate_layer::operations::operation_id(
        &op.namespace,
        &op.key,
        &idemgate_engine::Fingerprint::from_bytes([0; 32]),
    );
    let forged = send(auth(
        h.client
            .get(format!("{}/idemgate/operations/{forged}", h.base)),
    ))
    .await;
    assert_eq!(forged.status, StatusCode::NOT_FOUND);
    let garbage = send(auth(
        h.client.get(format!("{}/idemgate/operations/%%%", h.base)),
    ))
    .await;
    assert_eq!(garbage.status, StatusCode::NOT_FOUND);
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- store outage

#[tokio::test]
async fn a_store_outage_fails_closed_by_default() {
    let h = Harness::start_with(Arc::new(DownStore), config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("k"), "{}")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.problem_type(), problem("store-unavailable"));
    assert_eq!(h.executions(), 0);
}

#[tokio::test]
async fn a_store_outage_passes_through_when_failing_open() {
    let h = Harness::start_with(
        Arc::new(DownStore),
        LayerConfig {
            on_store_error: StoreErrorMode::FailOpen,
            ..config(OnInflight::Reject)
        },
    )
    .await;
    let a = send(h.post("/json", Some("k"), r#"{"a":1}"#)).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(
        a.json()["echo"],
        r#"{"a":1}"#,
        "the buffered body is forwarded"
    );
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- shutdown

#[tokio::test]
async fn shutdown_waits_then_cancels_and_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let _gone = h
        .post("/json", Some("stuck"), "{}")
        .header("x-gate", "1")
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    h.until("the work started", |h| h.executions() == 1).await;
    assert_eq!(h.layer.detached(), 1);
    let report = h.layer.shutdown(Duration::from_millis(50)).await;
    assert_eq!(report.cancelled, 1);
    assert_eq!(h.layer.detached(), 0);
    let key = ScopedKey::new(
        tenant_id(b"Bearer tenant-a"),
        "test",
        ClientKey::parse("stuck").unwrap(),
    );
    let record = h.layer.engine().store().get(&key).await.unwrap();
    assert!(record.is_none(), "no PENDING left behind: {record:?}");
}

#[tokio::test]
async fn shutdown_lets_finishing_work_store_its_result() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let _gone = h
        .post("/json", Some("finishing"), "{}")
        .header("x-sleep-ms", "200")
        .timeout(Duration::from_millis(20))
        .send()
        .await;
    h.until("the work started", |h| h.executions() == 1).await;
    let report = h.layer.shutdown(Duration::from_secs(30)).await;
    assert_eq!(report.cancelled, 0);
    let key = ScopedKey::new(
        tenant_id(b"Bearer tenant-a"),
        "test",
        ClientKey::parse("finishing").unwrap(),
    );
    let record = h.layer.engine().store().get(&key).await.unwrap().unwrap();
    assert!(record.is_done());
}
