//! RFC 9457 problem details: every refusal the layer (and the gateway's
//! proxy) makes, one constructor per case.
//!
//! The `type` URI of each case is stable: clients and dashboards match on it,
//! so a case is never renamed, only added.
//!
//! Beside the RFC 9457 fields every body carries an OpenAI-style `error`
//! object (`message`, `type`, `code`): the OpenAI SDK reads
//! `body.get("error", body)`, and the Anthropic SDK and LiteLLM read
//! `error.message`, so without it an SDK user sees an empty or generic
//! message. `code` is the problem's slug; `type` is the SDKs' error class
//! for the status (`invalid_request_error`, …).
//!
//! A retryable problem sends `retry-after-ms` (read first by both SDKs)
//! beside `Retry-After`, which is rounded up to whole seconds and never
//! down to 0 (the SDKs ignore a 0 and fall back to their own backoff).

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, StatusCode, header};

/// Prefix of every problem `type` URI.
pub const TYPE_BASE: &str = "https://idemgate.dev/problems/";

/// Media type of problem bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Header telling SDKs (OpenAI's and Anthropic's honour it) that a retry is
/// the right move.
pub const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Header with the retry delay in milliseconds; the OpenAI and Anthropic
/// SDKs read it before `Retry-After`.
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// A problem response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
    /// A final answer: `x-should-retry: false`, so SDKs do not retry into
    /// the same stored answer.
    final_answer: bool,
}

