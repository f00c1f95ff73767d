//! The header names the client and the gateway agree on, and how the
//! `Idempotent-Replayed` answer is read.
//!
//! A leaf module: the request builder, the retry loop, the responses,
//! the errors and the event stream all speak these names, so none of
//! them has to depend on another for a constant.

use reqwest::header::HeaderMap;

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The request header naming the last event a resumed stream has.
pub const LAST_EVENT_ID: &str = "last-event-id";

/// `Idempotent-Replayed`: `true` when the gateway answered from a stored
/// (or joined) result instead of executing the request.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Whether `headers` say `Idempotent-Replayed: true`.
pub(crate) fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get(IDEMPOTENT_REPLAYED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}
