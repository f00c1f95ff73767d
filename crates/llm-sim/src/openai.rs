//! OpenAI Chat Completions (`POST /v1/chat/completions`).
//!
//! Streaming follows the provider's framing: a first chunk carrying the
//! assistant role, one `chat.completion.chunk` per token, a chunk with the
//! `finish_reason`, a usage chunk with empty `choices` when
//! `stream_options.include_usage` is set (every other chunk then carries
//! `"usage": null`), and `data: [DONE]`.

use serde_json::{Value, json};

use crate::content::{Conversation, text_of};
use crate::dialect::{Dialect, ErrorKind, Generation, Meta, sse};

/// Sent as `system_fingerprint`.
const FINGERPRINT: &str = "fp_idemgate_sim";

/// The OpenAI dialect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenAi;

impl OpenAi {
    fn finish_reason(g: &Generation) -> &'static str {
        if g.truncated { "length" } else { "stop" }
    }

    fn usage(g: &Generation) -> Value {
        json!({
            "prompt_tokens": g.prompt_tokens,
            "completion_tokens": g.completion_tokens(),
            "total_tokens": g.prompt_tokens + g.completion_tokens(),
        })
    }

    fn chunk(g: &Generation, meta: &Meta, choices: Value) -> Value {
        let mut chunk = json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": g.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        });
        if g.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn delta(g: &Generation, meta: &Meta, delta: Value, finish: Option<&str>) -> String {
        let choices = json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish,
        }]);
        sse(None, &Self::chunk(g, meta, choices))
    }
}

impl Dialect for OpenAi {
    const STREAM_ERROR_EVENT: Option<&'static str> = None;

    fn error_body(kind: ErrorKind, message: &str) -> Value {
        let (kind, code) = match kind {
            ErrorKind::InvalidRequest => ("invalid_request_error", Value::Null),
            ErrorKind::NotFound => ("invalid_request_error", json!("unknown_url")),
            ErrorKind::RateLimit => ("requests", json!("rate_limit_exceeded")),
            ErrorKind::Server | ErrorKind::Overloaded => ("server_error", Value::Null),
        };
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }

    fn response_id(sequence: u64) -> String {
        format!("chatcmpl-{sequence}")
    }

    fn parse(body: &[u8], wanted: u32) -> Result<Generation, String> {
        let request: Value = serde_json::from_slice(body)
            .map_err(|e| format!("We could not parse the JSON body of your request: {e}"))?;
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .ok_or("you must provide a model parameter")?;
        let messages = request
            .get("messages")
            .and_then(Value::as_array)
            .filter(|m| !m.is_empty())
            .ok_or("'messages' must be a non-empty array")?;
        let mut conversation = Conversation::default();
        for message in messages {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .ok_or("every message needs a 'role'")?;
            conversation.push(
                role,
                text_of(message.get("content").unwrap_or(&Value::Null)),
            );
        }
        let stream = request
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let include_usage = stream
            && request
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false);
        let cap = request
            .get("max_completion_tokens")
            .or_else(|| request.get("max_tokens"))
            .and_then(Value::as_u64);
        Ok(Generation::new(
            model,
            &conversation,
            wanted,
            cap,
            stream,
            include_usage,
        ))
    }

    fn message(g: &Generation, meta: &Meta) -> Value {
        json!({
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": g.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": g.text(),
                    "refusal": null,
                    "annotations": [],
                },
                "logprobs": null,
                "finish_reason": Self::finish_reason(g),
            }],
            "usage": Self::usage(g),
            "service_tier": "default",
        })
    }

    fn stream_start(g: &Generation, meta: &Meta) -> String {
        Self::delta(
            g,
            meta,
            json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        )
    }

    fn stream_token(g: &Generation, meta: &Meta, token: &str) -> String {
        Self::delta(g, meta, json!({"content": token}), None)
    }

    fn stream_end(g: &Generation, meta: &Meta) -> String {
        let mut out = Self::delta(g, meta, json!({}), Some(Self::finish_reason(g)));
        if g.include_usage {
            let mut chunk = Self::chunk(g, meta, json!([]));
            chunk["usage"] = Self::usage(g);
            out.push_str(&sse(None, &chunk));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}
