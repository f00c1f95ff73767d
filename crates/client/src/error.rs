//! Errors, and the failed responses they carry.

use std::fmt;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap};

use crate::attempt::{ClientAttempt, GiveUpReason};
use crate::key::{IdempotencyKey, InvalidKey};
use crate::sse::MAX_EVENT_BYTES;

/// Most bytes of a failed response's body the client reads: past them it
/// stops reading and drops the connection, and the response is marked
/// [`ErrorResponse::truncated`]. 64 KiB: a problem or an LLM API's error
/// object is a few hundred bytes, and a server that sends megabytes with a
/// 4xx or 5xx is not sending anything the caller needs in memory.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// The `type` slug of the gateway's 422: the key was used for another
/// request.
pub const KEY_MISMATCH: &str = "key-mismatch";

/// Everything that can go wrong with one operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 422: the key was already used for a different request (method, path
    /// or body). Final: a retry must resend the same request, and a new
    /// operation needs a new key.
    #[error(
        "idempotency key `{}` was already used for a different request (422 key-mismatch): \
         a retry must resend the same method, path and body, and a new operation needs a new key",
        .0.key
    )]
    KeyReused(Box<Rejected>),
    /// A final answer that is not a success: a 4xx other than 408, 409 and
    /// 429, or any status the server marked `x-should-retry: false`.
    #[error("{0}")]
    Rejected(Box<Rejected>),
    /// The retries ran out (attempts or deadline).
    #[error("{0}")]
    GaveUp(Box<GaveUp>),
    /// A broken stream could not be continued where it broke; the events
    /// delivered so far are all the caller will get from this stream.
    #[error(
        "the stream of idempotency key `{key}` cannot be continued after {delivered} events: {reason}"
    )]
    StreamRestarted {
        /// The operation's key.
        key: IdempotencyKey,
        /// Events the caller received.
        delivered: u64,
        /// Why it cannot go on.
        reason: RestartReason,
    },
    /// The stream ended in the gateway's `outcome-unknown` event: it broke
    /// upstream after the request was sent, on a route that charges, so
    /// the upstream may have run and billed the whole generation. The
    /// events delivered are the operation's whole answer: the gateway
    /// stored them (and this event) as the key's answer, so sending the
    /// request again with the same key gets the same partial stream, never
    /// a second generation. A new generation needs a new key.
    #[error(
        "the stream of idempotency key `{key}` broke upstream after {delivered} events and its outcome is unknown: {message}"
    )]
    OutcomeUnknown {
        /// The operation's key.
        key: IdempotencyKey,
        /// Events the caller received (the terminal event not counted).
        delivered: u64,
        /// Tokens the broken stream carried, as the gateway counted them
        /// (`None` on a route without a stream dialect).
        tokens: Option<u64>,
        /// The gateway's message.
        message: String,
    },
    /// A success response to a stream request that is not an event stream.
    #[error(
        "expected an event stream for idempotency key `{key}`, got content type `{content_type}`"
    )]
    NotAStream {
        /// The operation's key.
        key: IdempotencyKey,
        /// The response's `Content-Type` (empty if none).
        content_type: String,
    },
    /// One event of a stream outgrew the parser's limit.
    #[error("an event of the stream of idempotency key `{key}` exceeds {MAX_EVENT_BYTES} bytes")]
    EventTooLarge {
        /// The operation's key.
        key: IdempotencyKey,
    },
    /// The caller's natural key is not a valid key.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] InvalidKey),
    /// The base URL or path does not make a valid URL.
    #[error("invalid URL `{url}`: {reason}")]
    Url {
        /// The text that failed.
        url: String,
        /// Why.
        reason: String,
    },
    /// A header name or value the caller gave is invalid.
    #[error("invalid header `{name}`: {reason}")]
    Header {
        /// The header's name (never its value, which may be a credential).
        name: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built, or the request could not be
    /// built from its parts.
    #[error("the HTTP request could not be built: {0}")]
    Build(#[source] reqwest::Error),
    /// A body could not be serialized, or a response body is not the JSON
    /// expected.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A response body is not UTF-8 text.
    #[error("the response body is not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
}

impl Error {
    /// The key of the operation the error belongs to, if it got that far.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::KeyReused(r) | Self::Rejected(r) => Some(&r.key),
            Self::GaveUp(g) => Some(&g.key),
            Self::StreamRestarted { key, .. }
            | Self::OutcomeUnknown { key, .. }
            | Self::NotAStream { key, .. }
            | Self::EventTooLarge { key } => Some(key),
            _ => None,
        }
    }

    /// The attempts made before the error (empty for errors raised before
    /// any attempt, or while reading a stream).
    pub fn attempts(&self) -> &[ClientAttempt] {
        match self {
            Self::KeyReused(r) | Self::Rejected(r) => &r.attempts,
            Self::GaveUp(g) => &g.attempts,
            _ => &[],
        }
    }

    /// The failed response, for errors that carry one.
    pub fn response(&self) -> Option<&ErrorResponse> {
        match self {
            Self::KeyReused(r) | Self::Rejected(r) => Some(&r.response),
            Self::GaveUp(g) => g.last_response.as_ref(),
            _ => None,
        }
    }
}

