//! What one protected route does: where its key comes from, what a duplicate
//! of an in-flight request gets, which upstream outcomes count as final.
//!
//! One [`LayerConfig`] per route (namespace). The defaults are the safe ones
//! for a handler with side effects: a key is required, POST is protected,
//! a store outage refuses the request rather than running it unprotected.
//!
//! The modes are the one vocabulary of route behaviour: the gateway's
//! configuration holds these types as they are, so a mode is named once.
//! They are serde types (`snake_case` names: `require`, `fail_open`, …) and
//! `#[non_exhaustive]`, so a new mode is not a breaking change. A key part
//! is written as text (`tenant`, `body`, `header:NAME`), the same spelling a
//! gateway configuration file uses.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method};
use serde::{Deserialize, Serialize};

/// What a duplicate of an in-flight request gets: the engine's concept,
/// used as it is.
pub use idemgate_engine::OnInflight;

/// The request header that carries the key, unless a route names another
/// ([`LayerConfig::key_header`]).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Where the idempotency key of a request comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyMode {
    /// The `Idempotency-Key` header is required; a request without it is
    /// refused with 400.
    Require,
    /// The header is used when present; a request without it is passed
    /// through unprotected (never merged with another by content).
    Optional,
    /// The key is built from natural dimensions of the request; the
    /// `Idempotency-Key` header, when present, still wins.
    Derive(DeriveTemplate),
}

/// One dimension of a derived key.
///
/// Written as text ([`FromStr`] and [`fmt::Display`], and so in serde):
/// `tenant`, `body` or `header:NAME`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[non_exhaustive]
pub enum DerivePart {
    /// The caller's tenant (hash of its credential).
    Tenant,
    /// The value of a request header; a request without it is refused (400).
    Header(HeaderName),
    /// A hash of the canonical JSON body (ignored pointers removed).
    BodyHash,
}

/// Why a text is not a [`DerivePart`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DerivePartError {
    /// Neither `tenant`, `body` nor `header:NAME`.
    #[error("`{0}`: expected `tenant`, `body` or `header:NAME`")]
    Unknown(String),
    /// `header:NAME` with a NAME that is not a header name.
    #[error("`{0}` is not a header name")]
    BadHeader(String),
}

impl FromStr for DerivePart {
    type Err = DerivePartError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "tenant" => Ok(Self::Tenant),
            "body" => Ok(Self::BodyHash),
            other => match other.strip_prefix("header:") {
                Some(h) => {
                    let h = h.trim();
                    HeaderName::from_bytes(h.as_bytes())
                        .map(Self::Header)
                        .map_err(|_| DerivePartError::BadHeader(h.to_owned()))
                }
                None => Err(DerivePartError::Unknown(other.to_owned())),
            },
        }
    }
}

impl TryFrom<String> for DerivePart {
    type Error = DerivePartError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for DerivePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tenant => f.write_str("tenant"),
            Self::Header(h) => write!(f, "header:{h}"),
            Self::BodyHash => f.write_str("body"),
        }
    }
}

impl From<DerivePart> for String {
    fn from(p: DerivePart) -> Self {
        p.to_string()
    }
}

/// How to build a key from a request when the client sent none.
///
/// The default identifies who asked, in which session, what, and when:
/// tenant + `x-user-id` + `x-session-id` + body hash + a ten-minute window.
/// A template made of [`DerivePart::BodyHash`] alone would merge two
/// identical questions from different users, and one without a window would
/// merge the same question asked again tomorrow;
/// [`DeriveTemplate::warnings`] says so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeriveTemplate {
    /// The dimensions, in order.
    pub parts: Vec<DerivePart>,
    /// Requests in the same window (of this length, aligned to the Unix
    /// epoch) with the same dimensions share a key; `None` means forever.
    #[serde(default)]
    pub window: Option<Duration>,
}

impl Default for DeriveTemplate {
    fn default() -> Self {
        Self {
            parts: vec![
                DerivePart::Tenant,
                DerivePart::Header(HeaderName::from_static("x-user-id")),
                DerivePart::Header(HeaderName::from_static("x-session-id")),
                DerivePart::BodyHash,
            ],
            window: Some(Duration::from_secs(600)),
        }
    }
}

