//! Every metric name idemgate exports. The first five are
//! the core idempotency signals (docs/design.md, "Metrics").

/// Requests answered from a stored (or live) result without their own
/// upstream call.
pub const HIT: &str = "idempotency_hit_total";
/// Requests that met a PENDING key.
pub const INFLIGHT_CONFLICT: &str = "idempotency_inflight_conflict_total";
/// Hits / keyed requests over a sliding five-minute window (requests
/// forwarded unprotected are not counted).
pub const HIT_RATIO: &str = "idempotency_hit_ratio";
/// Keyed requests by `outcome`.
pub const REQUESTS: &str = "idempotency_requests_total";
/// Requests per key: a histogram with one observation per key, its total
/// once it has been quiet for five to ten minutes.
pub const REQUESTS_PER_KEY: &str = "idempotency_requests_per_key";
/// Keys seen in the requests-per-key window.
pub const KEYS_TRACKED: &str = "idempotency_keys_tracked";
/// Completions refused because the lease had been taken over.
pub const FENCED: &str = "idempotency_fenced_total";
/// Tokens not billed again thanks to replays (from stored `usage`).
pub const TOKENS_SAVED: &str = "idempotency_tokens_saved_total";
/// Executions whose key was released instead of stored, by `reason`.
pub const RELEASED: &str = "idempotency_released_total";
/// Executions that failed after their request was sent upstream (a
/// first-byte timeout, a connection cut before the response): the work may
/// have run. Counted whether the key was then released or, on a charging
/// route, stored as an `outcome-unknown` answer.
pub const OUTCOME_UNKNOWN: &str = "idempotency_outcome_unknown_total";
/// Help text of [`OUTCOME_UNKNOWN`] (`# HELP` in the Prometheus export).
pub const OUTCOME_UNKNOWN_HELP: &str =
    "Executions that failed after the request was sent upstream, so the work may have run";
/// SSE events lost when an upstream stream broke mid-way (not stored).
pub const STREAM_EVENTS_LOST: &str = "idempotency_stream_events_lost_total";
/// Completion writes that failed with a temporary store error while the
/// result was held in memory and the write retried.
pub const COMPLETION_HELD: &str = "idempotency_completion_held_total";
/// Store operation latency by `backend` and `op`.
pub const STORE_OPERATION: &str = "idemgate_store_operation_seconds";
/// Store operations that failed, by `backend` and `op`.
pub const STORE_ERRORS: &str = "idemgate_store_errors_total";
/// Time a request waited behind the route's concurrency limit.
pub const UPSTREAM_QUEUE: &str = "idemgate_upstream_queue_seconds";
/// Upstream phase durations by `phase`: `connect` (a new connection),
/// `first_byte` (request sent to response headers), `total` (request sent
/// to the end of the body). Clocks start after the queue.
pub const UPSTREAM_PHASE: &str = "idemgate_upstream_phase_seconds";
/// Upstream timeouts by `phase` (queue, connect, first_byte, idle, total).
pub const UPSTREAM_TIMEOUTS: &str = "idemgate_upstream_timeouts_total";
/// Upstream failures other than timeouts, by `phase` (connect, send, body).
pub const UPSTREAM_ERRORS: &str = "idemgate_upstream_errors_total";
/// Stored responses that could not be sealed or opened with the key
/// ring, by `reason` (`unknown_key_id`, `tampered`, `malformed`,
/// `too_large`, `rng`).
pub const SEAL_FAILURES: &str = "idemgate_seal_failures_total";

/// Replays answered from this replica's memory (a DONE record the store
/// confirmed less than a second before), without a store round trip.
pub const REPLAY_CACHE_HITS: &str = "idemgate_replay_cache_hits_total";

/// Always 1, labelled with the `version` of the running build.
pub const BUILD_INFO: &str = "idemgate_build_info";

/// Requests whose handling panicked, by where the panic was caught
/// (`at="execution"`: the owner's upstream call or handler; `at="request"`:
/// anywhere else in the request's handling). Each was answered 500 and its
/// key released; the process went on.
pub const PANICS: &str = "idemgate_panics_total";

/// Client connections or requests stopped by a connection limit, by
/// `limit`: `connections` (over the concurrent-connection limit: 503),
/// `header_read_time` (no complete request head in time: 408 or closed),
/// `header_size` (head too large or too many fields: 431),
/// `body_idle_time` / `body_read_time` (request body stalled, or too slow
/// in all: 408).
pub const CONNECTION_LIMITS: &str = "idemgate_connection_limits_total";

