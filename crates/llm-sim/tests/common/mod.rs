//! Helpers shared by the integration tests: a fast simulator, requests,
//! an SSE splitter, and bounded polling of the counters.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use idemgate_llm_sim::{SimConfig, SimHandle, StatsSnapshot};
use serde_json::{Value, json};

/// OpenAI Chat Completions.
pub const CHAT: &str = "/v1/chat/completions";
/// Anthropic Messages.
pub const MESSAGES: &str = "/v1/messages";
/// OpenAI Responses.
pub const RESPONSES: &str = "/v1/responses";

/// The injected status failures: the `x-sim-fail` value, the status it
/// answers with, and the error type OpenAI and Anthropic name for it.
pub const STATUS_FAILS: [(&str, u16, &str, &str); 4] = [
    ("400", 400, "invalid_request_error", "invalid_request_error"),
    ("429", 429, "requests", "rate_limit_error"),
    ("500", 500, "server_error", "api_error"),
    ("503", 503, "server_error", "overloaded_error"),
];

/// A simulator fast enough for tests, slow enough that "still running"
/// states exist.
pub async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::from_millis(50),
        first_token_delay: Duration::from_millis(20),
        token_interval: Duration::from_millis(2),
        completion_tokens: 8,
    })
    .await
    .expect("spawn simulator")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().build().expect("client")
}

pub fn openai_body(text: &str, stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": text},
        ],
        "stream": stream,
    })
}

pub fn anthropic_body(text: &str, stream: bool) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "stream": stream,
    })
}

/// POST `body` to `path` with extra headers.
pub async fn post(
    sim: &SimHandle,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client().post(format!("{}{path}", sim.url())).json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.expect("send")
}

/// The JSON body of POST `body` to `path` with extra headers, which must
/// be answered with a 200.
pub async fn post_json(
    sim: &SimHandle,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Value {
    json_with(post(sim, path, body, headers).await, 200).await
}

/// Asserts that each field of the object `expected` has that value in
/// `actual`.
pub fn assert_fields(actual: &Value, expected: Value) {
    for (field, want) in expected.as_object().expect("an object of fields") {
        assert_eq!(actual[field], *want, "{field} in {actual}");
    }
}

/// Asserts `response` has `status`; its JSON body.
pub async fn json_with(response: reqwest::Response, status: u16) -> Value {
    assert_eq!(response.status(), status);
    response.json().await.expect("a JSON body")
}

/// Asserts `response` is a 200; its body split into SSE events.
pub async fn events_of(response: reqwest::Response) -> Vec<Event> {
    assert_eq!(response.status(), 200);
    events(&response.text().await.expect("a body"))
}

/// Sends `request` and reads its JSON body.
pub async fn json_of<T: serde::de::DeserializeOwned>(request: reqwest::RequestBuilder) -> T {
    request
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("a JSON body")
}

/// One SSE event: its `event:` name (if any) and its `data:` payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Option<String>,
    pub data: String,
}

/// Splits a complete SSE body into events. Panics on a line that is not
/// `event:` or `data:`, and on an unterminated last event: framing errors
/// must fail the test.
pub fn events(body: &str) -> Vec<Event> {
    assert!(
        body.is_empty() || body.ends_with("\n\n"),
        "stream must end on an event boundary: {body:?}"
    );
    body.split("\n\n")
        .filter(|block| !block.is_empty())
        .map(|block| {
            let mut event = Event {
                name: None,
                data: String::new(),
            };
            for line in block.split('\n') {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data = data.to_owned();
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            event
        })
        .collect()
}

/// What became of the generations: (executions, completed, completion
/// tokens billed).
pub fn generations(stats: &StatsSnapshot) -> (u64, u64, u64) {
    (
        stats.executions,
        stats.completed,
        stats.completion_tokens_billed,
    )
}

/// Polls the counters until `done` holds, for at most 10 s (a bound on a
/// hang, not a performance claim).
pub async fn until(sim: &SimHandle, done: impl Fn(&StatsSnapshot) -> bool) -> StatsSnapshot {
    for _ in 0..1000 {
        let stats = sim.stats();
        if done(&stats) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held; last stats {:?}", sim.stats());
}
