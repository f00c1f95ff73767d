//! OpenAI Chat Completions shapes, as a client parses them.

#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

mod common;

use common::{
    CHAT, assert_fields, events_of, generations, json_of, json_with, openai_body, post, post_json,
    sim,
};
use idemgate_llm_sim::EXECUTION_HEADER;
use serde_json::{Value, json};

#[tokio::test]
async fn non_streaming_shape_and_usage() {
    let sim = sim().await;
    let response = post(&sim, CHAT, &openai_body("one two three", false), &[]).await;
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert_eq!(response.headers()[EXECUTION_HEADER].to_str().unwrap(), "1");
    let body = json_with(response, 200).await;
    assert_fields(
        &body,
        json!({"object": "chat.completion", "id": "chatcmpl-1", "model": "gpt-test"}),
    );
    assert!(body["created"].as_u64().unwrap() > 1_700_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "stop");
    let content = choice["message"]["content"].as_str().unwrap();
    assert_eq!(content.split(' ').count(), 8);
    // "be brief" + "one two three"
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13})
    );
    let stats = sim.stats();
    assert_eq!(generations(&stats), (1, 1, 8));
    assert_eq!(stats.requests, 1);
    assert_eq!(stats.prompt_tokens_billed, 5);
    assert_eq!(stats.client_disconnects, 0);
}

/// Reads a whole stream and checks every event is `data: JSON` up to a
/// final `data: [DONE]`; returns the parsed chunks.
async fn stream_chunks(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream; charset=utf-8"
    );
    let events = events_of(response).await;
    let (last, rest) = events.split_last().expect("at least one event");
    assert_eq!(last.data, "[DONE]");
    assert!(last.name.is_none());
    rest.iter()
        .map(|e| {
            assert!(e.name.is_none(), "OpenAI events are unnamed");
            serde_json::from_str(&e.data).expect("every data line is JSON")
        })
        .collect()
}

fn content_of(chunks: &[Value]) -> (usize, String) {
    let pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    (pieces.len(), pieces.concat())
}

#[tokio::test]
async fn streaming_framing_without_usage() {
    let sim = sim().await;
    let plain: Value = post_json(&sim, CHAT, &openai_body("hello", false), &[]).await;
    let chunks = stream_chunks(post(&sim, CHAT, &openai_body("hello", true), &[]).await).await;

    let id = chunks[0]["id"].as_str().unwrap();
    assert_eq!(id, "chatcmpl-2");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["model"], "gpt-test");
        assert!(
            chunk.get("usage").is_none(),
            "no usage key without include_usage"
        );
        assert_eq!(chunk["choices"].as_array().unwrap().len(), 1);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (count, text) = content_of(&chunks);
    assert_eq!(count, 8, "one chunk per token");
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    let finishes = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .count();
    assert_eq!(finishes, 1);

    let stats = sim.stats();
    assert_eq!(generations(&stats), (2, 2, 16));
    assert_eq!(stats.client_disconnects, 0);
}

#[tokio::test]
async fn streaming_usage_chunk_iff_include_usage() {
    let sim = sim().await;
    let mut body = openai_body("a b c d", true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(post(&sim, CHAT, &body, &[]).await).await;
    let (usage_chunk, others) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14})
    );
    for chunk in others {
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
    }
    assert_eq!(content_of(others).0, 8);

    body["stream_options"] = json!({"include_usage": false});
    let chunks = stream_chunks(post(&sim, CHAT, &body, &[]).await).await;
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn max_tokens_caps_output_with_finish_reason_length() {
    let sim = sim().await;
    let mut body = openai_body("cap me", false);
    body["max_tokens"] = json!(3);
    let plain: Value = post_json(&sim, CHAT, &body, &[]).await;
    assert_eq!(plain["choices"][0]["finish_reason"], "length");
    assert_eq!(plain["usage"]["completion_tokens"], 3);

    body["stream"] = json!(true);
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(2);
    let chunks = stream_chunks(post(&sim, CHAT, &body, &[]).await).await;
    assert_eq!(content_of(&chunks).0, 2);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(sim.stats().completion_tokens_billed, 5);
}

#[tokio::test]
async fn header_overrides_and_bad_headers() {
    let sim = sim().await;
    let body: Value = post_json(
        &sim,
        CHAT,
        &openai_body("x", false),
        &[("x-sim-tokens", "3")],
    )
    .await;
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let chunks = stream_chunks(
        post(
            &sim,
            CHAT,
            &openai_body("x", true),
            &[("x-sim-tokens", "0"), ("x-sim-first-token-ms", "0")],
        )
        .await,
    )
    .await;
    assert_eq!(content_of(&chunks).0, 0);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    let unparsable = [("x-sim-latency-ms", "soon")];
    let response = post(&sim, CHAT, &openai_body("x", false), &unparsable).await;
    let error = json_with(response, 400).await;
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-sim-latency-ms")
    );
    assert_eq!(
        sim.stats().executions,
        2,
        "a rejected request is not executed"
    );
    assert_eq!(sim.stats().requests, 3);
}

#[tokio::test]
async fn malformed_requests_get_provider_errors() {
    let sim = sim().await;
    let http = common::client();
    let not_json = http.post(format!("{}{CHAT}", sim.url())).body("{not json");
    let error = json_with(not_json.send().await.unwrap(), 400).await;
    assert_eq!(error["error"]["type"], "invalid_request_error");
    for body in [
        json!({"messages": []}),
        json!({"model": "m", "messages": []}),
        json!([1]),
    ] {
        let response = post(&sim, CHAT, &body, &[]).await;
        assert_eq!(response.status(), 400, "{body}");
    }
    let unknown = http.post(format!("{}/v1/nope", sim.url()));
    let error = json_with(unknown.send().await.unwrap(), 404).await;
    assert_eq!(error["error"]["code"], "unknown_url");
    assert_eq!(sim.stats().executions, 0);
}

#[tokio::test]
async fn models_lists_in_each_dialect() {
    let sim = sim().await;
    let url = format!("{}/v1/models", sim.url());
    let openai: Value = json_of(common::client().get(&url)).await;
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["data"][0]["object"], "model");
    let anthropic: Value = json_of(
        common::client()
            .get(&url)
            .header("anthropic-version", "2023-06-01"),
    )
    .await;
    assert_eq!(anthropic["data"][0]["type"], "model");
    assert_eq!(anthropic["has_more"], false);
    assert_eq!(
        sim.stats().requests,
        0,
        "models calls are not generation requests"
    );
}
