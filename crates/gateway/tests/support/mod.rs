//! What the gateway's integration tests share: [`TestGateway`] (from the
//! crate's `test-util` feature, the harness the client's tests use too),
//! reading its metrics, and small readers of answers.

#![allow(dead_code)]

pub(crate) mod observability;

use std::time::Duration;

use idemgate_llm_sim::{SimConfig, SimHandle};

use idemgate_gateway::config::RawKeyMode;
pub(crate) use idemgate_gateway::test_util::{TestGateway, TestGatewayBuilder};

/// A one-route gateway on `store` in front of `upstream` whose route
/// requires keys: the start of the multi-store tests' configurations.
pub(crate) fn keyed(store: &str, upstream: &str) -> TestGatewayBuilder {
    TestGateway::builder(upstream)
        .store(store)
        .route(|r| r.key = Some(RawKeyMode::Require))
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
