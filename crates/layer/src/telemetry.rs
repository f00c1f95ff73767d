//! Metric names (SPEC §5) and the helpers that record them.
//!
//! Through the `metrics` facade, so the application picks the exporter (the
//! gateway installs Prometheus). Labels stay low-cardinality: the route
//! (namespace) and a fixed set of outcomes or reasons, never a key or tenant.

use crate::stored::Usage;

/// Requests seen by the layer, by `outcome`.
pub const REQUESTS_TOTAL: &str = "idempotency_requests_total";
/// Requests answered without running the work (replayed or attached).
pub const HIT_TOTAL: &str = "idempotency_hit_total";
/// Requests that found their key in flight and were refused or timed out
/// waiting.
pub const INFLIGHT_CONFLICT_TOTAL: &str = "idempotency_inflight_conflict_total";
/// Results not stored because the lease had been taken over.
pub const FENCED_TOTAL: &str = "idempotency_fenced_total";
/// Tokens (prompt + completion) of replayed responses: what the duplicates
/// would have been billed.
pub const TOKENS_SAVED_TOTAL: &str = "idempotency_tokens_saved_total";
/// Executions whose key was released instead of stored, by `reason`.
pub const RELEASED_TOTAL: &str = "idempotency_released_total";
/// Events of broken streams that were relayed but not stored.
pub const STREAM_EVENTS_LOST_TOTAL: &str = "idempotency_stream_events_lost_total";
/// Store failures seen by the layer, by `op`.
pub const STORE_ERRORS_TOTAL: &str = "idempotency_store_errors_total";

/// Outcomes of [`REQUESTS_TOTAL`].
pub mod outcome {
    /// The work ran for this request.
    pub const EXECUTED: &str = "executed";
    /// Answered from the stored result.
    pub const REPLAYED: &str = "replayed";
    /// Joined an execution in flight (live stream or waited result).
    pub const ATTACHED: &str = "attached";
    /// Refused (or gave up waiting) because the key is in flight.
    pub const CONFLICT: &str = "conflict";
    /// The key was used for a different request.
    pub const MISMATCH: &str = "mismatch";
    /// Missing or malformed key.
    pub const BAD_KEY: &str = "bad_key";
    /// Body over the limit or unreadable.
    pub const BAD_BODY: &str = "bad_body";
    /// No key on an optional route: passed through.
    pub const UNKEYED: &str = "unkeyed";
    /// Store failed, request refused.
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    /// Store failed, request forwarded unprotected.
    pub const FAIL_OPEN: &str = "fail_open";
    /// `Prefer: respond-async`: accepted, running detached.
    pub const ACCEPTED: &str = "accepted";
    /// The stored result could not be decoded.
    pub const UNREADABLE: &str = "unreadable";
}

pub(crate) fn request(route: &str, outcome: &'static str) {
    metrics::counter!(REQUESTS_TOTAL, "route" => route.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn hit(route: &str, usage: Option<Usage>) {
    metrics::counter!(HIT_TOTAL, "route" => route.to_owned()).increment(1);
    if let Some(u) = usage {
        metrics::counter!(TOKENS_SAVED_TOTAL, "route" => route.to_owned()).increment(u.total());
    }
}

pub(crate) fn conflict(route: &str) {
    metrics::counter!(INFLIGHT_CONFLICT_TOTAL, "route" => route.to_owned()).increment(1);
}

pub(crate) fn fenced(route: &str) {
    metrics::counter!(FENCED_TOTAL, "route" => route.to_owned()).increment(1);
}

pub(crate) fn released(route: &str, reason: &'static str) {
    metrics::counter!(RELEASED_TOTAL, "route" => route.to_owned(), "reason" => reason).increment(1);
}

pub(crate) fn events_lost(route: &str, n: usize) {
    let n = u64::try_from(n).unwrap_or(u64::MAX);
    metrics::counter!(STREAM_EVENTS_LOST_TOTAL, "route" => route.to_owned()).increment(n);
}

pub(crate) fn store_error(route: &str, op: &'static str) {
    metrics::counter!(STORE_ERRORS_TOTAL, "route" => route.to_owned(), "op" => op).increment(1);
}
