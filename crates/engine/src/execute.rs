//! Running work at most once per key: the [`Engine`], its [`Policy`], and
//! what a run returns. This is the module the rest of the crate serves; the
//! records, keys and stores below it know nothing of it.
//!
//! [`Engine::execute`] is the classic "look the key up, run the work, store
//! the result" loop, made safe for slow work, crashes and cancellation:
//!
//! - the claim is one atomic store step (no check-then-set race);
//! - while the work runs, a heartbeat renews the lease every
//!   `pending_ttl / 3`, so `pending_ttl` can be short (orphans of a killed
//!   process rot quickly) while a long generation keeps its claim;
//! - every failure path gives the key back: an error, a panic inside the
//!   work, and the future being dropped (the [`LeaseGuard`] releases on drop);
//! - completion is fenced: if the lease was lost, the result is not stored
//!   and the caller is told ([`Origin::Unstored`]).
//!
//! [`Engine::begin`] is the lower-level form the gateway uses, where the work
//! outlives the request that started it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::record::now_ms;
use crate::{
    Attempt, AttemptOutcome, Claim, Fenced, Fingerprint, Lease, Record, RecordState, ScopedKey,
    Store, StoreError,
};

/// What to do when the key is PENDING (someone else is running the work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnInflight {
    /// Refuse at once ([`ExecuteError::InFlight`]); the caller retries later.
    Reject,
    /// Wait up to the bound for the other run to finish, then return its
    /// result (or take the key over if that run failed).
    Wait(Duration),
    /// Return at once with an [`InFlight`] handle whose
    /// [`settled`](InFlight::settled) resolves when the key is DONE or free.
    Notify,
}

/// TTLs and in-flight behaviour of an [`Engine`].
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

/// Where a returned value came from: whether the store already had it (a
/// "hit"), plus the case where the work ran but its result could not be
/// kept.
#[derive(Debug)]
#[non_exhaustive]
pub enum Origin {
    /// The work ran now and its result is stored.
    Fresh,
    /// The stored result of an earlier run; the work did not run.
    Replayed,
    /// The work ran now, but its result is **not** stored: the lease was
    /// lost to another owner (fenced), or the store failed. A retry may run
    /// the work again.
    Unstored(Unstored),
}

/// Why a fresh result was not stored.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unstored {
    /// The lease expired and was taken over; the store refused the write.
    Fenced,
    /// The store failed while writing the result.
    Store(StoreError),
}

/// A value returned by [`Engine::execute`].
#[derive(Debug)]
pub struct Executed<T> {
    /// The work's value (fresh or replayed).
    pub value: T,
    /// Where it came from.
    pub origin: Origin,
}

impl<T> Executed<T> {
    /// Whether the value was replayed from the store (the work did not run).
    pub fn replayed(&self) -> bool {
        matches!(self.origin, Origin::Replayed)
    }
}

