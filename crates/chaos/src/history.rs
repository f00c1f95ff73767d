//! What a run recorded: every client request and what it got, every
//! operator forget, every fault the nemesis injected, and the final reads
//! made once the faults stopped. The checker judges this, with the
//! upstream's execution log, and nothing else.
//!
//! Times are wall-clock milliseconds since the Unix epoch, read on the
//! one host that runs the clients, the gateways and the upstream, so a
//! client's times and the upstream's execution times share one clock.

use serde::{Deserialize, Serialize};

/// Which record a request addresses: the gateway's scoped key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyId {
    /// The credential the client sent (`Authorization`); the gateway makes
    /// the tenant of it.
    pub credential: String,
    /// The route's name (the gateway's namespace).
    pub route: String,
    /// The client's `Idempotency-Key`.
    pub key: String,
}

/// One event of a stream as a client received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSeen {
    /// The number in its `id:` line (the gateway names events
    /// `RUN-1, RUN-2, …`).
    pub id: Option<u64>,
    /// The run its `id:` line names (`RUN`), if it names one.
    #[serde(default)]
    pub run: Option<u64>,
    /// SHA-256 of the event's bytes without its `id:` line, hex.
    pub sha256: String,
    /// The upstream execution the event names (`chatcmpl-N`), if any.
    pub execution: Option<u64>,
}

/// How a client request ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The response status; `None` when no response head came (refused,
    /// cut or timed out before it).
    pub status: Option<u16>,
    /// `Idempotent-Replayed`, when present.
    pub replayed: Option<bool>,
    /// `Idempotent-Stored`, when present: `false` on a result delivered
    /// although the store never took it (its lease ran out first).
    #[serde(default)]
    pub stored: Option<bool>,
    /// The problem slug of an `application/problem+json` answer.
    pub problem: Option<String>,
    /// The body was read to a clean end (no cut, no client timeout).
    pub complete: bool,
    /// SHA-256 of the body bytes received, hex.
    pub body_sha256: String,
    /// Upstream executions the body names (`chatcmpl-N`), in order, once
    /// each.
    pub executions: Vec<u64>,
    /// A stream's events, in the order received.
    pub events: Vec<EventSeen>,
    /// `Idempotent-Stream-Restarted: true`: a resumption answered with
    /// another run's stream, whole (the client must not stitch it on).
    #[serde(default)]
    pub restarted: bool,
    /// What went wrong on the client's side, if anything.
    pub error: Option<String>,
}

impl Answer {
    /// A final answer: the key's answer, which every later final answer
    /// must repeat. A complete response that is neither a retryable
    /// refusal (408, 409, 425, 429, 5xx) nor a refusal of this request
    /// alone (422 `key-mismatch`, 400); an `outcome-unknown` problem is
    /// final (it is stored as the key's answer). An answer marked
    /// `Idempotent-Stored: false` is not: it was not stored, and a retry
    /// may run the work again.
    pub fn is_final(&self) -> bool {
        let Some(status) = self.status else {
            return false;
        };
        if !self.complete || self.stored == Some(false) {
            return false;
        }
        if self.problem.as_deref() == Some("outcome-unknown") {
            return true;
        }
        if self.problem.is_some() {
            return false;
        }
        !matches!(status, 408 | 409 | 425 | 429 | 500..=599)
    }

    /// A refusal the client may retry: 408, 409, 425, 429, or a 5xx other
    /// than the final `outcome-unknown`.
    pub fn is_retryable(&self) -> bool {
        match self.status {
            None => true,
            Some(_) if self.problem.as_deref() == Some("outcome-unknown") => false,
            Some(s) => matches!(s, 408 | 409 | 425 | 429 | 500..=599),
        }
    }
}

/// One client request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique in the run; sent upstream as `x-sim-tag`, so the upstream's
    /// log names the request behind each execution.
    pub id: u64,
    /// The record addressed.
    pub key: KeyId,
    /// SHA-256 of the request body, hex (the fingerprint's input).
    pub body_sha256: String,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// The replica it was sent to.
    pub replica: usize,
    /// The event number of the `Last-Event-ID` it carried.
    pub last_event_id: Option<u64>,
    /// The run that `Last-Event-ID` named.
    #[serde(default)]
    pub last_event_run: Option<u64>,
    /// The request this one resumes (`Last-Event-ID` after its events).
    pub resumes: Option<u64>,
    /// `x-sim-fail` it asked the upstream for (an upstream cut or error).
    pub upstream_fault: Option<String>,
    /// The client's own timeout, in milliseconds.
    pub timeout_ms: u64,
    /// When it was sent.
    pub invoke_ms: u64,
    /// When it ended (answered, failed or timed out).
    pub complete_ms: u64,
    /// What it got.
    pub answer: Answer,
    /// Sent after the faults stopped, to judge I6.
    pub final_read: bool,
}

/// An operator's forget (`DELETE /admin/keys/{key}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forget {
    /// The record forgotten.
    pub key: KeyId,
    /// The replica whose admin listener was asked.
    pub replica: usize,
    /// When it was sent.
    pub invoke_ms: u64,
    /// When it returned.
    pub complete_ms: u64,
    /// Its status (`None`: no answer).
    pub status: Option<u16>,
}

