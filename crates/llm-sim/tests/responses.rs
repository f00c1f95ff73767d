//! OpenAI Responses shapes, as a client parses them.

#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

mod common;

use common::{RESPONSES, assert_fields, events, events_of, json_with, post, post_json, sim};
use serde_json::{Value, json};

fn body(text: &str, stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}],
        "stream": stream,
    })
}

#[tokio::test]
async fn non_streaming_shape_and_usage() {
    let sim = sim().await;
    let v = post_json(&sim, RESPONSES, &body("one two three", false), &[]).await;
    assert_fields(&v, json!({"object": "response", "status": "completed"}));
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let message = &v["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    let text = message["content"][0]["text"].as_str().unwrap();
    assert_eq!(message["content"][0]["type"], "output_text");
    assert_eq!(text.split(' ').count(), 8);
    assert_eq!(v["usage"]["input_tokens"], 5);
    assert_eq!(v["usage"]["output_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], 13);
    assert_eq!(sim.stats().executions, 1);
}

#[tokio::test]
async fn a_string_input_and_an_output_cap() {
    let sim = sim().await;
    let request = json!({"model": "gpt-test", "input": "hello", "max_output_tokens": 3});
    let v = post_json(&sim, RESPONSES, &request, &[]).await;
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);
}

#[tokio::test]
async fn streaming_events_are_named_numbered_and_end_with_completed() {
    let sim = sim().await;
    let response = post(&sim, RESPONSES, &body("one two three", true), &[]).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("[DONE]"),
        "the Responses API sends no [DONE]"
    );
    let events = events(&text);
    let names: Vec<&str> = events.iter().filter_map(|e| e.name.as_deref()).collect();
    assert_eq!(names.len(), events.len(), "every event is named");
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let data: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    for (i, (event, name)) in data.iter().zip(&names).enumerate() {
        assert_eq!(event["type"], *name, "data repeats the name");
        assert_eq!(event["sequence_number"], i as u64, "numbered from 0");
    }
    let deltas: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .filter_map(|d| d["delta"].as_str())
        .collect();
    let done = data.last().unwrap();
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"], deltas,
        "the deltas add up to the final text"
    );
    assert_eq!(done["response"]["usage"]["output_tokens"], 8);
}

#[tokio::test]
async fn a_failure_after_the_200_is_a_response_failed_event() {
    let sim = sim().await;
    let failing = [("x-sim-fail", "error-after:2")];
    let events =
        events_of(post(&sim, RESPONSES, &body("one two three", true), &failing).await).await;
    let last = events.last().unwrap();
    assert_eq!(last.name.as_deref(), Some("response.failed"));
    let v: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(v["response"]["status"], "failed");
    assert_eq!(v["response"]["error"]["code"], "server_error");
    assert!(
        !events
            .iter()
            .any(|e| e.name.as_deref() == Some("response.completed"))
    );
}

#[tokio::test]
async fn malformed_requests_get_provider_errors() {
    let sim = sim().await;
    for (request, says) in [
        (json!({"input": "hi"}), "model"),
        (json!({"model": "gpt-test"}), "input"),
        (
            json!({"model": "gpt-test", "input": [{"content": "x"}]}),
            "role",
        ),
    ] {
        let v = json_with(post(&sim, RESPONSES, &request, &[]).await, 400).await;
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{v}"
        );
    }
    assert_eq!(sim.stats().executions, 0);
}