/// Why a stream cannot be continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestartReason {
    /// The resumed request started a new execution
    /// (`Idempotent-Replayed: false`): the one the caller was reading broke
    /// upstream and the gateway released its key. Its events are not the
    /// continuation of the events delivered, so they are not stitched on.
    /// The new execution runs on: sending the request again with the same
    /// key gets its whole stream, without a third execution.
    NewExecution,
    /// The stream's events carry no ids (or none that can be sent back as
    /// a header), so there is nothing to resume after.
    NoEventIds,
    /// The gateway answered the resumption with another execution's
    /// stream, whole (`Idempotent-Stream-Restarted: true`): the one the
    /// caller was reading broke, its key was released, and another request
    /// ran it again. Its events are not the continuation of the events
    /// delivered, so they are not stitched on; sending the request again
    /// with the same key gets that execution's whole stream.
    OtherExecution,
}

impl fmt::Display for RestartReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NewExecution => f.write_str(
                "the resumed request started a new execution (the previous one broke and its key \
                 was released); send the request again with the same key to receive the new \
                 execution's stream from its first event",
            ),
            Self::NoEventIds => f.write_str("its events carry no ids to resume after"),
            Self::OtherExecution => f.write_str(
                "the stream resumed belongs to another execution (the one read broke and its key \
                 was released); send the request again with the same key to receive that \
                 execution's stream from its first event",
            ),
        }
    }
}

/// A final non-success answer.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejected {
    /// The operation's key.
    pub key: IdempotencyKey,
    /// The response.
    pub response: ErrorResponse,
    /// Every attempt, the final one last.
    pub attempts: Vec<ClientAttempt>,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request with idempotency key `{}` got {} (final, not retried",
            self.key, self.response.status
        )?;
        if self.response.should_retry == Some(false) {
            f.write_str(": the server said x-should-retry: false")?;
        }
        f.write_str(")")?;
        self.response.describe(f)
    }
}

/// The retries ran out.
#[derive(Debug)]
#[non_exhaustive]
pub struct GaveUp {
    /// The operation's key: sending the request again with it later still
    /// gets the same operation (its stored result, if it completed).
    pub key: IdempotencyKey,
    /// Why the client stopped.
    pub reason: GiveUpReason,
    /// Every attempt, the last one last.
    pub attempts: Vec<ClientAttempt>,
    /// The last attempt's response, if it got one.
    pub last_response: Option<ErrorResponse>,
    /// The last attempt's transport error, if it ended in one.
    pub last_error: Option<reqwest::Error>,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up on idempotency key `{}` after {} attempts ({})",
            self.key,
            self.attempts.len(),
            self.reason
        )?;
        if let Some(last) = self.attempts.last() {
            write!(f, "; last: {}", last.end)?;
        }
        if let Some(r) = &self.last_response {
            r.describe(f)?;
        }
        Ok(())
    }
}

