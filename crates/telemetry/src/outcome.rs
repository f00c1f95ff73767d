//! How a keyed request ended: the `outcome` label of
//! `idempotency_requests_total`, and which outcomes are hits. A leaf
//! module, since the counters, the recent-keys table and the layer all
//! speak it.
//!
//! The engine's [`AttemptOutcome`] is the timeline's word for the same
//! event; [`RequestOutcome::of_attempt`] is the one place the two meet, so
//! a request counted here and its timeline entry never disagree.

use idemgate_engine::AttemptOutcome;

/// How a keyed request ended, as counted in `idempotency_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// Ran upstream now and was stored (or delivered when too large to store).
    Executed,
    /// Answered from a DONE record.
    Replayed,
    /// Joined an in-flight run and got its result.
    Attached,
    /// Met a PENDING key and was refused (or its wait ran out).
    Conflict,
    /// Same key, different payload.
    Mismatch,
    /// Ran upstream and failed retryably: the key was released.
    Failed,
    /// Ran upstream but its lease had been taken over: not stored.
    Fenced,
    /// Refused before any work: missing/malformed key, oversized body.
    Rejected,
    /// The store failed and the request was refused (`fail_closed`), or a
    /// stored result could not be read.
    StoreError,
    /// Forwarded without protection because the request had no key, on a
    /// route where the key is optional: a client that stopped sending keys.
    UnprotectedNoKey,
    /// Forwarded without protection because the store failed, on a
    /// `fail_open` route: a store that is down.
    UnprotectedStoreError,
    /// `Prefer: respond-async` on a key already running: pointed at it (202).
    Accepted,
    /// A `GET` of a `Prefer: respond-async` operation that found it done:
    /// the asker collecting its own result, not a retry (never a hit).
    OperationRead,
}

impl RequestOutcome {
    /// Every outcome, in label order.
    pub const ALL: [RequestOutcome; 13] = [
        Self::Executed,
        Self::Replayed,
        Self::Attached,
        Self::Conflict,
        Self::Mismatch,
        Self::Failed,
        Self::Fenced,
        Self::Rejected,
        Self::StoreError,
        Self::UnprotectedNoKey,
        Self::UnprotectedStoreError,
        Self::Accepted,
        Self::OperationRead,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Attached => "attached",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Failed => "failed",
            Self::Fenced => "fenced",
            Self::Rejected => "rejected",
            Self::StoreError => "store_error",
            Self::UnprotectedNoKey => "unprotected_no_key",
            Self::UnprotectedStoreError => "unprotected_store_error",
            Self::Accepted => "accepted",
            Self::OperationRead => "operation_read",
        }
    }

    /// Whether the request was forwarded without protection (either cause).
    pub fn is_unprotected(self) -> bool {
        matches!(self, Self::UnprotectedNoKey | Self::UnprotectedStoreError)
    }

    /// Whether the response came from a stored or live result without an
    /// upstream call of its own (a "hit").
    pub fn is_hit(self) -> bool {
        matches!(self, Self::Replayed | Self::Attached)
    }

    /// The outcome counted for a request whose attempt the key's timeline
    /// records as `attempt`; `None` for a timeline entry that is no
    /// request of a client's (an operator's forget).
    ///
    /// The names agree but for one: an attempt stored as
    /// `outcome_unknown` (it failed after it was handed on) is a `failed`
    /// request, which the route also counts among its outcome-unknown
    /// executions.
    pub fn of_attempt(attempt: AttemptOutcome) -> Option<Self> {
        Some(match attempt {
            AttemptOutcome::Executed => Self::Executed,
            AttemptOutcome::Replayed => Self::Replayed,
            AttemptOutcome::Conflict => Self::Conflict,
            AttemptOutcome::Attached => Self::Attached,
            AttemptOutcome::Mismatch => Self::Mismatch,
            AttemptOutcome::Failed | AttemptOutcome::OutcomeUnknown => Self::Failed,
            AttemptOutcome::Fenced => Self::Fenced,
            _ => return None,
        })
    }

    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|o| *o == self).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every attempt a client's request makes is counted under the label
    /// the timeline gives it, but `outcome_unknown`, which is a failure;
    /// an operator's forget is no request.
    #[test]
    fn attempts_are_counted_under_their_timeline_name() {
        let attempts = AttemptOutcome::ALL.into_iter().filter(|a| {
            !matches!(
                a,
                AttemptOutcome::OutcomeUnknown | AttemptOutcome::Forgotten
            )
        });
        for a in attempts {
            let counted = RequestOutcome::of_attempt(a).map(RequestOutcome::as_str);
            assert_eq!(counted, Some(a.as_str()), "{a:?}");
        }
        assert_eq!(
            RequestOutcome::of_attempt(AttemptOutcome::OutcomeUnknown),
            Some(RequestOutcome::Failed)
        );
        assert_eq!(RequestOutcome::of_attempt(AttemptOutcome::Forgotten), None);
    }
}
