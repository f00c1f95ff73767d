//! Executions per key, billing of abandoned work, determinism, and the
//! out-of-process endpoints.

#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    CHAT, MESSAGES, client, generations, json_of, openai_body, post, post_json, sim, until,
};
use futures_util::StreamExt;
use idemgate_llm_sim::{EXECUTION_HEADER, SimConfig, StatsSnapshot};
use serde_json::{Value, json};

#[tokio::test]
async fn executions_are_counted_per_key() {
    let sim = sim().await;
    let body = openai_body("count me", false);
    for _ in 0..3 {
        post(&sim, CHAT, &body, &[("Idempotency-Key", "a")]).await;
    }
    post(&sim, CHAT, &body, &[("x-idempotency-key", "b")]).await;
    post(&sim, CHAT, &body, &[("Idempotency-Key", "\"b\"")]).await;
    post(&sim, CHAT, &body, &[]).await;
    post(&sim, MESSAGES, &common::anthropic_body("x", true), &[]).await;

    assert_eq!(sim.executions_for("a"), 3);
    assert_eq!(
        sim.executions_for("b"),
        2,
        "quoted and bare forms are one key"
    );
    assert_eq!(sim.executions_for(""), 2);
    assert_eq!(sim.executions_for("c"), 0);
    assert_eq!(sim.stats().executions, 7);

    let http = client();
    let one: Value = json_of(http.get(format!("{}/sim/executions/a", sim.url()))).await;
    assert_eq!(one, json!({"key": "a", "executions": 3}));
    let all: Value = json_of(http.get(format!("{}/sim/executions", sim.url()))).await;
    assert_eq!(all, json!({"": 2, "a": 3, "b": 2}));
    let remote: StatsSnapshot = json_of(http.get(format!("{}/sim/stats", sim.url()))).await;
    assert_eq!(remote, sim.stats());

    let reset = http
        .post(format!("{}/sim/reset", sim.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 204);
    assert_eq!(sim.stats(), StatsSnapshot::default());
    assert_eq!(sim.executions_for("a"), 0);
    post(&sim, CHAT, &body, &[("Idempotency-Key", "a")]).await;
    assert_eq!(sim.executions_for("a"), 1);
    sim.reset();
    assert_eq!(sim.stats(), StatsSnapshot::default());
}

/// Many concurrent requests over a few keys: every execution is counted
/// under its key and every response id is distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_executions_are_all_counted_with_unique_ids() {
    let sim = sim().await;
    let url = format!("{}{CHAT}", sim.url());
    let http = client();
    for round in 0..3 {
        let mut tasks = Vec::new();
        for i in 0..60 {
            let http = http.clone();
            let url = url.clone();
            let stream = i % 2 == 0;
            tasks.push(tokio::spawn(async move {
                let response = http
                    .post(&url)
                    .header("Idempotency-Key", format!("k{}", i % 4))
                    .header("x-sim-latency-ms", "5")
                    .header("x-sim-first-token-ms", "1")
                    .json(&openai_body("same question", stream))
                    .send()
                    .await
                    .unwrap();
                let execution = response.headers()[EXECUTION_HEADER]
                    .to_str()
                    .unwrap()
                    .to_owned();
                let text = response.text().await.unwrap();
                assert!(text.contains(&format!("\"chatcmpl-{execution}\"")));
                execution
            }));
        }
        let mut ids = HashSet::new();
        for task in tasks {
            assert!(ids.insert(task.await.unwrap()), "duplicate execution id");
        }
        assert_eq!(ids.len(), 60);
        for k in 0..4 {
            assert_eq!(sim.executions_for(&format!("k{k}")), 15 * (round + 1));
        }
    }
    assert_eq!(generations(&sim.stats()), (180, 180, 180 * 8));
}

#[tokio::test]
async fn same_request_same_text_new_id() {
    let sim = sim().await;
    let body = openai_body("deterministic please", false);
    let first = post_json(&sim, CHAT, &body, &[]).await;
    let second = post_json(&sim, CHAT, &body, &[]).await;
    let other = post_json(&sim, CHAT, &openai_body("something else", false), &[]).await;
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(text(&first), text(&second));
    assert_ne!(first["id"], second["id"]);
    assert_ne!(first, second, "bytes differ between two executions");
    assert_ne!(text(&first), text(&other));
    assert_eq!(sim.stats().executions, 3);
}

/// The central case: the client times out and leaves, the provider
/// finishes anyway and bills the whole response.
#[tokio::test]
async fn abandoned_non_streaming_generation_completes_and_is_billed() {
    let sim = sim().await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    let result = impatient
        .post(format!("{}{CHAT}", sim.url()))
        .header("x-sim-latency-ms", "400")
        .header("Idempotency-Key", "left")
        .json(&openai_body("one two", false))
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    let stats = until(&sim, |s| s.completed == 1 && s.client_disconnects == 1).await;
    assert_eq!(stats.executions, 1);
    assert_eq!(stats.prompt_tokens_billed, 4);
    assert_eq!(stats.completion_tokens_billed, 8);
    assert_eq!(sim.executions_for("left"), 1);
}

#[tokio::test]
async fn dropped_stream_counts_a_disconnect_and_bills_what_was_generated() {
    let sim = sim().await;
    let response = post(
        &sim,
        CHAT,
        &openai_body("long one", true),
        &[("x-sim-tokens", "100000"), ("x-sim-token-interval-ms", "5")],
    )
    .await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(body);
    let stats = until(&sim, |s| s.client_disconnects == 1).await;
    assert_eq!(stats.completed, 0);
    assert!(stats.completion_tokens_billed >= 1);
    assert!(stats.completion_tokens_billed < 100_000);
    // Generation stopped: the bill no longer grows.
    let billed = stats.completion_tokens_billed;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sim.stats().completion_tokens_billed, billed);
}

#[tokio::test]
async fn router_can_be_embedded() {
    let stats = std::sync::Arc::new(idemgate_llm_sim::Stats::new());
    let app = idemgate_llm_sim::router(
        SimConfig {
            latency: Duration::from_millis(1),
            ..SimConfig::default()
        },
        stats.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let response = client()
        .post(format!("http://{addr}{CHAT}"))
        .header("Idempotency-Key", "e")
        .json(&openai_body("embedded", false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(stats.executions_for("e"), 1);
    assert_eq!(stats.snapshot().completion_tokens_billed, 24);
    server.abort();
}

#[tokio::test]
async fn binary_serves_until_killed() {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemgate-llm-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--latency-ms",
            "1",
            "--tokens",
            "3",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().unwrap();
    let url = line.strip_prefix("listening on ").unwrap().to_owned();
    let body: Value = json_of(
        client()
            .post(format!("{url}{CHAT}"))
            .json(&openai_body("from a process", false)),
    )
    .await;
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let stats: StatsSnapshot = json_of(client().get(format!("{url}/sim/stats"))).await;
    assert_eq!((stats.executions, stats.completed), (1, 1));
    child.kill().await.unwrap();
}