impl std::error::Error for GaveUp {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last_error
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl std::error::Error for Rejected {}

/// A response that was not a success, its body read up to
/// [`MAX_ERROR_BODY`] bytes.
///
/// A redirect (3xx) is one of these too: the client follows no redirects,
/// since following one would send the body and the credential headers
/// (`x-api-key`, `api-key`, … which `reqwest` keeps across hosts) to
/// wherever the `Location` points. Its `Location` is in
/// [`ErrorResponse::headers`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ErrorResponse {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, at most [`MAX_ERROR_BODY`] bytes.
    pub body: Bytes,
    /// The body went on past [`MAX_ERROR_BODY`]: `body` is its start, and
    /// the rest was never read.
    pub truncated: bool,
    /// The body as an RFC 9457 problem, if it is one.
    pub problem: Option<ProblemDetails>,
    /// What `x-should-retry` said, if anything.
    pub should_retry: Option<bool>,
    /// `Idempotent-Replayed: true`: a stored final answer (the gateway
    /// stores final 4xx answers and replays them).
    pub replayed: bool,
}

impl ErrorResponse {
    pub(crate) fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        truncated: bool,
    ) -> Self {
        let problem = ProblemDetails::parse(&headers, &body);
        let should_retry = crate::policy::should_retry(&headers);
        let replayed = crate::headers::replayed(&headers);
        Self {
            status,
            headers,
            body,
            truncated,
            problem,
            should_retry,
            replayed,
        }
    }

    /// `: detail` from the problem, or the start of the body; where a
    /// redirect pointed.
    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.status.is_redirection() {
            f.write_str(": redirects are not followed")?;
            if let Some(to) = self
                .headers
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
            {
                write!(f, " (Location: {to})")?;
            }
        }
        if let Some(p) = &self.problem {
            write!(f, ": {}", p.type_uri)?;
            if let Some(d) = p.detail.as_deref().or(p.title.as_deref()) {
                write!(f, ": {d}")?;
            }
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        if text.is_empty() {
            return Ok(());
        }
        const MAX: usize = 200;
        match text.char_indices().nth(MAX) {
            Some((cut, _)) => write!(f, ": {}…", &text[..cut]),
            None => write!(f, ": {text}"),
        }
    }
}

/// An RFC 9457 problem body (`application/problem+json`), as the gateway
/// sends for its own refusals.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProblemDetails {
    /// The `type` URI, e.g. `https://idemgate.dev/problems/in-flight`.
    pub type_uri: String,
    /// The `title`.
    pub title: Option<String>,
    /// The `detail`.
    pub detail: Option<String>,
}

impl ProblemDetails {
    /// The last path segment of the type URI (`in-flight`,
    /// `key-mismatch`, …).
    pub fn slug(&self) -> &str {
        self.type_uri
            .rsplit('/')
            .next()
            .unwrap_or(self.type_uri.as_str())
    }

    /// The problem in a JSON body, if the body is a problem.
    pub(crate) fn parse(headers: &HeaderMap, body: &[u8]) -> Option<Self> {
        let json = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.contains("json"));
        if !json {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        Some(Self {
            type_uri: text("type")?,
            title: text("title"),
            detail: text("detail"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn problems_are_read_from_json_bodies() {
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let body = br#"{"type":"https://idemgate.dev/problems/key-mismatch","title":"Idempotency key reused","status":422,"detail":"used with a different request"}"#;
        let p = ProblemDetails::parse(&h, body).unwrap();
        assert_eq!(p.slug(), KEY_MISMATCH);
        assert_eq!(p.detail.as_deref(), Some("used with a different request"));
        assert_eq!(ProblemDetails::parse(&h, b"not json"), None);
        assert_eq!(ProblemDetails::parse(&HeaderMap::new(), body), None);
    }

    #[test]
    fn errors_stay_small() {
        assert!(
            std::mem::size_of::<Error>() <= 64,
            "{}",
            std::mem::size_of::<Error>()
        );
    }
}
