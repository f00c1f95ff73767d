//! What the gateway's refusals look like to the tools people already use,
//! over real HTTP in front of the simulated LLM: problems carry the
//! `error` object the OpenAI and Anthropic SDKs read, a 409 for a key in
//! flight advises a short poll (`Retry-After` and `retry-after-ms`) rather
//! than the rest of the lease, and the key header's name is configurable.

mod support;

use support::{TestGateway, header};

use idemgate_llm_sim::SimHandle;

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute};

fn config(upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> Result<GatewayConfig, String> {
    let mut r = RawRoute {
        prefix: Some("/v1".into()),
        upstream: Some(upstream.into()),
        key: Some(RawKeyMode::Require),
        timeouts: Some(support::timeouts("1s", "20s", "20s", "30s")),
        ..RawRoute::default()
    };
    tweak(&mut r);
    GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        shutdown_grace: Some("5s".into()),
        routes: vec![r],
        ..RawConfig::default()
    })
    .map_err(|e| e.to_string())
}

fn chat(text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

/// A chat completion `POST` for `text` carrying `key` in the header
/// `key_header`.
fn post(
    client: &reqwest::Client,
    base: &str,
    (key_header, key): (&str, &str),
    text: &str,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header(key_header, key)
        .body(chat(text))
}

/// Sends `req` and asserts the answer's status is `status`.
async fn expect_status(req: reqwest::RequestBuilder, status: u16) -> reqwest::Response {
    let r = req.send().await.expect("send");
    assert_eq!(r.status(), status);
    r
}

/// The standard key header with `key`.
fn key(key: &str) -> (&'static str, &str) {
    ("idempotency-key", key)
}

async fn json(r: reqwest::Response) -> serde_json::Value {
    let bytes = r.bytes().await.expect("read the body");
    serde_json::from_slice(&bytes).expect("a JSON body")
}

/// The simulated LLM and, in front of it, a gateway on [`config`] with
/// the route changed by `tweak`, with a client for the test.
async fn start(tweak: impl FnOnce(&mut RawRoute)) -> (SimHandle, TestGateway, reqwest::Client) {
    let sim = support::sim().await;
    let gw = TestGateway::start(config(&sim.url(), tweak).expect("config")).await;
    (sim, gw, reqwest::Client::new())
}

/// Asserts the upstream ran `key` exactly once, then stops the gateway.
async fn stop_after_one_execution(sim: &SimHandle, gw: TestGateway, key: &str) {
    assert_eq!(sim.executions_for(key), 1);
    gw.stop().await.expect("stop cleanly");
}

/// A key reused with another body: 422, and the `error` object names the
/// reuse, beside the RFC 9457 fields.
#[tokio::test]
async fn a_reused_key_says_so_in_the_error_object() {
    let (sim, gw, client) = start(|_| {}).await;
    expect_status(post(&client, &gw.base, key("reuse-1"), "one"), 200).await;
    let second = expect_status(post(&client, &gw.base, key("reuse-1"), "two"), 422).await;
    assert_eq!(
        header(&second, "content-type").as_deref(),
        Some("application/problem+json")
    );
    let v = json(second).await;
    assert_eq!(v["type"], "https://idemgate.dev/problems/key-mismatch");
    assert_eq!(v["status"], 422);
    assert_eq!(v["error"]["code"], "key-mismatch");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("different request"), "{v}");
    // The gateway's own problems (no route) carry it too.
    let none = expect_status(client.post(format!("{}/elsewhere", gw.base)), 404).await;
    let v = json(none).await;
    assert_eq!(v["error"]["code"], "no-route");
    assert_eq!(v["error"]["type"], "not_found_error");
    stop_after_one_execution(&sim, gw, "reuse-1").await;
}

/// An operation that finishes in 1.5 s: a duplicate meeting the next one
/// in flight is told to poll again in 1 s (`retry-after-ms: 1000`), not at
/// the end of the 30 s lease.
#[tokio::test]
async fn an_in_flight_409_advises_a_short_poll_not_the_lease() {
    let (sim, gw, client) = start(|r| {
        r.on_inflight = Some(RawInflightMode::Reject);
        r.pending_ttl = Some("30s".into());
    })
    .await;
    // One execution sets the route's latency estimate.
    let seed = post(&client, &gw.base, key("seed"), "seed").header("x-sim-latency-ms", "1500");
    expect_status(seed, 200).await;

    let owner = post(&client, &gw.base, key("slow"), "slow")
        .header("x-sim-latency-ms", "3000")
        .send();
    let owner = tokio::spawn(owner);
    // The upstream counts the execution when it starts: the key is held.
    while sim.executions_for("slow") == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let dup = expect_status(post(&client, &gw.base, key("slow"), "slow"), 409).await;
    assert_eq!(header(&dup, "retry-after").as_deref(), Some("1"));
    assert_eq!(header(&dup, "retry-after-ms").as_deref(), Some("1000"));
    assert_eq!(header(&dup, "x-should-retry").as_deref(), Some("true"));
    let v = json(dup).await;
    assert_eq!(v["error"]["code"], "in-flight");
    assert_eq!(v["error"]["type"], "conflict_error");

    let done = owner.await.expect("join").expect("send");
    assert_eq!(done.status(), 200);
    stop_after_one_execution(&sim, gw, "slow").await;
}

/// `key_header = "x-idempotency-key"`: the key is read there (and replayed
/// on it); `Idempotency-Key` alone no longer keys the request.
#[tokio::test]
async fn the_key_header_is_configurable_per_route() {
    let (sim, gw, client) = start(|r| {
        r.key_header = Some("X-Idempotency-Key".into());
    })
    .await;
    let mut replayed = Vec::new();
    for _ in 0..2 {
        let prefixed = post(
            &client,
            &gw.base,
            ("x-idempotency-key", "pfx-1"),
            "prefixed",
        );
        let r = expect_status(prefixed, 200).await;
        replayed.push(header(&r, "idempotent-replayed"));
    }
    assert_eq!(
        replayed,
        [Some("false".to_owned()), Some("true".to_owned())]
    );
    assert_eq!(sim.executions_for("pfx-1"), 1);

    // On this route the standard header is not where the key is read.
    let r = expect_status(post(&client, &gw.base, key("std-1"), "standard"), 400).await;
    let v = json(r).await;
    assert_eq!(v["error"]["code"], "missing-key");
    // The refusal names the header this route reads.
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("x-idempotency-key"), "{v}");
    assert_eq!(sim.executions_for("std-1"), 0);

    // A malformed key in the configured header is refused like any other.
    let bad = post(&client, &gw.base, ("x-idempotency-key", ""), "bad");
    expect_status(bad, 400).await;
    gw.stop().await.expect("stop cleanly");
}

#[test]
fn a_bad_key_header_name_is_refused_naming_the_field() {
    let err = config("http://127.0.0.1:9", |r| {
        r.key_header = Some("not a header".into());
    })
    .expect_err("an invalid header name");
    assert!(err.contains("key_header"), "{err}");
}
