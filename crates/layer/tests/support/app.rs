//! The app the layer's HTTP tests run: an axum router behind the
//! idempotency layer, with handlers that count their executions and do
//! what a request's `x-…` headers tell them (wait at a gate, sleep, fail,
//! break a stream), served on 127.0.0.1:0 ([`Harness`]) or driven without
//! a socket on tokio's paused clock ([`App`]); and the readers of what a
//! client gets back. Shared by every test file split from one behaviour
//! area of the layer, so each reads as its tests only.

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
use idemgate_engine::{ClientKey, Engine, MemoryStore, Policy, Record, ScopedKey, Store};
use idemgate_layer::key::tenant_id;
use idemgate_layer::{IdempotencyContext, IdempotencyLayer, LayerConfig, OnInflight};
use tokio::sync::{mpsc, watch};

/// What the handlers behind the layer share: how many times they ran, and
/// the gate they wait at.
#[derive(Clone)]
pub struct AppState {
    /// Incremented by every handler run.
    pub executions: Arc<AtomicUsize>,
    /// Handlers told to (`x-gate: 1` here) wait until the test opens it.
    pub gate: watch::Receiver<bool>,
}

impl AppState {
    /// Counts a handler run; its number (1 for the first).
    pub fn count_run(&self) -> usize {
        self.executions.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Waits until the test opens the gate.
    pub async fn wait_for_gate(&self) {
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
    }
}

/// The JSON answer of handler run `n`: `{"exec":n}`.
pub fn exec_answer(n: usize) -> Response {
    (
        [("content-type", "application/json")],
        format!("{{\"exec\":{n}}}"),
    )
        .into_response()
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
pub struct App {
    pub router: Router,
    pub executions: Arc<AtomicUsize>,
    pub gate: watch::Sender<bool>,
    pub layer: IdempotencyLayer,
}

impl App {
    pub fn new(store: Arc<dyn Store>, config: LayerConfig) -> Self {
        let engine =
            Engine::new(store).with_policy(Policy::default().pending_ttl(Duration::from_secs(5)));
        let routes = Router::new()
            .route("/json", post(json_handler))
            .route("/sse", post(sse_handler))
            .route("/plain", get(unprotected));
        Self::with_routes(IdempotencyLayer::new(engine, config), routes)
    }

    /// `routes` behind `layer`, with a fresh execution counter and a closed
    /// gate: for a test file with handlers of its own.
    pub fn with_routes(layer: IdempotencyLayer, routes: Router<AppState>) -> Self {
        let executions = Arc::new(AtomicUsize::new(0));
        let (gate, gate_rx) = watch::channel(false);
        let state = AppState {
            executions: Arc::clone(&executions),
            gate: gate_rx,
        };
        let router = routes.layer(layer.clone()).with_state(state);
        Self {
            router,
            executions,
            gate,
            layer,
        }
    }

    /// Serves the router on 127.0.0.1:0; its `http://ADDR`.
    pub async fn serve(&self) -> String {
        serve(self.router.clone()).await
    }

    /// Sends `request` through the router, as a server would.
    pub async fn call(&self, request: axum::http::Request<Body>) -> Response {
        use tower::ServiceExt;
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
    }

    /// How many times a handler ran.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }
}

/// Serves `router` on 127.0.0.1:0 until the test ends; its `http://ADDR`.
pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// A keyed JSON request of tenant A with key `t`, held at the handler's
/// gate when `gated`.
pub fn gated_request(gated: bool) -> axum::http::Request<Body> {
    let mut b = axum::http::Request::post("/json")
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", "t");
    if gated {
        b = b.header("x-gate", "1");
    }
    b.body(Body::from("{}")).expect("a valid request")
}

/// The `type` of the problem+json body of `response`.
pub async fn problem_of(response: Response) -> serde_json::Value {
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("read the problem");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
    v["type"].clone()
}

/// The test app on a real listener, with a client for it.
pub struct Harness {
    pub base: String,
    pub client: reqwest::Client,
    pub executions: Arc<AtomicUsize>,
    pub gate: watch::Sender<bool>,
    pub layer: IdempotencyLayer,
}

impl Harness {
    pub async fn start(config: LayerConfig) -> Self {
        Self::start_with(Arc::new(MemoryStore::new()), config).await
    }

    /// A harness in `reject` mode whose config `tweak` changes.
    pub async fn rejecting_with(tweak: impl FnOnce(&mut LayerConfig)) -> Self {
        let mut c = config(OnInflight::Reject);
        tweak(&mut c);
        Self::start(c).await
    }

    /// Opens a keyed stream whose handler is told `header` (an `x-…` one).
    pub async fn stream(&self, key: &str, header: (&str, &str)) -> reqwest::Response {
        let b = self
            .post("/sse", Some(key), "{}")
            .header(header.0, header.1);
        b.send().await.expect("the layer answers")
    }

    pub async fn start_with(store: Arc<dyn Store>, config: LayerConfig) -> Self {
        let app = App::new(store, config);
        let base = app.serve().await;
        Self {
            base,
            client: reqwest::Client::new(),
            executions: app.executions,
            gate: app.gate,
            layer: app.layer,
        }
    }

    pub fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        self.post_as("Bearer tenant-a", path, key, body)
    }

    pub fn post_as(
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

    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Waits until `cond` holds for the harness ([`until`]).
    pub async fn until(&self, what: &str, cond: impl Fn(&Self) -> bool) {
        until(what, || cond(self)).await;
    }

    /// Waits until the handler has run `n` times.
    pub async fn until_runs(&self, n: usize) {
        self.until(&format!("{n} runs of the handler"), |h| h.executions() == n)
            .await;
    }

    /// Waits until no work runs detached from its request: abandoned work
    /// finished, a failed one released its key.
    pub async fn until_settled(&self) {
        self.until("no detached work", |h| h.layer.detached() == 0)
            .await;
    }

    /// Once no work runs detached, sends `key` to `path` again and
    /// asserts that it ran anew (the key was released), `runs` runs in
    /// all; the answer.
    pub async fn retry_runs_again(&self, path: &str, key: &str, runs: usize) -> Answer {
        self.until_settled().await;
        let retry = send(self.post(path, Some(key), "{}")).await;
        assert_eq!(retry.replayed(), Some("false"));
        assert_eq!(self.executions(), runs);
        retry
    }

    /// Sends a keyed `{}` to `path` whose client gives up after `timeout`,
    /// with `header` telling the handler to wait (`x-gate` or
    /// `x-sleep-ms`): the work goes on without it.
    pub async fn abandoned(&self, key: &str, header: (&str, &str), timeout: Duration) -> bool {
        self.post("/json", Some(key), "{}")
            .header(header.0, header.1)
            .timeout(timeout)
            .send()
            .await
            .is_err()
    }

    /// Opens a keyed stream held at the gate after its first events, with
    /// more `x-…` headers.
    pub async fn gated_stream(&self, key: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut b = self.post("/sse", Some(key), "{}").header("x-gate", "1");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.send().await.expect("the layer answers")
    }

    /// The record of tenant A's key `name`, as the store holds it.
    pub async fn record(&self, name: &str) -> Option<Record> {
        self.layer
            .engine()
            .store()
            .get(&tenant_a(name))
            .await
            .expect("the memory store answers")
    }
}

/// Polls `cond` every 5 ms until it holds; fails the test, naming `what`,
/// after 10 s.
pub async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A keyed `{}` POST to `{base}{path}` as the tenant of `Bearer t`.
pub fn keyed_post(base: &str, path: &str, key: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("authorization", "Bearer t")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body("{}")
}

/// Tenant A's key `name` in the layer's namespace `test`.
pub fn tenant_a(name: &str) -> ScopedKey {
    ScopedKey::new(
        tenant_id(b"Bearer tenant-a"),
        "test",
        ClientKey::parse(name).expect("a valid client key"),
    )
}

/// `n` concurrent requests with the same `key` to `path`, released
/// together, spread in turn over `replicas`; every answer.
pub async fn duplicates(
    replicas: &[&Harness],
    path: &'static str,
    key: &str,
    n: usize,
) -> Vec<Answer> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let h = replicas[i % replicas.len()];
            let req = h.post(path, Some(key), "{}").header("x-sleep-ms", "30");
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

pub fn config(mode: OnInflight) -> LayerConfig {
    LayerConfig {
        on_inflight: mode,
        ..LayerConfig::new("test")
    }
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn replayed(&self) -> Option<&str> {
        self.headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "status {}",
            self.status
        );
        self.json()["type"].as_str().unwrap().to_owned()
    }

    /// Asserts the answer's status and its `Idempotent-Replayed` header.
    #[track_caller]
    pub fn assert_replay(&self, status: StatusCode, replayed: Option<&str>) {
        assert_eq!(self.status, status);
        assert_eq!(self.replayed(), replayed);
    }

    /// Asserts the answer's status and that it is the problem `slug`.
    #[track_caller]
    pub fn assert_problem(&self, status: StatusCode, slug: &str) {
        assert_eq!(self.status, status);
        assert_eq!(self.problem_type(), problem(slug));
    }
}

pub async fn send(b: reqwest::RequestBuilder) -> Answer {
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

pub fn problem(slug: &str) -> String {
    format!("https://idemgate.dev/problems/{slug}")
}

/// Reads a streaming response until it holds `n` complete events.
pub async fn read_events(res: &mut reqwest::Response, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while count_events(&got) < n {
        let chunk = res.chunk().await.unwrap().expect("stream ended early");
        got.extend_from_slice(&chunk);
    }
    got
}

pub fn count_events(b: &[u8]) -> usize {
    b.windows(2).filter(|w| w == b"\n\n").count()
}

/// The numbers of the events in `b` (ids are `RUN-N`).
pub fn event_ids(b: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| l.strip_prefix("id: ")?.split_once('-')?.1.parse().ok())
        .collect()
}

/// The run the events in `b` belong to (all of them, or the test fails).
pub fn run_of(b: &[u8]) -> String {
    let runs: Vec<String> = String::from_utf8_lossy(b)
        .lines()
        .filter_map(|l| Some(l.strip_prefix("id: ")?.split_once('-')?.0.to_owned()))
        .collect();
    let first = runs.first().cloned().expect("events with ids");
    assert!(runs.iter().all(|r| *r == first), "one run: {runs:?}");
    first
}

/// Reads the rest of a stream that must end cleanly onto `got`.
pub async fn read_to_end(res: &mut reqwest::Response, got: &mut Vec<u8>) {
    while let Some(c) = res.chunk().await.expect("the stream ends cleanly") {
        got.extend_from_slice(&c);
    }
}

/// Reads the rest of a stream: what came, and whether it ended with an
/// error rather than cleanly.
pub async fn read_until_broken(res: &mut reqwest::Response) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return (got, false),
            Err(_) => return (got, true),
        }
    }
}

/// The id of the last event in `b`, as a client resumes with it.
pub fn last_id(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("id: ").map(str::to_owned))
        .expect("an event with an id")
}