impl Problem {
    /// A problem of any kind: `slug` becomes the last segment of the stable
    /// `type` URI. The named constructors below cover the layer's own cases;
    /// this one serves the gateway's (no route, admin, proxy errors).
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        let detail = detail.into();
        Self {
            status,
            slug,
            title,
            detail,
            retry_after: None,
            final_answer: false,
        }
    }

    /// 400 `missing-key`: the route requires a key (or a dimension of a
    /// derived key) and the request has none.
    pub fn missing_key(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "missing-key",
            "Idempotency key missing",
            detail.into(),
        )
    }

    /// 400 `malformed-key`: empty, longer than 255 characters, not printable
    /// ASCII, badly quoted, or sent twice.
    pub fn malformed_key(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed-key",
            "Idempotency key malformed",
            detail.into(),
        )
    }

    /// 413 `body-too-large`.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 408 `request-body-timeout`: the request body stalled, or took longer
    /// in all than the listener allows. Nothing was stored or forwarded; the
    /// client may send the request again.
    pub fn request_body_timeout(deadline: crate::BodyDeadline) -> Self {
        let detail = match deadline {
            crate::BodyDeadline::Idle => "the request body stalled: no part of it arrived in time",
            crate::BodyDeadline::Total => "the request body took too long to arrive in all",
        };
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request-body-timeout",
            "Request body timed out",
            detail.to_owned(),
        )
    }

    /// 400 `request-body-unreadable`: the request body failed while it was
    /// being read.
    pub fn request_body_unreadable() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "request-body-unreadable",
            "Request body unreadable",
            "the request body could not be read".to_owned(),
        )
    }

    /// 400 `ambiguous-body`: the body can be read more than one way (a
    /// JSON object that repeats a key), so its fingerprint could describe
    /// another request than the one the upstream acts on.
    pub fn ambiguous_body(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "ambiguous-body",
            "Request body ambiguous",
            detail.into(),
        )
    }

    /// 400 `body-too-deep`: the JSON body nests arrays and objects deeper
    /// than the fingerprint accepts; no upstream should have to parse it.
    pub fn body_too_deep(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "body-too-deep",
            "Request body nested too deeply",
            detail.into(),
        )
    }

    /// 422 `key-mismatch`: the key was used for a different request.
    pub fn key_mismatch() -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key-mismatch",
            "Idempotency key reused",
            "this idempotency key was used with a different request (method, path or body)"
                .to_owned(),
        )
    }

    /// 409 `in-flight`, with `Retry-After` and `x-should-retry: true`.
    pub fn inflight(retry_after: Duration) -> Self {
        let mut p = Self::new(
            StatusCode::CONFLICT,
            "in-flight",
            "Request in flight",
            "a request with this idempotency key is still being processed; retry later".to_owned(),
        );
        p.retry_after = Some(retry_after);
        p
    }

    /// 503 `store-unavailable`: the idempotency store could not be reached;
    /// nothing was forwarded.
    pub fn store_unavailable() -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            "the idempotency store cannot be reached; the request was not processed".to_owned(),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// 504 `upstream-timeout`: the upstream did not answer within `phase`'s
    /// budget.
    pub fn upstream_timeout(phase: &str) -> Self {
        let mut p = Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream-timeout",
            "Upstream timeout",
            format!("the upstream did not answer in time ({phase})"),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// 502 `upstream-unavailable`: the upstream could not be reached or its
    /// response broke.
    pub fn upstream_unavailable(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream-unavailable",
            "Upstream unavailable",
            detail.into(),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// 503 `upstream-busy`: no upstream slot freed within the route's queue
    /// timeout; nothing was sent, the key was released, and a retry is safe.
    pub fn upstream_busy(queued: Duration) -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream-busy",
            "Upstream busy",
            format!(
                "no upstream slot freed within the queue timeout of {queued:?}; the request was not sent"
            ),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// `outcome-unknown`: the request was sent upstream and then failed
    /// (`status` 504 for a timeout, 502 for a cut connection), so the work
    /// may have run. On a charging route it is the key's final answer:
    /// every retry gets it until an operator forgets the key. No
    /// `Retry-After`: retrying cannot help.
    pub fn outcome_unknown(status: StatusCode, phase: &str) -> Self {
        let mut p = Self::new(
            status,
            "outcome-unknown",
            "Outcome unknown",
            format!(
                "the request was sent upstream and then failed ({phase}); it may have run, so it is not run again until an operator forgets this idempotency key"
            ),
        );
        // Every retry gets this same stored answer: SDKs that retry 5xx
        // by default would only spend their attempts on it.
        p.final_answer = true;
        p
    }

    /// 503 `shutting-down`: the server stopped before the work finished;
    /// the key was released.
    pub fn shutting_down() -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting-down",
            "Shutting down",
            "the server is shutting down; the request was not completed".to_owned(),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// 503 `lease-lost`: this request's execution lost its lease on the
    /// key before its result was stored (the process stalled past
    /// `pending_ttl`, and the key expired or was taken over), so its result
    /// is not the key's answer. Retryable: the retry gets the key's answer.
    pub fn lease_lost() -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lease-lost",
            "Lease lost",
            "the execution lost its lease on the idempotency key before its result was stored; the result is not the key's answer: retry to get it".to_owned(),
        );
        p.retry_after = Some(Duration::from_secs(1));
        p
    }

    /// 500 `stored-result-unreadable`: the stored result cannot be decoded.
    pub fn stored_result_unreadable() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "stored-result-unreadable",
            "Stored result unreadable",
            "the stored result of this idempotency key cannot be decoded".to_owned(),
        )
    }

    /// 500 `internal`: the work ended without an answer (it panicked).
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the request ended without a response; the key was released".to_owned(),
        )
    }

    /// 404 `operation-not-found`: no operation under this id (for this
    /// credential).
    pub fn operation_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "operation-not-found",
            "Operation not found",
            "no operation with this id exists for this credential".to_owned(),
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable `type` URI.
    pub fn type_uri(&self) -> String {
        format!("{TYPE_BASE}{}", self.slug)
    }

    /// The last segment of the `type` URI (`in-flight`, …).
    pub fn slug(&self) -> &'static str {
        self.slug
    }

    /// The human-readable explanation.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The retry delay this problem advises, if it is retryable.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The OpenAI/Anthropic error class for the status, the `error.type`
    /// of the body.
    pub fn error_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 => "conflict_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The JSON body: the RFC 9457 fields, and the `error` object SDKs read.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.type_uri(),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
            "error": {
                "message": format!("{}: {}", self.title, self.detail),
                "type": self.error_type(),
                "code": self.slug,
            },
        })
    }
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
fn whole_seconds(after: Duration) -> u64 {
    let up = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    up.max(1)
}

