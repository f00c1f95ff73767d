//! Anthropic Messages (`POST /v1/messages`).
//!
//! Streaming follows the provider's event sequence: `message_start`,
//! `content_block_start`, `ping`, one `content_block_delta` (`text_delta`)
//! per token, `content_block_stop`, `message_delta` (stop reason and final
//! `output_tokens`), `message_stop`. Every event is named (`event:` line)
//! and its `data` repeats the name in `type`.

use serde_json::{Value, json};

use crate::content::{Conversation, text_of};
use crate::dialect::{Dialect, ErrorKind, Generation, Meta, sse};

/// The Anthropic dialect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anthropic;

impl Anthropic {
    fn stop_reason(g: &Generation) -> &'static str {
        if g.truncated {
            "max_tokens"
        } else {
            "end_turn"
        }
    }
}

impl Dialect for Anthropic {
    const STREAM_ERROR_EVENT: Option<&'static str> = Some("error");

    fn error_body(kind: ErrorKind, message: &str) -> Value {
        let kind = match kind {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Server => "api_error",
            ErrorKind::Overloaded => "overloaded_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    fn response_id(sequence: u64) -> String {
        format!("msg_sim{sequence:017}")
    }

    fn parse(body: &[u8], wanted: u32) -> Result<Generation, String> {
        let request: Value = serde_json::from_slice(body)
            .map_err(|e| format!("request body is not valid JSON: {e}"))?;
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .ok_or("model: Field required")?;
        let max_tokens = request
            .get("max_tokens")
            .and_then(Value::as_u64)
            .filter(|n| *n >= 1)
            .ok_or("max_tokens: Field required (an integer >= 1)")?;
        let messages = request
            .get("messages")
            .and_then(Value::as_array)
            .filter(|m| !m.is_empty())
            .ok_or("messages: at least one message is required")?;
        let mut conversation = Conversation::default();
        if let Some(system) = request.get("system") {
            conversation.push("system", text_of(system));
        }
        for message in messages {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .ok_or("messages: every message needs a 'role'")?;
            conversation.push(
                role,
                text_of(message.get("content").unwrap_or(&Value::Null)),
            );
        }
        let stream = request
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Generation::new(
            model,
            &conversation,
            wanted,
            Some(max_tokens),
            stream,
            false,
        ))
    }

    fn message(g: &Generation, meta: &Meta) -> Value {
        json!({
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "model": g.model,
            "content": [{"type": "text", "text": g.text()}],
            "stop_reason": Self::stop_reason(g),
            "stop_sequence": null,
            "usage": {
                "input_tokens": g.prompt_tokens,
                "output_tokens": g.completion_tokens(),
            },
        })
    }

    fn stream_start(g: &Generation, meta: &Meta) -> String {
        let start = json!({
            "type": "message_start",
            "message": {
                "id": meta.id,
                "type": "message",
                "role": "assistant",
                "model": g.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": g.prompt_tokens, "output_tokens": 1},
            },
        });
        let block = json!({
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        });
        let mut out = sse(Some("message_start"), &start);
        out.push_str(&sse(Some("content_block_start"), &block));
        out.push_str(&sse(Some("ping"), &json!({"type": "ping"})));
        out
    }

    fn stream_token(_g: &Generation, _meta: &Meta, token: &str) -> String {
        let delta = json!({
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": token},
        });
        sse(Some("content_block_delta"), &delta)
    }

    fn stream_end(g: &Generation, _meta: &Meta) -> String {
        let stop = json!({"type": "content_block_stop", "index": 0});
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": Self::stop_reason(g), "stop_sequence": null},
            "usage": {"output_tokens": g.completion_tokens()},
        });
        let mut out = sse(Some("content_block_stop"), &stop);
        out.push_str(&sse(Some("message_delta"), &delta));
        out.push_str(&sse(Some("message_stop"), &json!({"type": "message_stop"})));
        out
    }
}
