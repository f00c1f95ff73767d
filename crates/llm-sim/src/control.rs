//! Configuration and per-request control headers.
//!
//! Everything a test needs to shape one request travels in `x-sim-*`
//! headers, so that a gateway in between forwards it untouched and one
//! simulator serves many differently-behaving requests at once.

use std::time::Duration;

use axum::http::HeaderMap;

use crate::stats::Caller;

/// Pacing of the simulated model. Per-request headers override each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Time to produce a whole non-streaming response (`x-sim-latency-ms`).
    pub latency: Duration,
    /// Time to the first streamed token, and to an injected error status
    /// (`x-sim-first-token-ms`).
    pub first_token_delay: Duration,
    /// Time between streamed tokens (`x-sim-token-interval-ms`).
    pub token_interval: Duration,
    /// Tokens generated per response, before any `max_tokens` cap
    /// (`x-sim-tokens`).
    pub completion_tokens: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(200),
            first_token_delay: Duration::from_millis(100),
            token_interval: Duration::from_millis(5),
            completion_tokens: 24,
        }
    }
}

/// Header: override [`SimConfig::latency`], in milliseconds.
pub const LATENCY_HEADER: &str = "x-sim-latency-ms";
/// Header: override [`SimConfig::first_token_delay`], in milliseconds.
pub const FIRST_TOKEN_HEADER: &str = "x-sim-first-token-ms";
/// Header: override [`SimConfig::token_interval`], in milliseconds.
pub const TOKEN_INTERVAL_HEADER: &str = "x-sim-token-interval-ms";
/// Header: override [`SimConfig::completion_tokens`].
pub const TOKENS_HEADER: &str = "x-sim-tokens";
/// Header: a name for the request, kept in its [`Execution`](crate::Execution)
/// log entry.
pub const TAG_HEADER: &str = "x-sim-tag";
/// Header: inject a failure (values in the crate docs, "Failure injection").
pub const FAIL_HEADER: &str = "x-sim-fail";

/// An injected failure, from the `x-sim-fail` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// `400`: the provider rejects the request as invalid. Not an execution.
    BadRequest,
    /// `429`: rate limited, with `retry-after: 1`. Rejected before the
    /// model, not an execution.
    RateLimited,
    /// `500` / `503`: the provider failed after accepting the request. An
    /// execution: whether any work happened is exactly what a client cannot
    /// know.
    ServerError(u16),
    /// `reset-after:N`: N tokens, then the connection breaks.
    ResetAfter(u32),
    /// `stall-after:N`: N tokens, then silence on an open connection.
    StallAfter(u32),
    /// `hang`: the request is accepted and the response headers never come.
    Hang,
    /// `error-after:N`: a 200 stream of N tokens, then the dialect's error
    /// event and a clean end.
    ErrorAfter(u32),
    /// `end-after:N`: a 200 stream of N tokens that ends cleanly without
    /// its terminal event.
    EndAfter(u32),
    /// `close`: the request is read, then the connection is closed with no
    /// response at all.
    Close,
}

impl Fault {
    fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        match value {
            "400" => return Some(Self::BadRequest),
            "429" => return Some(Self::RateLimited),
            "500" => return Some(Self::ServerError(500)),
            "503" => return Some(Self::ServerError(503)),
            "hang" => return Some(Self::Hang),
            "close" => return Some(Self::Close),
            _ => {}
        }
        if let Some(n) = value.strip_prefix("reset-after:") {
            return n.trim().parse().ok().map(Self::ResetAfter);
        }
        if let Some(n) = value.strip_prefix("stall-after:") {
            return n.trim().parse().ok().map(Self::StallAfter);
        }
        if let Some(n) = value.strip_prefix("error-after:") {
            return n.trim().parse().ok().map(Self::ErrorAfter);
        }
        if let Some(n) = value.strip_prefix("end-after:") {
            return n.trim().parse().ok().map(Self::EndAfter);
        }
        None
    }
}

/// The effective behaviour of one request: config plus header overrides.
#[derive(Clone, Debug)]
pub(crate) struct Control {
    pub(crate) latency: Duration,
    pub(crate) first_token_delay: Duration,
    pub(crate) token_interval: Duration,
    pub(crate) completion_tokens: u32,
    pub(crate) fault: Option<Fault>,
    /// Who executions are counted and logged for: the idempotency key
    /// ("" if none) and the credential; the body's hash is filled in once
    /// the body is read.
    pub(crate) caller: Caller,
}

