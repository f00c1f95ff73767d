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
/// Requests per key over the last ten minutes, by `quantile` (0.5, 0.9, 0.99).
pub const REQUESTS_PER_KEY: &str = "idempotency_requests_per_key";
/// Keys seen in the requests-per-key window.
pub const KEYS_TRACKED: &str = "idempotency_keys_tracked";
/// Completions refused because the lease had been taken over.
pub const FENCED: &str = "idempotency_fenced_total";
/// Tokens not billed again thanks to replays (from stored `usage`).
pub const TOKENS_SAVED: &str = "idempotency_tokens_saved_total";
/// Executions whose key was released instead of stored, by `reason`.
pub const RELEASED: &str = "idempotency_released_total";
/// SSE events lost when an upstream stream broke mid-way (not stored).
pub const STREAM_EVENTS_LOST: &str = "idempotency_stream_events_lost_total";
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
/// Upstream timeouts by `phase` (connect, first_byte, idle, total).
pub const UPSTREAM_TIMEOUTS: &str = "idemgate_upstream_timeouts_total";
/// Upstream failures other than timeouts, by `phase` (connect, send, body).
pub const UPSTREAM_ERRORS: &str = "idemgate_upstream_errors_total";
/// Stored responses that could not be sealed or opened with the key
/// ring, by `reason` (`unknown_key_id`, `tampered`, `malformed`,
/// `too_large`, `rng`).
pub const SEAL_FAILURES: &str = "idemgate_seal_failures_total";

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
    STREAM_EVENTS_LOST,
    STORE_OPERATION,
    STORE_ERRORS,
    UPSTREAM_QUEUE,
    UPSTREAM_PHASE,
    UPSTREAM_TIMEOUTS,
    UPSTREAM_ERRORS,
    SEAL_FAILURES,
];
