//! Anthropic Messages shapes, as a client parses them.

#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

mod common;

use common::{
    MESSAGES, STATUS_FAILS, anthropic_body, assert_fields, events_of, generations, json_with, post,
    post_json, sim,
};
use serde_json::{Value, json};

#[tokio::test]
async fn non_streaming_message_and_usage() {
    let sim = sim().await;
    let body = post_json(&sim, MESSAGES, &anthropic_body("hi there", false), &[]).await;
    let expected = json!({
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "stop_reason": "end_turn",
    });
    assert_fields(&body, expected);
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert!(body["stop_sequence"].is_null());
    assert_eq!(body["content"].as_array().unwrap().len(), 1);
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(
        body["content"][0]["text"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        8
    );
    // "be brief" (system) + "hi there"
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 4, "output_tokens": 8})
    );
    assert_eq!(generations(&sim.stats()), (1, 1, 8));
    assert_eq!(sim.stats().prompt_tokens_billed, 4);
}

#[tokio::test]
async fn streaming_event_sequence() {
    let sim = sim().await;
    let plain: Value = post_json(&sim, MESSAGES, &anthropic_body("stream me", false), &[]).await;
    let response = post(&sim, MESSAGES, &anthropic_body("stream me", true), &[]).await;
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = events_of(response).await;
    let data: Vec<Value> = events
        .iter()
        .map(|e| {
            let value: Value = serde_json::from_str(&e.data).unwrap();
            assert_eq!(
                e.name.as_deref(),
                value["type"].as_str(),
                "event name = data.type"
            );
            value
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().unwrap()).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", 8));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);

    let start = &data[0]["message"];
    assert_eq!(start["model"], "claude-test");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["usage"]["input_tokens"], 4);
    assert_ne!(start["id"], plain["id"], "a second execution has a new id");
    let text: String = data
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, plain["content"][0]["text"].as_str().unwrap());
    let delta = &data[data.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 8);
    assert_eq!(sim.stats().completed, 2);
}

#[tokio::test]
async fn max_tokens_is_required_and_caps() {
    let sim = sim().await;
    let mut body = anthropic_body("x", false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let error = json_with(post(&sim, MESSAGES, &body, &[]).await, 400).await;
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");

    body["max_tokens"] = json!(2);
    let message: Value = post_json(&sim, MESSAGES, &body, &[]).await;
    assert_eq!(message["stop_reason"], "max_tokens");
    assert_eq!(message["usage"]["output_tokens"], 2);
    assert_eq!(sim.stats().executions, 1);
}

#[tokio::test]
async fn injected_errors_use_anthropic_error_shape() {
    let sim = sim().await;
    for (fail, status, _, kind) in STATUS_FAILS {
        let response = post(
            &sim,
            MESSAGES,
            &anthropic_body("x", true),
            &[("x-sim-fail", fail)],
        )
        .await;
        let error = json_with(response, status).await;
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], kind);
    }
    let stats = sim.stats();
    assert_eq!(stats.failures_injected, 4);
    assert_eq!(stats.executions, 2, "only the 5xx reached the model");
}
