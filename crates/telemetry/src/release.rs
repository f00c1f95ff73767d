//! Why an owner gave its key back instead of storing a result: the
//! `reason` label of `idempotency_released_total`. A typed label, owned
//! here beside the counter it labels, so the layer cannot count a reason
//! the dashboards and alerts do not know.

/// Why a detached execution gave its key back instead of storing a result.
///
/// Not `#[non_exhaustive]`: whoever answers a client for a released key
/// matches every reason, so a new one is a decision each of them makes.
/// Each reason is the `reason` label of the released counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    /// The work ran past the route's `completion_timeout`.
    CompletionTimeout,
    /// The layer shut down before the work finished.
    Shutdown,
    /// The inner service marked its response a retryable failure
    /// (`RetryableFailure`: connect error, connect or first-byte timeout).
    RetryableFailure,
    /// The inner service answered a status configured as retryable.
    RetryableStatus,
    /// The inner service marked its response `OutcomeUnknown` (the request
    /// was sent, then failed) and the route releases such keys.
    OutcomeUnknown,
    /// The response was too large to store; the client still got it whole.
    TooLarge,
    /// The response body failed before its end.
    BodyError,
    /// The event stream failed before its end.
    StreamError,
    /// A 200 event stream carried an error event (its dialect's).
    ErrorEvent,
    /// A 200 event stream ended without its dialect's terminal event.
    Unterminated,
    /// One event of a stream grew past the limit without ending.
    EventTooLarge,
    /// The result could not be encoded for the store.
    Encode,
}

impl ReleaseReason {
    /// Every reason.
    pub const ALL: [Self; 12] = [
        Self::CompletionTimeout,
        Self::Shutdown,
        Self::RetryableFailure,
        Self::RetryableStatus,
        Self::OutcomeUnknown,
        Self::TooLarge,
        Self::BodyError,
        Self::StreamError,
        Self::ErrorEvent,
        Self::Unterminated,
        Self::EventTooLarge,
        Self::Encode,
    ];

    /// The metric label (stable: dashboards and alerts match on it).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CompletionTimeout => "completion_timeout",
            Self::Shutdown => "shutdown",
            Self::RetryableFailure => "retryable_failure",
            Self::RetryableStatus => "retryable_status",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::TooLarge => "too_large",
            Self::BodyError => "body_error",
            Self::StreamError => "stream_error",
            Self::ErrorEvent => "error_event",
            Self::Unterminated => "unterminated_stream",
            Self::EventTooLarge => "event_too_large",
            Self::Encode => "encode",
        }
    }

    /// Whether the client got the whole response despite the release (so
    /// the request counts as executed and no stream events were lost).
    pub const fn delivered(self) -> bool {
        matches!(self, Self::TooLarge)
    }
}
