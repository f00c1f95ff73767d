//! What the gateway's integration tests share: [`TestGateway`] (from the
//! crate's `test-util` feature, the harness the client's tests use too),
//! reading its metrics, and small readers of answers.

#![allow(dead_code)]

pub(crate) mod observability;

use std::time::Duration;

pub(crate) use idemgate_gateway::test_util::TestGateway;

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

/// The `Idempotent-Replayed` header, if any.
pub(crate) fn replayed(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
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