impl DeriveTemplate {
    /// Whether the template identifies requests by content alone (no tenant
    /// and no header dimension): two users asking the same question would
    /// share a result.
    pub fn is_content_only(&self) -> bool {
        !self
            .parts
            .iter()
            .any(|p| matches!(p, DerivePart::Tenant | DerivePart::Header(_)))
    }

    /// Human-readable problems with the template (empty when it is sound).
    pub fn warnings(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.parts.is_empty() {
            out.push("the template has no dimensions: every request would share one key");
        } else if self.is_content_only() {
            out.push("the key depends on the content alone: identical requests of different users or sessions would be merged");
        }
        if self.window.is_none() {
            out.push("the template has no time window: the same request repeated much later would be merged with the first");
        }
        out
    }
}

/// Whose records a request may see: the tenant is a hash of the first
/// header of the source that the request carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TenantSource {
    /// The credential headers of the common LLM APIs, in this order:
    /// `Authorization` (OpenAI and most others), `x-api-key` (Anthropic),
    /// `api-key` (Azure OpenAI), `x-goog-api-key` (Gemini).
    Credential,
    /// These headers, in order; the first one present names the tenant.
    Headers(#[serde(with = "header_names")] Vec<HeaderName>),
}

/// The headers of [`TenantSource::Credential`], in order.
pub static CREDENTIAL_HEADERS: [HeaderName; 4] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-goog-api-key"),
];

impl TenantSource {
    /// The headers looked at, in order.
    pub fn headers(&self) -> &[HeaderName] {
        match self {
            Self::Credential => &CREDENTIAL_HEADERS,
            Self::Headers(names) => names,
        }
    }
}

/// Serde for a list of [`HeaderName`]s: their (lowercase) text.
mod header_names {
    use http::HeaderName;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(names: &[HeaderName], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(names.iter().map(HeaderName::as_str))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<HeaderName>, D::Error> {
        Vec::<String>::deserialize(d)?
            .into_iter()
            .map(|text| {
                HeaderName::from_bytes(text.as_bytes())
                    .map_err(|_| D::Error::custom(format!("`{text}` is not a header name")))
            })
            .collect()
    }
}

/// How a 200 event stream says it succeeded or failed: which events are
/// errors and which one ends a complete answer. A stream that carries an
/// error event, or ends without its terminal event, is a failure: the key
/// is released, the stream is never stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StreamDialect {
    /// OpenAI Chat Completions and Completions (and compatible APIs): an
    /// event whose data is a JSON object with an `error` member fails;
    /// `data: [DONE]` ends the answer.
    Openai,
    /// Anthropic Messages: `event: error` (or data of `"type": "error"`)
    /// fails; `message_stop` ends the answer.
    Anthropic,
    /// OpenAI Responses: `response.failed` or `error` fails;
    /// `response.completed` or `response.incomplete` ends the answer.
    OpenaiResponses,
    /// No dialect: a stream is judged by its status alone.
    None,
}

impl StreamDialect {
    /// The dialect of an API path: `…/chat/completions` and `…/completions`
    /// are OpenAI, `…/messages` Anthropic, `…/responses` OpenAI Responses,
    /// anything else none.
    pub fn of_path(path: &str) -> Self {
        let path = path.trim_end_matches('/');
        if path.ends_with("/completions") {
            Self::Openai
        } else if path.ends_with("/messages") {
            Self::Anthropic
        } else if path.ends_with("/responses") {
            Self::OpenaiResponses
        } else {
            Self::None
        }
    }
}

/// What to do when the store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StoreErrorMode {
    /// 503; nothing is forwarded. Right for anything with side effects.
    FailClosed,
    /// Forward the request unprotected and count it. Right where
    /// availability matters more than a possible duplicate.
    FailOpen,
}

/// When a detached execution's `completion_timeout` starts counting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompletionClock {
    /// When the inner service is called. Right for a handler that does its
    /// work at once.
    #[default]
    Call,
    /// When the inner service reports, through the
    /// [`SendSignal`](crate::SendSignal) request extension, that it sent the
    /// request on. Right for a proxy that may first wait for a concurrency
    /// slot: time in its queue never eats the upstream's budget. If the
    /// signal is dropped unfired (nothing was sent), the clock starts then.
    Sent,
}

