//! When to retry, and how long to wait first.
//!
//! The field names and the backoff arithmetic are those of the gateway's
//! `[client_retry]` table, and the backoff arithmetic is
//! `idemgate_check::Backoff`, the one `idemgate check` uses to size
//! `done_ttl`: the policy this client really runs can be written into the
//! gateway's configuration as it is ([`RetryPolicy::client_retry_toml`]).

use std::time::{Duration, SystemTime};

use idemgate_check::Backoff;
/// How a backoff sleep is randomized (as `[client_retry] jitter`); the
/// checklist's own type, so both spell it the same.
pub use idemgate_check::Jitter;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// `retry-after-ms`: a server's delay in milliseconds (OpenAI sends it).
pub const RETRY_AFTER_MS: &str = "retry-after-ms";
/// `x-should-retry`: a server's explicit `true`/`false` on retrying
/// (OpenAI, Anthropic and idemgate send it).
pub const SHOULD_RETRY: &str = "x-should-retry";

/// The default [`RetryPolicy::max_server_delay`]: 60 s.
pub const DEFAULT_MAX_SERVER_DELAY: Duration = Duration::from_secs(60);

/// The default [`RetryPolicy::deadline`]: 30 minutes.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// How one logical operation is retried.
///
/// The defaults are those of the official OpenAI and Anthropic clients, and
/// of the gateway's `[client_retry]`: 3 attempts, a 600 s attempt timeout,
/// backoff from 0.5 s doubling up to 8 s with full jitter. A server's delay
/// is honoured up to 60 s ([`RetryPolicy::max_server_delay`]), and one
/// operation takes at most 30 minutes ([`RetryPolicy::deadline`]), so no
/// server can keep a caller waiting for longer, whatever it sends. Start
/// from [`RetryPolicy::default`] and set fields.
///
/// Whatever is retried, it is retried with the same idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Most attempts of one operation, the first included (1 = no retry).
    /// For a stream, an attempt that delivers new events starts the count
    /// again: only attempts in a row that make no progress count.
    pub attempts: u32,
    /// Longest time one attempt may take: to the whole response for
    /// [`RequestBuilder::send`], to the response head for
    /// [`RequestBuilder::send_stream`]. `None`: no limit.
    ///
    /// [`RequestBuilder::send`]: crate::RequestBuilder::send
    /// [`RequestBuilder::send_stream`]: crate::RequestBuilder::send_stream
    pub attempt_timeout: Option<Duration>,
    /// Backoff before the first retry; doubles for each later retry.
    pub backoff_base: Duration,
    /// Longest backoff sleep. A delay the server asks for is capped by
    /// [`RetryPolicy::max_server_delay`] instead.
    pub backoff_cap: Duration,
    /// Randomization of each backoff sleep (never of a server's delay).
    pub jitter: Jitter,
    /// Longest wait before a retry that a server's delay gets:
    /// `retry-after-ms`, `Retry-After` (seconds or an HTTP date) and an
    /// event stream's `retry` field. A longer delay (`Retry-After:
    /// 1000000000`, a date in the year 9999) is cut to this, and the
    /// attempt's [`Delay::capped`] says so. Default 60 s, the limit the
    /// official OpenAI and Anthropic clients put on `Retry-After`; a
    /// gateway's own delays (a 409's poll interval) are seconds.
    pub max_server_delay: Duration,
    /// Longest time spent on one operation, retries and sleeps included:
    /// no retry is scheduled to start after it, a server's delay that would
    /// end after it ends the retries at once, and each attempt's timeout is
    /// shortened to the time left. For a stream it restarts whenever an
    /// attempt delivers new events. Default 30 minutes: the default
    /// attempts' timeouts end to end (3 × 600 s), so it changes nothing for
    /// a server that answers, and bounds one that never lets go. `None`:
    /// the attempts bound the operation.
    pub deadline: Option<Duration>,
    /// Longest silence on an event stream before the client drops the
    /// connection and resumes with `Last-Event-ID`. Set it above the
    /// gateway's `idle` timeout, so a slow but healthy stream is not cut.
    /// `None`: wait as long as the connection lives.
    pub stream_idle_timeout: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            attempt_timeout: Some(Duration::from_secs(600)),
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(8),
            jitter: Jitter::Full,
            max_server_delay: DEFAULT_MAX_SERVER_DELAY,
            deadline: Some(DEFAULT_DEADLINE),
            stream_idle_timeout: Some(Duration::from_secs(90)),
        }
    }
}

