//! OpenAI Responses (`POST /v1/responses`).
//!
//! Streaming follows the provider's semantic events, each named on its
//! `event:` line, repeating the name in `type` and numbered by
//! `sequence_number`: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per token, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, and the
//! terminal `response.completed` (or `response.incomplete` when
//! `max_output_tokens` cut the output). There is no `data: [DONE]`. A
//! failure after the 200 is a `response.failed` event whose response
//! carries the `error`.

use serde_json::{Value, json};

use crate::content::{Conversation, text_of};
use crate::dialect::{Dialect, ErrorKind, Generation, Meta, sse};
use crate::openai::OpenAi;

/// The Responses dialect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Responses;

impl Responses {
    /// The id of the one output message of execution `meta`.
    fn item_id(meta: &Meta) -> String {
        format!("msg_{}", meta.id.trim_start_matches("resp_"))
    }

    fn usage(g: &Generation) -> Value {
        json!({
            "input_tokens": g.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": g.completion_tokens(),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": g.prompt_tokens + g.completion_tokens(),
        })
    }

    fn part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    fn item(meta: &Meta, status: &str, content: Value) -> Value {
        json!({
            "id": Self::item_id(meta),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// The response object in state `status`, with `output` and `usage`
    /// once there are any.
    fn response(g: &Generation, meta: &Meta, status: &str, output: Value, usage: Value) -> Value {
        let incomplete = if status == "incomplete" {
            json!({"reason": "max_output_tokens"})
        } else {
            Value::Null
        };
        json!({
            "id": meta.id,
            "object": "response",
            "created_at": meta.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": g.model,
            "output": output,
            "usage": usage,
        })
    }

    fn final_status(g: &Generation) -> &'static str {
        if g.truncated {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// One named, numbered event: `fields` plus `type` and
    /// `sequence_number`.
    fn event(meta: &Meta, name: &str, fields: Value) -> String {
        let mut data = fields;
        data["type"] = json!(name);
        data["sequence_number"] = json!(meta.next_sequence());
        sse(Some(name), &data)
    }
}

impl Dialect for Responses {
    const STREAM_ERROR_EVENT: Option<&'static str> = Some("response.failed");

    fn error_body(kind: ErrorKind, message: &str) -> Value {
        OpenAi::error_body(kind, message)
    }

    fn response_id(sequence: u64) -> String {
        format!("resp_sim{sequence:017}")
    }

    fn parse(body: &[u8], wanted: u32) -> Result<Generation, String> {
        let request: Value = serde_json::from_slice(body)
            .map_err(|e| format!("We could not parse the JSON body of your request: {e}"))?;
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .ok_or("Missing required parameter: 'model'.")?;
        let mut conversation = Conversation::default();
        if let Some(instructions) = request.get("instructions").and_then(Value::as_str) {
            conversation.push("system", instructions.to_owned());
        }
        match request.get("input") {
            Some(Value::String(text)) => conversation.push("user", text.clone()),
            Some(Value::Array(items)) if !items.is_empty() => {
                for item in items {
                    let role = item
                        .get("role")
                        .and_then(Value::as_str)
                        .ok_or("Invalid 'input': every item needs a 'role'.")?;
                    conversation.push(role, text_of(item.get("content").unwrap_or(&Value::Null)));
                }
            }
            _ => return Err("Missing required parameter: 'input'.".to_owned()),
        }
        let stream = request
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let cap = request.get("max_output_tokens").and_then(Value::as_u64);
        Ok(Generation::new(
            model,
            &conversation,
            wanted,
            cap,
            stream,
            false,
        ))
    }

    fn message(g: &Generation, meta: &Meta) -> Value {
        let output = json!([Self::item(
            meta,
            "completed",
            json!([Self::part(&g.text())])
        )]);
        Self::response(g, meta, Self::final_status(g), output, Self::usage(g))
    }

    fn stream_start(g: &Generation, meta: &Meta) -> String {
        let started = Self::response(g, meta, "in_progress", json!([]), Value::Null);
        let item = Self::item(meta, "in_progress", json!([]));
        let mut out = Self::event(meta, "response.created", json!({"response": started}));
        out.push_str(&Self::event(
            meta,
            "response.in_progress",
            json!({"response": started}),
        ));
        out.push_str(&Self::event(
            meta,
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ));
        out.push_str(&Self::event(
            meta,
            "response.content_part.added",
            json!({
                "item_id": Self::item_id(meta),
                "output_index": 0,
                "content_index": 0,
                "part": Self::part(""),
            }),
        ));
        out
    }

    fn stream_token(_g: &Generation, meta: &Meta, token: &str) -> String {
        Self::event(
            meta,
            "response.output_text.delta",
            json!({
                "item_id": Self::item_id(meta),
                "output_index": 0,
                "content_index": 0,
                "delta": token,
            }),
        )
    }

    fn stream_end(g: &Generation, meta: &Meta) -> String {
        let text = g.text();
        let item = Self::item(meta, "completed", json!([Self::part(&text)]));
        let mut out = Self::event(
            meta,
            "response.output_text.done",
            json!({
                "item_id": Self::item_id(meta),
                "output_index": 0,
                "content_index": 0,
                "text": text,
            }),
        );
        out.push_str(&Self::event(
            meta,
            "response.content_part.done",
            json!({
                "item_id": Self::item_id(meta),
                "output_index": 0,
                "content_index": 0,
                "part": Self::part(&text),
            }),
        ));
        out.push_str(&Self::event(
            meta,
            "response.output_item.done",
            json!({"output_index": 0, "item": item.clone()}),
        ));
        let status = Self::final_status(g);
        let done = Self::response(g, meta, status, json!([item]), Self::usage(g));
        out.push_str(&Self::event(
            meta,
            &format!("response.{status}"),
            json!({"response": done}),
        ));
        out
    }

    fn stream_error(meta: &Meta, message: &str) -> String {
        let failed = json!({
            "id": meta.id,
            "object": "response",
            "created_at": meta.created,
            "status": "failed",
            "error": {"code": "server_error", "message": message},
            "incomplete_details": null,
            "output": [],
            "usage": null,
        });
        Self::event(meta, "response.failed", json!({"response": failed}))
    }
}
