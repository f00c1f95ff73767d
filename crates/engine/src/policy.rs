//! [`Policy`]: the engine's lease and record lifetimes, and what a caller
//! that meets a key in flight does.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
            on_inflight: OnInflight::default(),
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

/// What a request gets when its key is PENDING (another request holds
/// it). One concept for the engine, the tower layer and the gateway's
/// routes (`on_inflight = "reject" | "wait" | "attach"`, bounded by
/// `inflight_wait`).
///
/// The default everywhere is [`OnInflight::Attach`] with
/// [`DEFAULT_INFLIGHT_WAIT`]: a duplicate of a streaming request joins
/// the live stream, any other duplicate waits for the stored result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnInflight {
    /// Refuse at once: [`ExecuteError::Inflight`](crate::ExecuteError::Inflight)
    /// from the engine (whose [`Inflight`](crate::Inflight) handle can
    /// still be waited on), 409 with `Retry-After` from the layer.
    Reject,
    /// Wait up to the bound for the other run to finish, then return its
    /// result (or take the key over if that run failed; refuse as
    /// [`Self::Reject`] if it is still running).
    Wait(Duration),
    /// As [`Self::Wait`], except that a duplicate of a streaming response
    /// whose owner runs in this process (or publishes its events through
    /// a shared live channel) joins the live stream: the events so far,
    /// then live ones. The engine's own [`Engine::execute`](crate::Engine::execute)
    /// has no stream to join and waits.
    Attach(Duration),
}

/// The bound of the default [`OnInflight`]: 30 s.
pub const DEFAULT_INFLIGHT_WAIT: Duration = Duration::from_secs(30);

impl Default for OnInflight {
    fn default() -> Self {
        Self::Attach(DEFAULT_INFLIGHT_WAIT)
    }
}

impl OnInflight {
    /// How long a duplicate may wait for the running request: zero for
    /// [`Self::Reject`].
    pub fn wait_bound(self) -> Duration {
        match self {
            Self::Reject => Duration::ZERO,
            Self::Wait(max) | Self::Attach(max) => max,
        }
    }
}