impl RetryPolicy {
    /// The backoff this policy sleeps by when the server names no delay.
    pub fn backoff_schedule(&self) -> Backoff {
        Backoff::new(self.backoff_base, self.backoff_cap, self.jitter)
    }

    /// The longest backoff sleep before retry number `retry` (0-based):
    /// `min(backoff_cap, backoff_base × 2^retry)`.
    pub fn max_backoff(&self, retry: u32) -> Duration {
        self.backoff_schedule().max(retry)
    }

    /// A backoff sleep before retry number `retry` (0-based), jitter
    /// applied.
    pub fn backoff(&self, retry: u32) -> Duration {
        self.backoff_schedule().sleep(retry)
    }

    /// This policy as the gateway's `[client_retry]` table, for
    /// `idemgate check` to size `done_ttl` against what this client really
    /// does. An attempt timeout of `None` is written as 10 years.
    pub fn client_retry_toml(&self) -> String {
        let timeout = self
            .attempt_timeout
            .unwrap_or(Duration::from_secs(10 * 365 * 24 * 3600));
        format!(
            "[client_retry]\nattempts = {}\nattempt_timeout = \"{}ms\"\nbackoff_base = \"{}ms\"\nbackoff_cap = \"{}ms\"\njitter = \"{}\"\n",
            self.attempts,
            timeout.as_millis(),
            self.backoff_base.as_millis(),
            self.backoff_cap.as_millis(),
            self.jitter.as_str(),
        )
    }
}

/// Where a wait before a retry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DelaySource {
    /// The server's `retry-after-ms` header.
    RetryAfterMs,
    /// The server's `Retry-After` header, in seconds.
    RetryAfterSeconds,
    /// The server's `Retry-After` header, as an HTTP date.
    RetryAfterDate,
    /// The event stream's own `retry` field (its reconnection time), for
    /// resuming that stream.
    StreamRetry,
    /// The policy's jittered exponential backoff.
    Backoff,
}

/// A wait before a retry, and why it is this long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delay {
    /// How long the client waits.
    pub duration: Duration,
    /// Where the duration came from.
    pub source: DelaySource,
    /// The server asked for longer than
    /// [`RetryPolicy::max_server_delay`]: `duration` is that maximum.
    pub capped: bool,
}

impl Delay {
    /// A wait of `duration`, from `source` (to compare with
    /// [`Attempt::delay`](crate::ClientAttempt::delay)).
    pub const fn new(duration: Duration, source: DelaySource) -> Self {
        Self {
            duration,
            source,
            capped: false,
        }
    }

    /// A server's delay cut to `max`, marked [`Delay::capped`] (to compare
    /// with [`Attempt::delay`](crate::ClientAttempt::delay)).
    pub const fn capped(max: Duration, source: DelaySource) -> Self {
        Self {
            duration: max,
            source,
            capped: true,
        }
    }

    /// This delay, cut to `max` if longer.
    pub(crate) fn at_most(self, max: Duration) -> Self {
        if self.duration > max {
            Self::capped(max, self.source)
        } else {
            self
        }
    }
}

