//! What differs between providers: request parsing, response and event
//! shapes, error bodies. One implementation per API ([`crate::openai`],
//! [`crate::anthropic`], [`crate::responses`]); the pacing, counting and failure injection in
//! [`crate::respond`] are shared.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::content::Conversation;

/// Provider error categories the simulator produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// 400: malformed or rejected request.
    InvalidRequest,
    /// 404: unknown path.
    NotFound,
    /// 429: rate limit.
    RateLimit,
    /// 500: internal failure.
    Server,
    /// 503: overloaded or shutting down.
    Overloaded,
}

/// One generation, decided before any work starts.
#[derive(Clone, Debug)]
pub(crate) struct Generation {
    /// The model the request named, echoed back.
    pub(crate) model: String,
    /// The output, one entry per token (concatenation = full text).
    pub(crate) tokens: Vec<String>,
    pub(crate) prompt_tokens: u64,
    /// The output was cut by the request's `max_tokens`.
    pub(crate) truncated: bool,
    pub(crate) stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub(crate) include_usage: bool,
}

impl Generation {
    /// `wanted` tokens, capped by the request's own limit when it has one.
    pub(crate) fn new(
        model: &str,
        conversation: &Conversation,
        wanted: u32,
        cap: Option<u64>,
        stream: bool,
        include_usage: bool,
    ) -> Self {
        let (n, truncated) = match cap {
            Some(cap) if cap < u64::from(wanted) => (u32::try_from(cap).unwrap_or(wanted), true),
            _ => (wanted, false),
        };
        Self {
            model: model.to_owned(),
            tokens: conversation.tokens(n),
            prompt_tokens: conversation.prompt_tokens(),
            truncated,
            stream,
            include_usage,
        }
    }

    pub(crate) fn text(&self) -> String {
        self.tokens.concat()
    }

    pub(crate) fn completion_tokens(&self) -> u64 {
        self.tokens.len() as u64
    }
}

/// What makes one execution distinguishable from another of the same
/// request.
#[derive(Debug)]
pub(crate) struct Meta {
    /// Unique per execution for the life of the process.
    pub(crate) id: String,
    /// Unix seconds at which the execution started.
    pub(crate) created: u64,
    /// The next event's `sequence_number` (APIs that number their events).
    sequence: AtomicU64,
}

impl Meta {
    pub(crate) fn new(id: String) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            id,
            created,
            sequence: AtomicU64::new(0),
        }
    }

    /// The `sequence_number` of the next event: 0, 1, 2, …
    pub(crate) fn next_sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }
}

/// One provider API.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The JSON error body for `kind`.
    fn error_body(kind: ErrorKind, message: &str) -> Value;
    /// The response id of execution number `sequence`.
    fn response_id(sequence: u64) -> String;
    /// Reads the request body; the error is a message for a 400.
    fn parse(body: &[u8], wanted: u32) -> Result<Generation, String>;
    /// The non-streaming response body.
    fn message(g: &Generation, meta: &Meta) -> Value;
    /// SSE bytes sent before the first token.
    fn stream_start(g: &Generation, meta: &Meta) -> String;
    /// SSE bytes of one token.
    fn stream_token(g: &Generation, meta: &Meta, token: &str) -> String;
    /// SSE bytes after the last token, through the end-of-stream marker.
    fn stream_end(g: &Generation, meta: &Meta) -> String;
    /// The `event:` name of an error event in a 200 stream, if the API
    /// names it.
    const STREAM_ERROR_EVENT: Option<&'static str>;
    /// SSE bytes of an error event in a 200 stream (the provider failed
    /// after it had started answering).
    fn stream_error(_meta: &Meta, message: &str) -> String {
        sse(
            Self::STREAM_ERROR_EVENT,
            &Self::error_body(ErrorKind::Overloaded, message),
        )
    }
}

/// `data: JSON\n\n`, optionally preceded by `event: NAME`.
pub(crate) fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}
