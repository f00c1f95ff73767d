//! The record a store keeps per scoped key, the lease that owns a PENDING
//! record, and the attempts that make up a key's timeline.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Fingerprint, ScopedKey};

/// Milliseconds since the Unix epoch: the one time unit stores persist.
/// Wall-clock, because several processes sharing a store must agree on it.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds since the Unix epoch as read on this process's monotonic
/// clock: the wall clock is read once, at the first call, and time then
/// advances with [`std::time::Instant`].
///
/// Lease and record expiry of the in-process stores (memory, SQLite) use
/// it, so that a step of the wall clock (an NTP correction, a VM resumed)
/// neither expires a live lease early nor keeps a dead one: within one
/// process, expiry follows elapsed time only.
///
/// The limit: processes sharing one SQLite file each anchor their clock
/// when they first use it. They agree while the wall clock is not stepped
/// between their starts; after a step, a process started later is off by
/// the step from one started earlier, until the earlier one restarts.
pub fn monotonic_ms() -> u64 {
    static ANCHOR: std::sync::OnceLock<(u64, std::time::Instant)> = std::sync::OnceLock::new();
    let (wall, at) = ANCHOR.get_or_init(|| (now_ms(), std::time::Instant::now()));
    anchored_ms(*wall, *at, std::time::Instant::now())
}

/// `wall` (read at `at`) advanced by the monotonic time from `at` to `now`.
fn anchored_ms(wall: u64, at: std::time::Instant, now: std::time::Instant) -> u64 {
    wall.saturating_add(ms(now.saturating_duration_since(at)))
}

/// A duration in whole milliseconds, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Proof of ownership of a PENDING record.
///
/// `token` is random per claim; `fence` increases with every claim of the
/// key that a store remembers. A store honours `renew`, `complete` and
/// `release` only while the record still carries this exact token and fence,
/// so an owner whose lease expired and was taken over is refused ("fenced").
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The record this lease owns.
    pub key: ScopedKey,
    /// Random owner token.
    pub token: u128,
    /// Fencing counter at the time of the claim.
    pub fence: u64,
    /// When the lease lapses unless renewed (ms since epoch).
    pub expires_at_ms: u64,
    /// The fingerprint of the request claimed, so a store can write the
    /// DONE record again if the PENDING one vanished (lost in a failover,
    /// or expired and taken by nobody).
    pub fingerprint: Fingerprint,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// A fresh random owner token.
    pub fn new_token() -> u128 {
        rand::random()
    }
}

/// What a store holds for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// PENDING or DONE.
    pub state: RecordState,
}

/// The two states a present record can be in (absence is the third).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Someone holds the key and is working.
    Pending {
        /// Fence of the current owner.
        fence: u64,
        /// When the owner's lease lapses (ms since epoch).
        lease_expires_at_ms: u64,
    },
    /// The work finished; its result is stored.
    Done {
        /// The stored result, opaque to the store.
        payload: Bytes,
        /// When the record expires (ms since epoch).
        expires_at_ms: u64,
    },
}

impl Record {
    /// Whether the record is DONE.
    pub fn is_done(&self) -> bool {
        matches!(self.state, RecordState::Done { .. })
    }

    /// The stored payload of a DONE record.
    pub fn payload(&self) -> Option<&Bytes> {
        match &self.state {
            RecordState::Done { payload, .. } => Some(payload),
            RecordState::Pending { .. } => None,
        }
    }
}

/// Result of `claim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key was absent (or its lease had expired): the caller owns it now.
    Acquired(Lease),
    /// The key is held (PENDING with a live lease) or finished (DONE).
    Existing(Record),
}

/// Whether a fenced write (renew, complete, release) took effect.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// The lease was current; the write was applied.
    Applied,
    /// The lease was no longer current (expired and taken over, or the
    /// record is gone); nothing was written.
    Stale,
}

/// How one attempt on a key ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// This attempt ran the work and stored the result.
    Executed,
    /// This attempt was answered from the stored result.
    Replayed,
    /// This attempt found the key in flight and was refused or timed out waiting.
    Conflict,
    /// This attempt joined an in-flight execution and received its result.
    Attached,
    /// Same key, different payload: refused.
    Mismatch,
    /// The work failed; the key was released for a retry.
    Failed,
    /// The work finished after its lease had been taken over: not stored.
    Fenced,
    /// The work failed after it was handed on (a request sent upstream, then
    /// a timeout or a cut connection): it may have run, so an
    /// outcome-unknown answer was stored instead of releasing the key.
    OutcomeUnknown,
    /// An operator forgot the key (its record was deleted).
    Forgotten,
}

impl AttemptOutcome {
    /// Every outcome, in the order they are declared.
    pub const ALL: [Self; 9] = [
        Self::Executed,
        Self::Replayed,
        Self::Conflict,
        Self::Attached,
        Self::Mismatch,
        Self::Failed,
        Self::Fenced,
        Self::OutcomeUnknown,
        Self::Forgotten,
    ];

    /// The outcome named `name` by [`as_str`](Self::as_str), for a store
    /// that keeps the name in a column.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// Stable lower-case name (for logs, metrics and the timeline).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Attached => "attached",
            Self::Mismatch => "mismatch",
            Self::Failed => "failed",
            Self::Fenced => "fenced",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::Forgotten => "forgotten",
        }
    }
}

/// One entry of a key's timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// When the attempt started (ms since epoch).
    pub at_ms: u64,
    /// Which process handled it (host + pid, or a configured name).
    pub replica: String,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Upstream or response status, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// How long the attempt took, in microseconds (for an entry that
    /// stands for several attempts, the longest of them).
    pub latency_us: u64,
    /// Set when this entry stands for several attempts of the same outcome
    /// from the same replica (replays gathered over one flush of the
    /// timeline, see [`AggregatingStore`](crate::AggregatingStore)); `None` for a single attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated: Option<Repeated>,
}

impl Attempt {
    /// How many attempts this entry stands for (1 unless [`Attempt::repeated`]).
    pub fn count(&self) -> u64 {
        self.repeated.map_or(1, |r| r.count)
    }

    /// When the last attempt this entry stands for started (ms since epoch).
    pub fn last_at_ms(&self) -> u64 {
        self.repeated.map_or(self.at_ms, |r| r.last_at_ms)
    }
}

/// Several attempts kept as one timeline entry: the entry's `at_ms` is the
/// first of them, `last_at_ms` the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repeated {
    /// How many attempts, the first included (at least 2).
    pub count: u64,
    /// When the last of them started (ms since epoch).
    pub last_at_ms: u64,
}

/// Most attempts a store keeps per key; older ones are dropped first.
pub const MAX_TIMELINE: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_monotonic_clock_follows_elapsed_time_not_the_wall_clock() {
        let at = Instant::now();
        // Whatever the wall clock reads now, only the anchor and the
        // monotonic elapsed time count.
        assert_eq!(anchored_ms(1_000, at, at + Duration::from_secs(5)), 6_000);
        assert_eq!(anchored_ms(1_000, at + Duration::from_secs(5), at), 1_000);
        let a = monotonic_ms();
        let b = monotonic_ms();
        assert!(b >= a, "the monotonic clock went back");
    }

    #[test]
    fn every_outcome_is_parsed_back_from_its_name() {
        for o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(AttemptOutcome::parse("exploded"), None);
    }
}
