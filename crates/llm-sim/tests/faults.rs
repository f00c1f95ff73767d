//! Every `x-sim-fail` mode, observed from a real client.

#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

mod common;

use std::time::Duration;

use common::{
    CHAT, MESSAGES, STATUS_FAILS, anthropic_body, events, events_of, generations, openai_body,
    post, sim, until,
};
use futures_util::StreamExt;
use idemgate_llm_sim::SimHandle;
use serde_json::Value;

/// How long "nothing more arrives" is watched for. A client-side bound,
/// not a claim about server speed.
const QUIET: Duration = Duration::from_millis(300);

/// POSTs `body` to `path` with `x-sim-fail: fail` and the `extra` headers.
async fn failing(
    sim: &SimHandle,
    path: &str,
    body: &Value,
    fail: &str,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut headers = vec![("x-sim-fail", fail)];
    headers.extend_from_slice(extra);
    post(sim, path, body, &headers).await
}

/// A Chat Completions request for "x", streamed or not, failing as `fail`.
async fn chat(
    sim: &SimHandle,
    stream: bool,
    fail: &str,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    failing(sim, CHAT, &openai_body("x", stream), fail, extra).await
}

/// A streamed Anthropic Messages request for "x", failing as `fail`.
async fn messages(sim: &SimHandle, fail: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    failing(sim, MESSAGES, &anthropic_body("x", true), fail, extra).await
}

#[tokio::test]
async fn status_failures_in_openai_shape() {
    let sim = sim().await;
    for (fail, status, kind, _) in STATUS_FAILS {
        for stream in [false, true] {
            let response = chat(&sim, stream, fail, &[("Idempotency-Key", fail)]).await;
            assert_eq!(response.status(), status);
            assert_eq!(
                response.headers()["content-type"].to_str().unwrap(),
                "application/json"
            );
            let retry_after = response.headers().get("retry-after").cloned();
            assert_eq!(retry_after.is_some(), fail == "429", "{fail}");
            if let Some(value) = retry_after {
                assert_eq!(value, "1");
            }
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["error"]["type"], kind, "{fail}");
            assert!(error["error"]["message"].is_string());
        }
    }
    assert_eq!(sim.executions_for("400"), 0);
    assert_eq!(sim.executions_for("429"), 0);
    assert_eq!(sim.executions_for("500"), 2);
    assert_eq!(sim.executions_for("503"), 2);
    let stats = sim.stats();
    assert_eq!(stats.failures_injected, 8);
    assert_eq!(stats.requests, 8);
    assert_eq!(stats.completed, 0);
    assert_eq!(stats.completion_tokens_billed, 0);

    let response = chat(&sim, false, "502", &[]).await;
    assert_eq!(response.status(), 400, "unknown fail modes are refused");
}

/// Collects body chunks until the body errors or ends; returns the bytes
/// and whether it ended with an error.
async fn read_to_end(response: reqwest::Response) -> (String, bool) {
    let mut body = response.bytes_stream();
    let mut text = Vec::new();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => text.extend_from_slice(&bytes),
            Err(_) => return (String::from_utf8(text).unwrap(), true),
        }
    }
    (String::from_utf8(text).unwrap(), false)
}

fn token_events(text: &str) -> usize {
    text.split("\n\n")
        .filter(|e| e.contains("\"content\":\"") && !e.contains("\"content\":\"\""))
        .count()
}

#[tokio::test]
async fn reset_after_breaks_the_stream() {
    let sim = sim().await;
    for (n, interval) in [(0, "2"), (3, "2"), (3, "0")] {
        let fail = format!("reset-after:{n}");
        let response = chat(&sim, true, &fail, &[("x-sim-token-interval-ms", interval)]).await;
        assert_eq!(response.status(), 200, "headers arrive");
        let (text, errored) = read_to_end(response).await;
        assert!(errored, "the client sees a broken body, not a clean end");
        assert_eq!(token_events(&text), n);
        assert!(!text.contains("[DONE]"));
        assert!(!text.contains("finish_reason\":\"stop"));
        // What did arrive is whole events.
        events(&text);
    }
    assert_eq!(generations(&sim.stats()), (3, 0, 6));
    assert_eq!(sim.stats().failures_injected, 3);
}

#[tokio::test]
async fn reset_after_in_anthropic_stream() {
    let sim = sim().await;
    let response = messages(&sim, "reset-after:2", &[]).await;
    let (text, errored) = read_to_end(response).await;
    assert!(errored);
    let names: Vec<_> = events(&text).into_iter().map(|e| e.name.unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta"
        ]
    );
}

#[tokio::test]
async fn reset_after_non_streaming_breaks_the_body_after_the_work_is_done() {
    let sim = sim().await;
    let response = chat(&sim, false, "reset-after:10", &[]).await;
    assert_eq!(response.status(), 200);
    let (text, errored) = read_to_end(response).await;
    assert!(errored);
    assert_eq!(text.len(), 10);
    let stats = sim.stats();
    assert_eq!(stats.completed, 1, "the provider finished and billed");
    assert_eq!(stats.completion_tokens_billed, 8);
}

#[tokio::test]
async fn stall_after_keeps_the_connection_open_and_silent() {
    let sim = sim().await;
    for n in [0, 2] {
        let fail = format!("stall-after:{n}");
        let response = chat(&sim, true, &fail, &[]).await;
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let mut text = Vec::new();
        while token_events(std::str::from_utf8(&text).unwrap()) < n {
            text.extend_from_slice(&body.next().await.unwrap().unwrap());
        }
        let next = tokio::time::timeout(QUIET, body.next()).await;
        assert!(
            next.is_err(),
            "no bytes and no end within {QUIET:?}: {next:?}"
        );
        drop(body);
        until(&sim, |s| s.client_disconnects == u64::from(n > 0) + 1).await;
    }
    assert_eq!(generations(&sim.stats()), (2, 0, 2));
}

