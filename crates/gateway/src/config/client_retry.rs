//! `[client_retry]`: how the clients in front of the gateway retry, as an
//! [`RetryPolicy`].
//!
//! The gateway does not retry; the policy describes its callers so
//! `idemgate check` can compare `done_ttl` with their longest retry window.
//! A route's `[routes.client_retry]` overrides the top level field by field,
//! so both are read by one function over a base policy.

use idemgate_check::RetryPolicy;

use super::error::ConfigError;
use super::parse::{duration, duration_or_zero};
use super::raw::RawClientRetry;

/// A retry policy: the fields of `raw` over `base`.
pub(super) fn client_retry(
    at: &str,
    raw: &RawClientRetry,
    base: RetryPolicy,
) -> Result<RetryPolicy, ConfigError> {
    let f = |n: &str| format!("{at}.{n}");
    let attempts = raw.attempts.unwrap_or(base.attempts);
    if attempts == 0 {
        return Err(ConfigError::invalid(
            f("attempts"),
            "must be at least 1 (the first attempt counts)",
        ));
    }
    let policy = RetryPolicy {
        attempts,
        attempt_timeout: duration(
            &f("attempt_timeout"),
            raw.attempt_timeout.as_deref(),
            base.attempt_timeout,
        )?,
        backoff_base: duration_or_zero(
            &f("backoff_base"),
            raw.backoff_base.as_deref(),
            base.backoff_base,
        )?,
        backoff_cap: duration_or_zero(
            &f("backoff_cap"),
            raw.backoff_cap.as_deref(),
            base.backoff_cap,
        )?,
        jitter: raw.jitter.unwrap_or(base.jitter),
        compensation_delay: duration_or_zero(
            &f("compensation_delay"),
            raw.compensation_delay.as_deref(),
            base.compensation_delay,
        )?,
    };
    if policy.backoff_cap < policy.backoff_base {
        return Err(ConfigError::invalid(
            f("backoff_cap"),
            "must not be shorter than backoff_base",
        ));
    }
    Ok(policy)
}