/// The delay a response asks for: `retry-after-ms` first, then
/// `Retry-After` (seconds, or an HTTP date measured from `now`). A value
/// that cannot be read is ignored; a date in the past means no wait; a
/// number too large for a `Duration` is `Duration::MAX` (the policy's
/// [`RetryPolicy::max_server_delay`] cuts it).
pub(crate) fn server_delay(headers: &HeaderMap, now: SystemTime) -> Option<Delay> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text(RETRY_AFTER_MS).and_then(|v| v.parse::<f64>().ok())
        && ms >= 0.0
    {
        // NaN fails the comparison above; infinity and overflow saturate.
        let d = Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX);
        return Some(Delay::new(d, DelaySource::RetryAfterMs));
    }
    let value = text(RETRY_AFTER.as_str())?;
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let d = value
            .parse::<u64>()
            .map_or(Duration::MAX, Duration::from_secs);
        return Some(Delay::new(d, DelaySource::RetryAfterSeconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(Delay::new(
        when.duration_since(now).unwrap_or(Duration::ZERO),
        DelaySource::RetryAfterDate,
    ))
}

/// What the server said with `x-should-retry`, if it said `true` or
/// `false`.
pub(crate) fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let v = headers.get(SHOULD_RETRY)?.to_str().ok()?.trim();
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Whether a non-success response is worth another attempt with the same
/// key: the server's `x-should-retry` decides when present; otherwise 408,
/// 409, 429 and 5xx are retried and everything else is final.
pub(crate) fn retryable_status(status: StatusCode, headers: &HeaderMap) -> bool {
    if let Some(said) = should_retry(headers) {
        return said;
    }
    matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let now = SystemTime::now();
        let h = headers(&[("retry-after-ms", "1500"), ("retry-after", "30")]);
        assert_eq!(
            server_delay(&h, now),
            Some(Delay::new(
                Duration::from_millis(1500),
                DelaySource::RetryAfterMs
            ))
        );
        // Fractional milliseconds, as OpenAI may send.
        let h = headers(&[("retry-after-ms", "12.5")]);
        assert_eq!(
            server_delay(&h, now).map(|d| d.duration),
            Some(Duration::from_micros(12_500))
        );
        // Unreadable retry-after-ms: Retry-After is used.
        let h = headers(&[("retry-after-ms", "soon"), ("retry-after", "3")]);
        assert_eq!(
            server_delay(&h, now),
            Some(Delay::new(
                Duration::from_secs(3),
                DelaySource::RetryAfterSeconds
            ))
        );
        let h = headers(&[("retry-after-ms", "-5")]);
        assert_eq!(server_delay(&h, now), None);
        // Too large for a Duration: the longest one (the policy cuts it),
        // not ignored in favour of a shorter header or the backoff.
        for (name, value) in [
            ("retry-after-ms", "1e300"),
            ("retry-after-ms", "inf"),
            ("retry-after", "99999999999999999999999"),
        ] {
            let mut h = headers(&[("retry-after", "1")]);
            h.insert(name, HeaderValue::from_static(value));
            assert_eq!(
                server_delay(&h, now).map(|d| d.duration),
                Some(Duration::MAX),
                "{name}: {value}"
            );
        }
        let h = headers(&[("retry-after-ms", "NaN"), ("retry-after", "2")]);
        assert_eq!(
            server_delay(&h, now).map(|d| d.duration),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn retry_after_as_an_http_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]);
        assert_eq!(
            server_delay(&h, now),
            Some(Delay::new(
                Duration::from_secs(10),
                DelaySource::RetryAfterDate
            ))
        );
        // A date in the past: retry now.
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:00 GMT")]);
        assert_eq!(
            server_delay(&h, now).map(|d| d.duration),
            Some(Duration::ZERO)
        );
        let h = headers(&[("retry-after", "tomorrow")]);
        assert_eq!(server_delay(&h, now), None);
        assert_eq!(server_delay(&HeaderMap::new(), now), None);
    }

    #[test]
    fn which_statuses_are_retried() {
        let none = HeaderMap::new();
        for s in [408, 409, 429, 500, 502, 503, 504] {
            assert!(
                retryable_status(StatusCode::from_u16(s).unwrap(), &none),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 413, 422] {
            assert!(
                !retryable_status(StatusCode::from_u16(s).unwrap(), &none),
                "{s}"
            );
        }
        let no = headers(&[("x-should-retry", "false")]);
        assert!(!retryable_status(StatusCode::SERVICE_UNAVAILABLE, &no));
        let yes = headers(&[("x-should-retry", "TRUE")]);
        assert!(retryable_status(StatusCode::BAD_REQUEST, &yes));
        let junk = headers(&[("x-should-retry", "maybe")]);
        assert!(retryable_status(StatusCode::CONFLICT, &junk));
    }

    /// The arithmetic itself is `idemgate_check::Backoff`'s (tested
    /// there); the policy only hands it its fields.
    #[test]
    fn backoff_doubles_up_to_the_cap_with_the_policys_jitter() {
        let p = RetryPolicy {
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_millis(700),
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let maxes: Vec<u128> = (0..5).map(|r| p.max_backoff(r).as_millis()).collect();
        assert_eq!(maxes, [100, 200, 400, 700, 700]);
        assert_eq!(p.max_backoff(u32::MAX), Duration::from_millis(700));
        let sleeps: Vec<u128> = (0..5).map(|r| p.backoff(r).as_millis()).collect();
        assert_eq!(sleeps, maxes, "no jitter: the bound itself");
    }

    #[test]
    fn the_policy_renders_as_the_gateways_client_retry_table() {
        let toml = RetryPolicy::default().client_retry_toml();
        assert_eq!(
            toml,
            "[client_retry]\nattempts = 3\nattempt_timeout = \"600000ms\"\nbackoff_base = \"500ms\"\nbackoff_cap = \"8000ms\"\njitter = \"full\"\n"
        );
    }
}
