//! The one way the layer refuses a request: count its outcome, log why (or
//! not, when the problem itself explains the client's mistake), answer with
//! a problem.
//!
//! Every refusal goes through [`refuse`], so none answers without being
//! counted, and the count, the log line and the problem stay side by side.

use std::fmt::Display;

use axum::response::{IntoResponse, Response};
use idemgate_engine::ScopedKey;

use crate::problem::Problem;
use crate::telemetry::{Metrics, RequestOutcome};

/// How a refusal is logged.
pub(crate) enum Log<'a> {
    /// Not logged: the client's own mistake, which the problem explains.
    Quiet,
    /// At info: an expected refusal (a reused key, a key in flight).
    Info(&'static str),
    /// At warn, with the error: the store failed.
    Warn(&'static str, &'a dyn Display),
    /// At error, with the error: something that should never happen.
    Error(&'static str, &'a dyn Display),
}

/// Counts a request that ended with `outcome` (against `key` when it had
/// one), logs as `log` says, and answers with `problem`.
pub(crate) fn refuse(
    metrics: &Metrics,
    outcome: RequestOutcome,
    key: Option<&ScopedKey>,
    log: Log<'_>,
    problem: Problem,
) -> Response {
    match log {
        Log::Quiet => {}
        Log::Info(message) => tracing::info!("{message}"),
        Log::Warn(message, error) => tracing::warn!(error = %error, "{message}"),
        Log::Error(message, error) => tracing::error!(error = %error, "{message}"),
    }
    metrics.request(outcome, key);
    problem.into_response()
}