/// The kinds of fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `kill -9`, then a restart.
    Kill,
    /// SIGSTOP held past the lease, then SIGCONT.
    Pause,
    /// SIGTERM (a rolling restart's stop), then a restart.
    Terminate,
    /// Every store connection aborted (RST) by the FaultProxy in front of
    /// the store.
    StoreCut,
    /// The store's connections stalled (no byte forwarded) for 0.3–1.5 s.
    StoreStall,
    /// A store server killed (SIGKILL, or PostgreSQL's immediate stop) and
    /// started again on its data: the primary of a pair, a random node of
    /// a cluster.
    StoreRestart,
    /// The store's primary killed and its replica promoted: `REPLICAOF NO
    /// ONE` (Redis) or `pg_ctl promote` (PostgreSQL) with the store's
    /// address moved to it, or a cluster master killed until the cluster
    /// promotes its replica; the old node then rejoins as a replica.
    Failover,
    /// One store call applied by the server whose reply is discarded and
    /// its connection aborted (the FaultProxy's `drop_next_reply`).
    DropReply,
    /// Every replica's wall clock stepped (libfaketime), forward or back;
    /// the monotonic clock is untouched, as with an NTP step.
    ClockStep,
}

impl FaultKind {
    /// Every kind on the replicas (the default set).
    pub const ALL: [Self; 3] = [Self::Kill, Self::Pause, Self::Terminate];

    /// Every kind a summary counts.
    pub const EVERY: [Self; 9] = [
        Self::Kill,
        Self::Pause,
        Self::Terminate,
        Self::StoreCut,
        Self::StoreStall,
        Self::StoreRestart,
        Self::Failover,
        Self::DropReply,
        Self::ClockStep,
    ];

    /// The name printed in summaries and taken by `--faults`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Terminate => "terminate",
            Self::StoreCut => "store-cut",
            Self::StoreStall => "store-stall",
            Self::StoreRestart => "store-restart",
            Self::Failover => "failover",
            Self::DropReply => "drop-reply",
            Self::ClockStep => "clock-step",
        }
    }

    /// The kind named `name` (as [`FaultKind::as_str`] spells it).
    pub fn parse(name: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether it acts on the store (its connections or its servers)
    /// rather than on one replica.
    pub fn on_store(self) -> bool {
        matches!(
            self,
            Self::StoreCut
                | Self::StoreStall
                | Self::StoreRestart
                | Self::Failover
                | Self::DropReply
        )
    }

    /// Whether it needs the FaultProxy in front of the store.
    pub fn through_proxy(self) -> bool {
        matches!(self, Self::StoreCut | Self::StoreStall | Self::DropReply)
    }

    /// Whether it needs store servers the run started itself.
    pub fn on_private_servers(self) -> bool {
        matches!(self, Self::StoreRestart | Self::Failover)
    }
}

/// One fault: a replica down or frozen, the store's connections cut or
/// stalled, a store server restarted or failed over, a reply dropped, the
/// clocks stepped, from `start_ms` to `end_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// What was done.
    pub kind: FaultKind,
    /// To which replica (`None`: the store, or every replica's clock).
    pub replica: Option<usize>,
    /// When the signal was sent.
    pub start_ms: u64,
    /// When the replica was serving again (restarted, or continued), or
    /// the store whole again (a failed-over store has its new replica in
    /// sync).
    pub end_ms: u64,
    /// What exactly: the node restarted, the step of a clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A stall of the whole host: a thread that asked to sleep for a few
/// milliseconds woke this much later. Every process on the host was
/// starved alike (an overloaded machine, a paused VM), the replicas among
/// them: for the promise, a frozen process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stall {
    /// When the watchdog should have woken.
    pub start_ms: u64,
    /// When it did.
    pub end_ms: u64,
}

impl Stall {
    /// How long it lasted, in milliseconds.
    pub fn duration_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
    }
}

impl From<idemgate_testkit::stall::Stall> for Stall {
    fn from(s: idemgate_testkit::stall::Stall) -> Self {
        Self {
            start_ms: s.start_ms,
            end_ms: s.end_ms,
        }
    }
}

/// Everything a run recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Client requests, in the order they were sent.
    pub ops: Vec<Op>,
    /// Operator forgets.
    pub forgets: Vec<Forget>,
    /// Faults, in the order they were injected.
    pub faults: Vec<Fault>,
    /// Stalls of the whole host the run observed (no fault injected
    /// them): every process froze, the replicas among them
    /// (`idemgate_testkit::stall`).
    #[serde(default)]
    pub stalls: Vec<Stall>,
    /// When the last fault ended and the final reads began.
    pub quiet_ms: u64,
    /// Routes that charge (`charges = true` in the promise being judged).
    pub charging_routes: Vec<String>,
    /// The lease (`pending_ttl`), in milliseconds.
    pub pending_ttl_ms: u64,
    /// The bound stated for I6 beyond `pending_ttl`, in milliseconds.
    pub settle_bound_ms: u64,
    /// The replicas share one file (SQLite): a replica frozen while it
    /// holds the file's write lock stalls every replica's writes, a store
    /// outage for all of them.
    #[serde(default)]
    pub shared_file: bool,
}

/// The time now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