/// What a failure *after* the request was sent (marked
/// [`OutcomeUnknown`](crate::OutcomeUnknown) by the inner service) does to
/// the key: the work may have run, so a retry may repeat it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutcomeUnknownMode {
    /// Release the key: the retry runs again (counted as outcome unknown).
    #[default]
    Release,
    /// Store an `outcome-unknown` problem as the key's final answer; every
    /// retry replays it until an operator forgets the key. For routes that
    /// charge.
    Store,
}

/// Configuration of one protected route.
#[derive(Clone, Debug)]
pub struct LayerConfig {
    /// Route id: part of the scoped key, so two routes never share records.
    pub namespace: String,
    /// Where the key comes from.
    pub key_mode: KeyMode,
    /// What a duplicate of an in-flight request gets.
    pub on_inflight: OnInflight,
    /// Methods that are protected; others pass through untouched.
    pub methods: Vec<Method>,
    /// Largest accepted request body, in bytes (413 beyond).
    pub body_limit: usize,
    /// Where the tenant comes from.
    pub tenant: TenantSource,
    /// JSON pointers removed from the body before fingerprinting (fields a
    /// client legitimately changes between retries, e.g. a send time).
    pub fingerprint_ignore: Vec<String>,
    /// Response statuses that release the key instead of storing the
    /// response, so a retry runs again.
    pub retryable_statuses: Vec<u16>,
    /// Response headers kept for replay (`content-type` and
    /// `content-encoding` are always kept).
    pub stored_headers: Vec<HeaderName>,
    /// What to do when the store fails.
    pub on_store_error: StoreErrorMode,
    /// Longest a detached execution may take (the route's total timeout);
    /// past it the key is released.
    pub completion_timeout: Duration,
    /// When `completion_timeout` starts counting.
    pub completion_clock: CompletionClock,
    /// What a failure after the request was sent does to the key.
    pub on_outcome_unknown: OutcomeUnknownMode,
    /// Largest response body (or event stream) that is stored; a bigger
    /// one is passed to the client but not stored, and the key released.
    pub max_stored_body: usize,
    /// Path prefix of operation resources (`Prefer: respond-async`).
    pub operations_path: String,
    /// How event streams on this route end and fail; `None`: recognised
    /// from each request's path ([`StreamDialect::of_path`]).
    pub stream_dialect: Option<StreamDialect>,
    /// The request header the client's key is read from (default
    /// `Idempotency-Key`; e.g. `x-idempotency-key` for clients or proxies
    /// that only pass prefixed headers).
    pub key_header: HeaderName,
    /// Whether the response body (or event stream) is stored (default
    /// true). `false` keeps status and headers only: a retry learns the
    /// operation ran, and gets an empty body.
    pub store_body: bool,
}

impl Default for LayerConfig {
    fn default() -> Self {
        Self {
            namespace: "default".to_owned(),
            key_mode: KeyMode::Require,
            on_inflight: OnInflight::default(),
            methods: vec![Method::POST],
            body_limit: 10 * 1024 * 1024,
            tenant: TenantSource::Credential,
            fingerprint_ignore: Vec::new(),
            retryable_statuses: default_retryable_statuses(),
            stored_headers: Vec::new(),
            on_store_error: StoreErrorMode::FailClosed,
            completion_timeout: Duration::from_secs(600),
            completion_clock: CompletionClock::Call,
            on_outcome_unknown: OutcomeUnknownMode::Release,
            max_stored_body: 32 * 1024 * 1024,
            operations_path: "/idemgate/operations/".to_owned(),
            stream_dialect: None,
            key_header: IDEMPOTENCY_KEY,
            store_body: true,
        }
    }
}

/// 408, 429 and every 5xx.
pub fn default_retryable_statuses() -> Vec<u16> {
    let mut v = vec![408, 429];
    v.extend(500..=599);
    v
}

impl LayerConfig {
    /// The default configuration for `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            ..Self::default()
        }
    }

    /// Whether a response with `status` releases the key (not stored).
    pub fn is_retryable(&self, status: u16) -> bool {
        self.retryable_statuses.contains(&status)
    }

    /// The stream dialect of a request to `path`.
    pub fn stream_dialect_of(&self, path: &str) -> StreamDialect {
        self.stream_dialect
            .unwrap_or_else(|| StreamDialect::of_path(path))
    }

    /// Whether requests with `method` are protected.
    pub fn protects(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

#[cfg(test)]
mod tests;
