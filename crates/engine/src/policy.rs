//! [`Policy`]: the engine's lease and record lifetimes, and what a caller
//! that meets a key in flight does.

use std::time::Duration;

/// TTLs and in-flight behaviour of an [`Engine`](crate::Engine).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Lease length. Short, so a crashed owner's claim rots quickly; the
    /// heartbeat keeps a live owner's claim.
    pub pending_ttl: Duration,
    /// How long a DONE record (and the key's timeline) is kept. Must cover
    /// the longest retry window twice (`idemgate check` verifies it).
    pub done_ttl: Duration,
    /// Interval of lease renewal while work runs; `None` disables it (then
    /// `pending_ttl` must exceed the longest run).
    pub heartbeat: Option<Duration>,
    /// What a caller meeting a PENDING key gets.
    pub on_inflight: OnInflight,
}

impl Default for Policy {
    fn default() -> Self {
        let pending_ttl = Duration::from_secs(30);
        Self {
            pending_ttl,
            done_ttl: Duration::from_secs(24 * 3600),
            heartbeat: Some(pending_ttl / 3),
            on_inflight: OnInflight::Reject,
        }
    }
}

impl Policy {
    /// Sets `pending_ttl` and a heartbeat of a third of it.
    pub fn pending_ttl(mut self, ttl: Duration) -> Self {
        self.pending_ttl = ttl;
        self.heartbeat = Some(ttl / 3);
        self
    }

    /// Sets `done_ttl`.
    pub fn done_ttl(mut self, ttl: Duration) -> Self {
        self.done_ttl = ttl;
        self
    }

    /// Sets the in-flight behaviour.
    pub fn on_inflight(mut self, on_inflight: OnInflight) -> Self {
        self.on_inflight = on_inflight;
        self
    }
}

/// What to do when the key is PENDING (someone else is running the work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnInflight {
    /// Refuse at once ([`ExecuteError::InFlight`](crate::ExecuteError::InFlight)); the caller retries later.
    Reject,
    /// Wait up to the bound for the other run to finish, then return its
    /// result (or take the key over if that run failed).
    Wait(Duration),
    /// Return at once with an [`InFlight`](crate::InFlight) handle whose
    /// [`settled`](crate::InFlight::settled) resolves when the key is DONE or free.
    Notify,
}