#[tokio::test]
async fn stall_after_non_streaming_sends_part_of_the_body() {
    let sim = sim().await;
    let response = chat(&sim, false, "stall-after:5", &[]).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(first.len(), 5);
    assert!(tokio::time::timeout(QUIET, body.next()).await.is_err());
    drop(body);
    until(&sim, |s| s.client_disconnects == 1).await;
}

#[tokio::test]
async fn hang_never_sends_headers() {
    let sim = sim().await;
    let request = common::client()
        .post(format!("{}{CHAT}", sim.url()))
        .header("x-sim-fail", "hang")
        .header("Idempotency-Key", "h")
        .json(&openai_body("x", true))
        .send();
    assert!(tokio::time::timeout(QUIET, request).await.is_err());
    let stats = until(&sim, |s| s.client_disconnects == 1).await;
    assert_eq!(sim.executions_for("h"), 1, "the request reached the model");
    assert_eq!(stats.completion_tokens_billed, 0);
    assert_eq!(stats.failures_injected, 1);
}

/// Shutdown ends stalled and hanging responses instead of waiting on them.
#[tokio::test]
async fn shutdown_ends_stalled_and_hanging_requests() {
    let sim = sim().await;
    let url = format!("{}{CHAT}", sim.url());
    let http = common::client();
    let hang = tokio::spawn(
        http.post(&url)
            .header("x-sim-fail", "hang")
            .json(&openai_body("x", false))
            .send(),
    );
    let stalled = chat(&sim, true, "stall-after:1", &[]).await;
    until(&sim, |s| s.executions == 2).await;
    tokio::time::timeout(Duration::from_secs(10), sim.shutdown())
        .await
        .expect("shutdown does not wait for stalled responses");
    let hung = hang.await.unwrap().unwrap();
    assert_eq!(hung.status(), 503);
    let (_, errored) = read_to_end(stalled).await;
    assert!(errored, "a stream cut by shutdown is not a clean end");
}

#[tokio::test]
async fn error_events_after_a_200_in_both_dialects() {
    let sim = sim().await;
    let response = chat(&sim, true, "error-after:2", &[("Idempotency-Key", "oe")]).await;
    let got = events_of(response).await;
    let last = got.last().unwrap();
    assert_eq!(last.name, None);
    let error: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert!(got.iter().all(|e| e.data != "[DONE]"), "no terminal event");

    let response = messages(&sim, "error-after:1", &[("Idempotency-Key", "ae")]).await;
    let got = events_of(response).await;
    let last = got.last().unwrap();
    assert_eq!(last.name.as_deref(), Some("error"));
    let error: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert!(
        got.iter()
            .all(|e| e.name.as_deref() != Some("message_stop"))
    );
    assert_eq!(sim.executions_for("oe"), 1);
    assert_eq!(sim.executions_for("ae"), 1);
}

#[tokio::test]
async fn end_after_ends_cleanly_without_the_terminal_event() {
    let sim = sim().await;
    let response = chat(&sim, true, "end-after:2", &[("Idempotency-Key", "ea")]).await;
    let got = events_of(response).await;
    assert!(!got.is_empty());
    assert!(got.iter().all(|e| e.data != "[DONE]"));
    assert_eq!(sim.executions_for("ea"), 1);
}

#[tokio::test]
async fn close_drops_the_connection_after_reading_the_request() {
    let sim = sim().await;
    for stream in [false, true] {
        let sent = common::client()
            .post(format!("{}{CHAT}", sim.url()))
            .json(&openai_body("x", stream))
            .header("x-sim-fail", "close")
            .header("Idempotency-Key", "closed")
            .send()
            .await;
        assert!(sent.is_err(), "no response at all: {sent:?}");
    }
    assert_eq!(sim.executions_for("closed"), 2, "the upstream ran");
}

#[tokio::test]
async fn answers_are_compressed_when_asked_or_forced() {
    use std::io::Read;
    let sim = sim().await;
    // A client that decodes nothing, to see the bytes as sent.
    let raw_client = reqwest::Client::builder()
        .no_gzip()
        .no_brotli()
        .no_deflate()
        .build()
        .unwrap();
    for (headers, encoding) in [
        (vec![("accept-encoding", "gzip")], "gzip"),
        (vec![("accept-encoding", "gzip, br")], "br"),
        (vec![("x-sim-encoding", "gzip")], "gzip"),
        (
            vec![("accept-encoding", "identity"), ("x-sim-encoding", "br")],
            "br",
        ),
    ] {
        for stream in [false, true] {
            let mut request = raw_client
                .post(format!("{}{CHAT}", sim.url()))
                .json(&openai_body("x", stream));
            for (k, v) in &headers {
                request = request.header(*k, *v);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["content-encoding"], encoding);
            let raw = response.bytes().await.unwrap();
            let mut plain = String::new();
            if encoding == "gzip" {
                flate2::read::GzDecoder::new(&raw[..])
                    .read_to_string(&mut plain)
                    .unwrap();
            } else {
                brotli::Decompressor::new(&raw[..], 4096)
                    .read_to_string(&mut plain)
                    .unwrap();
            }
            if stream {
                assert_eq!(events(&plain).last().unwrap().data, "[DONE]");
            } else {
                let v: Value = serde_json::from_str(&plain).unwrap();
                assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
            }
        }
    }
    // Without Accept-Encoding: identity.
    let response = raw_client
        .post(format!("{}{CHAT}", sim.url()))
        .json(&openai_body("x", false))
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("content-encoding").is_none());
}
