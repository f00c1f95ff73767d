//! What the gateway's integration tests share: [`TestGateway`] (from the
//! crate's `test-util` feature, the harness the client's tests use too),
//! reading its metrics, and small readers of answers.

#![allow(dead_code)]

pub(crate) mod observability;

use std::time::Duration;

use idemgate_llm_sim::{SimConfig, SimHandle};

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawKeyMode, RawRoute, RawTimeouts};
pub(crate) use idemgate_gateway::test_util::{TestGateway, TestGatewayBuilder};

/// A one-route gateway on `store` in front of `upstream` whose route
/// requires keys: the start of the multi-store tests' configurations.
pub(crate) fn keyed(store: &str, upstream: &str) -> TestGatewayBuilder {
    TestGateway::builder(upstream)
        .store(store)
        .route(|r| r.key = Some(RawKeyMode::Require))
}

/// Starts a replica with `config` on `store`; a store that cannot be opened
/// fails the test (under CI and outside it alike: no silent skip).
pub(crate) async fn replica_on(store: &str, config: GatewayConfig) -> TestGateway {
    let gw = TestGateway::start(config).await;
    // `serve` opens the store before it answers; a failure ends the task.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if gw.task.is_finished() {
        let err = gw.stop().await.err();
        panic!(
            "the store at {store} is not available{}: {err:?} (start it with `bash scripts/services.sh`)",
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                " under CI"
            } else {
                ""
            }
        );
    }
    gw
}

/// A route's timeouts: to connect, to the first byte, between chunks, and
/// in all.
pub(crate) fn timeouts(connect: &str, first_byte: &str, idle: &str, total: &str) -> RawTimeouts {
    RawTimeouts {
        connect: Some(connect.into()),
        first_byte: Some(first_byte.into()),
        idle: Some(idle.into()),
        total: Some(total.into()),
    }
}

/// A non-streamed or streamed chat completion request body for `text`.
pub(crate) fn chat_body(stream: bool, text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

/// Writes `request` as is on a fresh connection to `base` (an `http://`
/// address), reads the answer until the server closes, and returns its
/// status and whole text.
pub(crate) async fn raw_exchange(base: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    tcp.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.expect("read the answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

/// A `POST` of the JSON `body` to `url`.
pub(crate) fn json_post(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
}

/// A [`json_post`] with the credential `authorization` and the
/// idempotency `key`.
pub(crate) fn keyed_post(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    authorization: &str,
    key: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    json_post(client, url, body)
        .header("authorization", authorization)
        .header("idempotency-key", key)
}

/// Sends `req` and asserts the answer's status is `status`.
pub(crate) async fn expect_status(req: reqwest::RequestBuilder, status: u16) -> reqwest::Response {
    let r = req.send().await.expect("send the request");
    assert_eq!(r.status(), status);
    r
}

/// The answer's header `name`, if it is there and readable as text.
pub(crate) fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A configuration on `store` with one route, `prefix` to a closed port
/// (for tests of the listeners, not the proxy), a 1 s shutdown grace, and
/// the file-level settings changed by `tweak`.
pub(crate) fn closed_upstream_config(
    store: &str,
    prefix: &str,
    tweak: impl FnOnce(&mut RawConfig),
) -> GatewayConfig {
    let mut raw = RawConfig {
        store: Some(store.into()),
        shutdown_grace: Some("1s".into()),
        routes: vec![RawRoute {
            prefix: Some(prefix.into()),
            upstream: Some("http://127.0.0.1:9".into()),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    };
    tweak(&mut raw);
    GatewayConfig::from_raw(raw).unwrap_or_else(|e| panic!("config: {e}"))
}

/// Serves `router` on a free loopback port until the test ends; returns
/// its `http://ADDR`.
pub(crate) async fn serve(router: axum::Router) -> String {
    let (listener, url) = idemgate_gateway::test_util::loopback().await;
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// The admin listener's `/metrics` text.
pub(crate) async fn metrics(gw: &TestGateway, client: &reqwest::Client) -> String {
    let r = client
        .get(format!("{}/metrics", gw.admin))
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    r.text().await.expect("read the response body")
}

/// The simulated LLM with its default pacing.
pub(crate) async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the simulator")
}

/// The simulated LLM answering after 5 ms.
pub(crate) async fn quick_sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::from_millis(5),
        ..SimConfig::default()
    })
    .await
    .expect("spawn the simulator")
}

/// The `type` of a problem+json answer.
pub(crate) async fn problem_type(r: reqwest::Response) -> String {
    let bytes = r.bytes().await.expect("read the problem");
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("a JSON problem");
    v["type"].as_str().unwrap_or_default().to_owned()
}

/// Waits until `cond` holds, polling (bounded, not a timing assertion).
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

/// An answer's body read to its end, and whether it broke before that
/// (the connection cut mid-body: a stream that is not the key's answer).
pub(crate) async fn body_until_break(res: reqwest::Response) -> (Vec<u8>, bool) {
    use futures_util::StreamExt;
    let mut body = Vec::new();
    let mut chunks = res.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(c) => body.extend_from_slice(&c),
            Err(_) => return (body, true),
        }
    }
    (body, false)
}