/// Client connections open on the proxy listener.
pub const CONNECTIONS_OPEN: &str = "idemgate_connections_open";

/// Always 1 per route, labelled with whether the route `charges`.
pub const ROUTE_INFO: &str = "idemgate_route_info";

/// Every name above, for consistency checks (alerts, dashboards).
pub const ALL: &[&str] = &[
    HIT,
    INFLIGHT_CONFLICT,
    HIT_RATIO,
    REQUESTS,
    REQUESTS_PER_KEY,
    KEYS_TRACKED,
    FENCED,
    TOKENS_SAVED,
    RELEASED,
    OUTCOME_UNKNOWN,
    STREAM_EVENTS_LOST,
    COMPLETION_HELD,
    STORE_OPERATION,
    STORE_ERRORS,
    UPSTREAM_QUEUE,
    UPSTREAM_PHASE,
    UPSTREAM_TIMEOUTS,
    UPSTREAM_ERRORS,
    BUILD_INFO,
    ROUTE_INFO,
    PANICS,
    CONNECTION_LIMITS,
    CONNECTIONS_OPEN,
    SEAL_FAILURES,
    REPLAY_CACHE_HITS,
];

/// The `# HELP` text of each name in [`ALL`].
pub const HELP: &[(&str, &str)] = &[
    (
        HIT,
        "Requests answered from a stored or live result without their own upstream call.",
    ),
    (
        INFLIGHT_CONFLICT,
        "Requests that met their idempotency key in flight (PENDING).",
    ),
    (
        HIT_RATIO,
        "Hits / keyed requests over a sliding five-minute window.",
    ),
    (REQUESTS, "Keyed requests by final outcome."),
    (
        REQUESTS_PER_KEY,
        "Requests per idempotency key, observed once per key when it has been quiet for five to ten minutes.",
    ),
    (KEYS_TRACKED, "Keys counted in the requests-per-key window."),
    (
        FENCED,
        "Completions refused because the lease had been taken over (the work ran twice).",
    ),
    (
        TOKENS_SAVED,
        "Tokens a replay did not pay for again (from the stored usage).",
    ),
    (
        RELEASED,
        "Executions whose key was released instead of stored, by reason.",
    ),
    (OUTCOME_UNKNOWN, OUTCOME_UNKNOWN_HELP),
    (
        COMPLETION_HELD,
        "Completion writes that failed with a temporary store error; the result was held in memory and the write retried.",
    ),
    (
        STREAM_EVENTS_LOST,
        "Events relayed on an upstream stream that then broke (not stored).",
    ),
    (
        STORE_OPERATION,
        "Idempotency store operation latency in seconds, by backend and op.",
    ),
    (
        STORE_ERRORS,
        "Idempotency store operations that failed, by backend and op.",
    ),
    (
        UPSTREAM_QUEUE,
        "Seconds a request waited for a slot under the route's concurrency limit.",
    ),
    (
        UPSTREAM_PHASE,
        "Upstream phase durations in seconds (connect, first_byte, total).",
    ),
    (UPSTREAM_TIMEOUTS, "Upstream timeouts by phase."),
    (
        UPSTREAM_ERRORS,
        "Upstream failures other than timeouts, by phase.",
    ),
    (
        BUILD_INFO,
        "Always 1; the version label names the running idemgate build.",
    ),
    (
        PANICS,
        "Requests whose handling panicked (answered 500, key released), by where it was caught.",
    ),
    (
        CONNECTION_LIMITS,
        "Client connections or requests stopped by a connection limit (503, 408, 431), by limit.",
    ),
    (
        CONNECTIONS_OPEN,
        "Client connections open on the proxy listener.",
    ),
    (
        ROUTE_INFO,
        "Always 1 per route; charges=\"true\" marks a route that keeps outcome-unknown answers.",
    ),
    (
        SEAL_FAILURES,
        "Stored records that could not be opened (unknown key id, tampering), by reason.",
    ),
    (
        REPLAY_CACHE_HITS,
        "Replays and reads answered from this replica's memory, without a store round trip.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_help_text_once() {
        for name in ALL {
            let n = HELP.iter().filter(|(n, _)| n == name).count();
            assert_eq!(n, 1, "{name} has {n} HELP entries");
        }
        assert_eq!(HELP.len(), ALL.len(), "a HELP entry names no metric");
    }
}