/// Why [`Engine::begin`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BeginError {
    /// The key is held or finished for a request with another fingerprint.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why [`Engine::execute`] returned no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecuteError<E> {
    /// The work returned an error; the key was released, a retry may run it.
    #[error("the work failed")]
    Work(#[source] E),
    /// The key is held or finished for a request with another fingerprint.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// Another run holds the key (and the policy did not wait, or the wait
    /// ran out).
    #[error("another request with this idempotency key is in flight")]
    InFlight(InFlight),
    /// The store failed before the work ran; nothing was executed.
    #[error(transparent)]
    Store(StoreError),
    /// The stored result could not be decoded as the requested type.
    #[error("the stored result cannot be decoded")]
    Decode(#[source] serde_json::Error),
    /// The work's value could not be encoded; the key was released.
    #[error("the result cannot be encoded")]
    Encode(#[source] serde_json::Error),
}

impl<E> From<BeginError> for ExecuteError<E> {
    fn from(e: BeginError) -> Self {
        match e {
            BeginError::Mismatch => Self::Mismatch,
            BeginError::Store(s) => Self::Store(s),
        }
    }
}

/// How [`Engine::begin`] left things.
#[derive(Debug)]
pub enum Begin {
    /// The caller owns the key and must run the work, then
    /// [`complete`](LeaseGuard::complete) or [`release`](LeaseGuard::release).
    Owner(LeaseGuard),
    /// The key is DONE: here is the stored record.
    Done(Record),
    /// Someone else holds the key.
    InFlight(InFlight),
}

/// The idempotency engine: a store plus a policy.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<dyn Store>,
    policy: Policy,
    replica: Arc<str>,
}

impl Engine {
    /// An engine over `store` with the default [`Policy`].
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            policy: Policy::default(),
            replica: default_replica().into(),
        }
    }

    /// Replaces the policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Names this process in timelines (default: host name and pid).
    pub fn with_replica(mut self, replica: impl Into<Arc<str>>) -> Self {
        self.replica = replica.into();
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// This process's name in timelines.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Claims the key or reports what holds it, without waiting.
    ///
    /// Replays and mismatches are added to the key's timeline here; a
    /// conflict is added by whoever gives up on it ([`InFlight::record_conflict`]).
    ///
    /// # Errors
    /// [`BeginError::Mismatch`] for a different fingerprint, or a store error.
    pub async fn begin(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
    ) -> Result<Begin, BeginError> {
        let started = Instant::now();
        let at_ms = now_ms();
        match self
            .store
            .claim(key, fingerprint, self.policy.pending_ttl)
            .await?
        {
            Claim::Acquired(lease) => Ok(Begin::Owner(LeaseGuard::start(
                Arc::clone(&self.store),
                lease,
                &self.policy,
                Arc::clone(&self.replica),
            ))),
            Claim::Existing(record) if record.fingerprint != *fingerprint => {
                self.note(key, AttemptOutcome::Mismatch, at_ms, started)
                    .await;
                Err(BeginError::Mismatch)
            }
            Claim::Existing(record) if record.is_done() => {
                self.note(key, AttemptOutcome::Replayed, at_ms, started)
                    .await;
                Ok(Begin::Done(record))
            }
            Claim::Existing(record) => Ok(Begin::InFlight(InFlight {
                store: Arc::clone(&self.store),
                key: key.clone(),
                record,
                replica: Arc::clone(&self.replica),
                done_ttl: self.policy.done_ttl,
                at_ms,
                started,
            })),
        }
    }

    /// Like [`Engine::begin`], but on a PENDING key waits up to `max_wait`
    /// for the other run to settle: returns its result when it is DONE, or
    /// claims the key when that run gave it up.
    ///
    /// # Errors
    /// As [`Engine::begin`].
    pub async fn begin_waiting(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin, BeginError> {
        let deadline = Instant::now() + max_wait;
        loop {
            match self.begin(key, fingerprint).await? {
                Begin::InFlight(inflight) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Ok(Begin::InFlight(inflight));
                    }
                    match inflight.settled(remaining).await? {
                        Settled::Done(record) if record.fingerprint == *fingerprint => {
                            inflight.note(AttemptOutcome::Attached, None).await;
                            return Ok(Begin::Done(record));
                        }
                        Settled::StillPending => return Ok(Begin::InFlight(inflight)),
                        // Released, expired, or replaced: claim again.
                        Settled::Done(_) | Settled::Free => {}
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// Runs `work` at most once for `key` and returns its value, or the
    /// stored value of the run that already happened.
    ///
    /// The value is stored as JSON. On a PENDING key the policy's
    /// [`OnInflight`] decides. The key is released if the work errors,
    /// panics (the panic then continues) or is cancelled.
    ///
    /// # Errors
    /// See [`ExecuteError`].
    pub async fn execute<T, E, F, Fut>(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        work: F,
    ) -> Result<Executed<T>, ExecuteError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let begin = match self.policy.on_inflight {
            OnInflight::Wait(max) => self.begin_waiting(key, fingerprint, max).await?,
            OnInflight::Reject | OnInflight::Notify => self.begin(key, fingerprint).await?,
        };
        let guard = match begin {
            Begin::Owner(guard) => guard,
            Begin::Done(record) => {
                let payload = record.payload().cloned().unwrap_or_default();
                let value = serde_json::from_slice(&payload).map_err(ExecuteError::Decode)?;
                return Ok(Executed {
                    value,
                    origin: Origin::Replayed,
                });
            }
            Begin::InFlight(inflight) => {
                if self.policy.on_inflight != OnInflight::Notify {
                    inflight.record_conflict().await;
                }
                return Err(ExecuteError::InFlight(inflight));
            }
        };
        let outcome = AssertUnwindSafe(work()).catch_unwind().await;
        let value = match outcome {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => {
                guard.release_logged(None).await;
                return Err(ExecuteError::Work(e));
            }
            Err(panic) => {
                guard.release_logged(None).await;
                std::panic::resume_unwind(panic);
            }
        };
        let payload = match serde_json::to_vec(&value) {
            Ok(p) => p,
            Err(e) => {
                guard.release_logged(None).await;
                return Err(ExecuteError::Encode(e));
            }
        };
        let origin = match guard.complete(Bytes::from(payload), None).await {
            Ok(Fenced::Applied) => Origin::Fresh,
            Ok(Fenced::Stale) => Origin::Unstored(Unstored::Fenced),
            Err(e) => Origin::Unstored(Unstored::Store(e)),
        };
        Ok(Executed { value, origin })
    }

    async fn note(&self, key: &ScopedKey, outcome: AttemptOutcome, at_ms: u64, started: Instant) {
        let attempt = attempt(&self.replica, outcome, None, at_ms, started);
        record_best_effort(&*self.store, key, &attempt, self.policy.done_ttl).await;
    }
}

fn attempt(
    replica: &str,
    outcome: AttemptOutcome,
    status: Option<u16>,
    at_ms: u64,
    started: Instant,
) -> Attempt {
    Attempt {
        at_ms,
        replica: replica.to_owned(),
        outcome,
        status,
        latency_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    }
}

async fn record_best_effort(store: &dyn Store, key: &ScopedKey, attempt: &Attempt, ttl: Duration) {
    if let Err(e) = store.record_attempt(key, attempt, ttl).await {
        tracing::warn!(error = %e, outcome = attempt.outcome.as_str(), "timeline entry not recorded");
    }
}

/// `host-pid`, so timelines say which process handled an attempt.
fn default_replica() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".to_owned());
    format!("{host}-{}", std::process::id())
}

/// How a PENDING key settled, as seen by a waiter.
#[derive(Debug)]
pub enum Settled {
    /// The key is DONE (check the fingerprint before using it).
    Done(Record),
    /// The key is free again: its run failed or its lease expired.
    Free,
    /// The wait ran out with the key still PENDING.
    StillPending,
}

/// A key found PENDING: who holds it, and a way to wait for it.
#[derive(Debug)]
pub struct InFlight {
    store: Arc<dyn Store>,
    key: ScopedKey,
    record: Record,
    replica: Arc<str>,
    done_ttl: Duration,
    at_ms: u64,
    started: Instant,
}

impl InFlight {
    /// The PENDING record as it was found.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// A reasonable `Retry-After`: the time left on the holder's lease,
    /// at least one second.
    pub fn retry_after(&self) -> Duration {
        let left = match self.record.state {
            RecordState::Pending {
                lease_expires_at_ms,
                ..
            } => lease_expires_at_ms.saturating_sub(now_ms()),
            RecordState::Done { .. } => 0,
        };
        Duration::from_millis(left.clamp(1000, 60_000) / 1000 * 1000)
    }

    /// Waits up to `max` for the key to leave PENDING. Uses the store's
    /// change notifications; re-reads the record after each wake-up.
    ///
    /// # Errors
    /// A store error while reading.
    pub async fn settled(&self, max: Duration) -> Result<Settled, StoreError> {
        let deadline = Instant::now() + max;
        loop {
            match self.store.get(&self.key).await? {
                None => return Ok(Settled::Free),
                Some(record) if record.is_done() => return Ok(Settled::Done(record)),
                Some(_) => {}
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(Settled::StillPending);
            }
            // Bounded slices: a wake-up missed between `get` and `changed`
            // (or a change made by another process) costs at most one slice.
            self.store
                .changed(&self.key, remaining.min(Duration::from_millis(100)))
                .await;
        }
    }

    /// Adds this attempt to the key's timeline as a conflict.
    pub async fn record_conflict(&self) {
        self.note(AttemptOutcome::Conflict, None).await;
    }

    /// Adds this attempt to the key's timeline with `outcome`.
    pub async fn note(&self, outcome: AttemptOutcome, status: Option<u16>) {
        let a = attempt(&self.replica, outcome, status, self.at_ms, self.started);
        record_best_effort(&*self.store, &self.key, &a, self.done_ttl).await;
    }
}

/// Ownership of a PENDING key while the work runs.
///
/// Renews the lease in the background; dropping the guard without calling
/// [`complete`](Self::complete) or [`release`](Self::release) releases the
/// key (from a spawned task), so a cancelled request never locks its key.
#[derive(Debug)]
pub struct LeaseGuard {
    store: Arc<dyn Store>,
    lease: Lease,
    replica: Arc<str>,
    done_ttl: Duration,
    at_ms: u64,
    started: Instant,
    heartbeat: Option<JoinHandle<()>>,
    lost: Arc<AtomicBool>,
    /// How long a lease lasts from its last renewal.
    pending_ttl: Duration,
    /// When the last renewal that applied was sent, in ms after `started`
    /// (0: none yet). Measured on the monotonic clock of this process.
    renewed_at: Arc<AtomicU64>,
    finished: bool,
}

impl LeaseGuard {
    fn start(store: Arc<dyn Store>, lease: Lease, policy: &Policy, replica: Arc<str>) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let renewed_at = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let heartbeat = policy.heartbeat.filter(|d| !d.is_zero()).and_then(|every| {
            let handle = tokio::runtime::Handle::try_current().ok()?;
            Some(handle.spawn(heartbeat(
                Arc::clone(&store),
                lease.clone(),
                every,
                policy.pending_ttl,
                Arc::clone(&lost),
                Renewals {
                    started,
                    at: Arc::clone(&renewed_at),
                },
            )))
        });
        Self {
            store,
            lease,
            replica,
            done_ttl: policy.done_ttl,
            at_ms: now_ms(),
            started,
            heartbeat,
            lost,
            pending_ttl: policy.pending_ttl,
            renewed_at,
            finished: false,
        }
    }

    /// Time left before the lease may lapse, as far as this process knows:
    /// from the send of the last renewal that applied (or from the claim),
    /// `pending_ttl` less a tenth of it as a safety margin.
    pub fn lease_time_left(&self) -> Duration {
        let renewed = Duration::from_millis(self.renewed_at.load(Ordering::Relaxed));
        let lasts = self.pending_ttl.saturating_sub(self.pending_ttl / 10);
        (self.started + renewed + lasts).saturating_duration_since(Instant::now())
    }

    /// The lease held.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether a heartbeat found the lease taken over. The work may go on,
    /// but its result will be fenced.
    pub fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// When this run started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Stores the result (PENDING → DONE). `status` goes into the timeline.
    ///
    /// # Errors
    /// A store error; the guard then releases the key on drop.
    pub async fn complete(self, payload: Bytes, status: Option<u16>) -> Result<Fenced, StoreError> {
        self.complete_as(AttemptOutcome::Executed, payload, status)
            .await
    }

    /// Stores an answer that says the work's outcome is unknown (it failed
    /// after being handed on, and may have run), as the key's final answer:
    /// like [`LeaseGuard::complete`], with the attempt recorded as
    /// [`AttemptOutcome::OutcomeUnknown`] so the timeline says why.
    ///
    /// # Errors
    /// A store error; the guard then releases the key on drop.
    pub async fn complete_unknown(
        self,
        payload: Bytes,
        status: Option<u16>,
    ) -> Result<Fenced, StoreError> {
        self.complete_as(AttemptOutcome::OutcomeUnknown, payload, status)
            .await
    }

    async fn complete_as(
        mut self,
        outcome: AttemptOutcome,
        payload: Bytes,
        status: Option<u16>,
    ) -> Result<Fenced, StoreError> {
        self.stop_heartbeat();
        let a = attempt(&self.replica, outcome, status, self.at_ms, self.started);
        let written = self
            .store
            .complete(&self.lease, payload, self.done_ttl, &a)
            .await?;
        self.finished = true;
        if written == Fenced::Stale {
            let a = attempt(
                &self.replica,
                AttemptOutcome::Fenced,
                status,
                self.at_ms,
                self.started,
            );
            record_best_effort(&*self.store, &self.lease.key, &a, self.done_ttl).await;
        }
        Ok(written)
    }

    /// Stores the result like [`LeaseGuard::complete`], but a temporary
    /// store error does not lose it: the result stays in memory, the
    /// heartbeat keeps the lease, and the write is tried again with backoff
    /// (50 ms doubling to 1 s, never past the lease) while the lease has
    /// time left ([`LeaseGuard::lease_time_left`]). `held` is
    /// called with each temporary error before its retry, so the caller can
    /// count and log it (and serve the held result meanwhile).
    ///
    /// A retry after a write whose reply was lost is safe: the store
    /// acknowledges the DONE record this lease wrote with the same payload.
    ///
    /// # Errors
    /// A permanent store error, or a temporary one once the lease has no
    /// time left for another try; the guard then releases the key on drop.
    pub async fn complete_or_hold(
        self,
        payload: Bytes,
        status: Option<u16>,
        held: impl FnMut(&StoreError),
    ) -> Result<Fenced, StoreError> {
        self.hold_as(AttemptOutcome::Executed, payload, status, held)
            .await
    }

    /// [`LeaseGuard::complete_unknown`] with the holding and retrying of
    /// [`LeaseGuard::complete_or_hold`].
    ///
    /// # Errors
    /// As [`LeaseGuard::complete_or_hold`].
    pub async fn complete_unknown_or_hold(
        self,
        payload: Bytes,
        status: Option<u16>,
        held: impl FnMut(&StoreError),
    ) -> Result<Fenced, StoreError> {
        self.hold_as(AttemptOutcome::OutcomeUnknown, payload, status, held)
            .await
    }

    async fn hold_as(
        mut self,
        outcome: AttemptOutcome,
        payload: Bytes,
        status: Option<u16>,
        mut held: impl FnMut(&StoreError),
    ) -> Result<Fenced, StoreError> {
        let a = attempt(&self.replica, outcome, status, self.at_ms, self.started);
        let mut backoff = Duration::from_millis(50);
        let written = loop {
            match self
                .store
                .complete(&self.lease, payload.clone(), self.done_ttl, &a)
                .await
            {
                Ok(written) => break written,
                Err(e) if e.is_temporary() && !self.lease_time_left().is_zero() => {
                    held(&e);
                    tokio::time::sleep(backoff.min(self.lease_time_left())).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    self.stop_heartbeat();
                    return Err(e);
                }
            }
        };
        self.stop_heartbeat();
        self.finished = true;
        if written == Fenced::Stale {
            let a = attempt(
                &self.replica,
                AttemptOutcome::Fenced,
                status,
                self.at_ms,
                self.started,
            );
            record_best_effort(&*self.store, &self.lease.key, &a, self.done_ttl).await;
        }
        Ok(written)
    }

    /// Gives the key up (PENDING → absent) so a retry runs the work again.
    ///
    /// # Errors
    /// A store error; the record then expires after `pending_ttl`.
    pub async fn release(mut self, status: Option<u16>) -> Result<Fenced, StoreError> {
        self.stop_heartbeat();
        self.finished = true;
        let a = attempt(
            &self.replica,
            AttemptOutcome::Failed,
            status,
            self.at_ms,
            self.started,
        );
        self.store.release(&self.lease, &a, self.done_ttl).await
    }

    async fn release_logged(self, status: Option<u16>) {
        if let Err(e) = self.release(status).await {
            tracing::warn!(error = %e, "release failed; the key frees itself when its lease expires");
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop_heartbeat();
        if self.finished {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "lease dropped outside a runtime; the key frees itself when its lease expires"
            );
            return;
        };
        let store = Arc::clone(&self.store);
        let lease = self.lease.clone();
        let a = attempt(
            &self.replica,
            AttemptOutcome::Failed,
            None,
            self.at_ms,
            self.started,
        );
        let ttl = self.done_ttl;
        handle.spawn(async move {
            if let Err(e) = store.release(&lease, &a, ttl).await {
                tracing::warn!(error = %e, "release of a dropped lease failed");
            }
        });
    }
}

/// Where the heartbeat notes its renewals for [`LeaseGuard::lease_time_left`].
struct Renewals {
    started: Instant,
    at: Arc<AtomicU64>,
}

async fn heartbeat(
    store: Arc<dyn Store>,
    mut lease: Lease,
    every: Duration,
    pending_ttl: Duration,
    lost: Arc<AtomicBool>,
    renewals: Renewals,
) {
    loop {
        tokio::time::sleep(every).await;
        let sent = renewals.started.elapsed();
        match store.renew(&mut lease, pending_ttl).await {
            Ok(Fenced::Applied) => {
                let ms = u64::try_from(sent.as_millis()).unwrap_or(u64::MAX);
                renewals.at.fetch_max(ms, Ordering::Relaxed);
            }
            Ok(Fenced::Stale) => {
                lost.store(true, Ordering::Relaxed);
                tracing::warn!(key = %lease.key.key, "lease lost: another owner took the key over");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "lease renewal failed; retrying"),
        }
    }
}