impl Control {
    /// Reads the `x-sim-*` and idempotency headers. The error names the
    /// header that could not be understood.
    pub(crate) fn from_headers(config: &SimConfig, headers: &HeaderMap) -> Result<Self, String> {
        let millis = |name: &str, default: Duration| -> Result<Duration, String> {
            Ok(number(headers, name)?.map_or(default, Duration::from_millis))
        };
        let completion_tokens = match number(headers, TOKENS_HEADER)? {
            None => config.completion_tokens,
            Some(n) => u32::try_from(n).map_err(|_| format!("{TOKENS_HEADER} is too large"))?,
        };
        let fault = match headers.get(FAIL_HEADER) {
            None => None,
            Some(value) => Some(value.to_str().ok().and_then(Fault::parse).ok_or_else(|| {
                format!(
                    "{FAIL_HEADER} must be 400, 429, 500, 503, reset-after:N, \
                             stall-after:N, error-after:N, end-after:N, hang or close"
                )
            })?),
        };
        Ok(Self {
            latency: millis(LATENCY_HEADER, config.latency)?,
            first_token_delay: millis(FIRST_TOKEN_HEADER, config.first_token_delay)?,
            token_interval: millis(TOKEN_INTERVAL_HEADER, config.token_interval)?,
            completion_tokens,
            fault,
            caller: Caller {
                key: idempotency_key(headers),
                credential: credential(headers),
                body_sha256: String::new(),
                tag: headers
                    .get(TAG_HEADER)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .unwrap_or_default(),
            },
        })
    }
}

fn number(headers: &HeaderMap, name: &str) -> Result<Option<u64>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} must be a non-negative integer")),
    }
}

/// The credential a gateway would make a tenant of: `Authorization`, else
/// `x-api-key`, as received ("" without either).
fn credential(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .or_else(|| headers.get("x-api-key"))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// The key from `Idempotency-Key` (or `x-idempotency-key`); "" if neither
/// is present. The structured-field string form (`"abc"`) counts under the
/// same key as the bare form (`abc`), as the IETF draft allows both.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> String {
    let raw = headers
        .get("idempotency-key")
        .or_else(|| headers.get("x-idempotency-key"))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .unwrap_or_default();
    match raw
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn fault_values() {
        assert_eq!(Fault::parse("429"), Some(Fault::RateLimited));
        assert_eq!(Fault::parse("503"), Some(Fault::ServerError(503)));
        assert_eq!(Fault::parse("reset-after:3"), Some(Fault::ResetAfter(3)));
        assert_eq!(Fault::parse("stall-after:0"), Some(Fault::StallAfter(0)));
        assert_eq!(Fault::parse("hang"), Some(Fault::Hang));
        assert_eq!(Fault::parse("error-after:2"), Some(Fault::ErrorAfter(2)));
        assert_eq!(Fault::parse("end-after:0"), Some(Fault::EndAfter(0)));
        assert_eq!(Fault::parse("close"), Some(Fault::Close));
        assert_eq!(Fault::parse("502"), None);
        assert_eq!(Fault::parse("reset-after:x"), None);
    }

    #[test]
    fn overrides_and_keys() {
        let c = Control::from_headers(
            &SimConfig::default(),
            &headers(&[
                ("x-sim-latency-ms", "7"),
                ("x-sim-tokens", "3"),
                ("idempotency-key", "\"k\\\"1\""),
            ]),
        )
        .unwrap();
        assert_eq!(c.latency, Duration::from_millis(7));
        assert_eq!(c.first_token_delay, Duration::from_millis(100));
        assert_eq!(c.completion_tokens, 3);
        assert_eq!(c.caller.key, "k\"1");
        let c = Control::from_headers(
            &SimConfig::default(),
            &headers(&[("x-idempotency-key", "abc")]),
        )
        .unwrap();
        assert_eq!(c.caller.key, "abc");
        assert!(
            Control::from_headers(&SimConfig::default(), &headers(&[("x-sim-tokens", "-1")]))
                .is_err()
        );
        assert!(
            Control::from_headers(&SimConfig::default(), &headers(&[("x-sim-fail", "boom")]))
                .is_err()
        );
    }
}