/// Milliseconds for `retry-after-ms`: rounded up, at least 1.
fn whole_millis(after: Duration) -> u64 {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    let up = ms.saturating_add(u64::from(!after.subsec_nanos().is_multiple_of(1_000_000)));
    up.max(1)
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        let mut res = Response::new(Body::from(body));
        *res.status_mut() = self.status;
        let h = res.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(after)));
            h.insert(RETRY_AFTER_MS, HeaderValue::from(whole_millis(after)));
            h.insert(SHOULD_RETRY, HeaderValue::from_static("true"));
        }
        if self.final_answer {
            h.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn in_flight_carries_retry_headers_and_a_stable_type() {
        let res = Problem::inflight(Duration::from_secs(3)).into_response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()[header::RETRY_AFTER], "3");
        assert_eq!(res.headers()[SHOULD_RETRY], "true");
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "https://idemgate.dev/problems/in-flight");
        assert_eq!(v["status"], 409);
        assert_eq!(v["error"]["code"], "in-flight");
        assert_eq!(v["error"]["type"], "conflict_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("still being processed")),
            "{v}"
        );
    }

    #[test]
    fn retry_after_rounds_up_and_never_to_zero() {
        let headers = |d: Duration| {
            let res = Problem::inflight(d).into_response();
            let get = |n: &HeaderName| {
                res.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            (get(&header::RETRY_AFTER), get(&RETRY_AFTER_MS))
        };
        let pair = |s: &str, ms: &str| (Some(s.to_owned()), Some(ms.to_owned()));
        assert_eq!(headers(Duration::from_millis(1500)), pair("2", "1500"));
        assert_eq!(headers(Duration::from_millis(200)), pair("1", "200"));
        assert_eq!(headers(Duration::ZERO), pair("1", "1"));
        assert_eq!(headers(Duration::from_micros(1_000_001)), pair("2", "1001"));
        assert_eq!(headers(Duration::from_secs(3)), pair("3", "3000"));
        // Problems that are not retryable advise nothing.
        let res = Problem::key_mismatch().into_response();
        assert!(res.headers().get(header::RETRY_AFTER).is_none());
        assert!(res.headers().get(RETRY_AFTER_MS).is_none());
    }

    #[test]
    fn every_problem_carries_the_error_object_sdks_read() {
        let cases = [
            (Problem::missing_key("x"), "invalid_request_error"),
            (Problem::key_mismatch(), "invalid_request_error"),
            (Problem::body_too_large(1), "request_too_large"),
            (Problem::store_unavailable(), "api_error"),
            (Problem::operation_not_found(), "not_found_error"),
            (
                Problem::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "Unauthorized",
                    "d",
                ),
                "authentication_error",
            ),
            (
                Problem::new(StatusCode::FORBIDDEN, "admin-disabled", "Off", "d"),
                "permission_error",
            ),
        ];
        for (p, kind) in cases {
            let v = p.body();
            assert_eq!(v["error"]["type"], kind, "{v}");
            assert_eq!(v["error"]["code"], p.slug(), "{v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(p.detail())),
                "{v}"
            );
        }
        let m = Problem::key_mismatch().body();
        assert!(
            m["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("different request")),
            "{m}"
        );
    }

    #[test]
    fn every_case_has_its_own_type() {
        let all = [
            Problem::missing_key("x"),
            Problem::malformed_key("x"),
            Problem::body_too_large(1),
            Problem::request_body_unreadable(),
            Problem::request_body_timeout(crate::BodyDeadline::Idle),
            Problem::ambiguous_body("x"),
            Problem::key_mismatch(),
            Problem::inflight(Duration::ZERO),
            Problem::store_unavailable(),
            Problem::upstream_timeout("connect"),
            Problem::upstream_unavailable("x"),
            Problem::upstream_busy(Duration::from_secs(1)),
            Problem::outcome_unknown(StatusCode::GATEWAY_TIMEOUT, "first_byte"),
            Problem::shutting_down(),
            Problem::stored_result_unreadable(),
            Problem::internal(),
            Problem::operation_not_found(),
        ];
        let mut slugs: Vec<_> = all.iter().map(Problem::slug).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), all.len());
        assert_eq!(
            Problem::key_mismatch().status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            Problem::body_too_large(1).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}
