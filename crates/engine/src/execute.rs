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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::guard::{Completion, LeaseGuard, attempt, record_best_effort};
use crate::inflight::{Inflight, Settled};
use crate::policy::{OnInflight, Policy};
use crate::record::now_ms;
use crate::renewals::Renewals;
use crate::{
    AttemptOutcome, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};

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
    Inflight(Inflight),
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
    Inflight(Inflight),
}

/// The idempotency engine: a store plus a policy.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<dyn Store>,
    policy: Policy,
    replica: Arc<str>,
    /// The runs whose leases this engine renews (`None`: no heartbeat).
    renewals: Option<Arc<Renewals>>,
}

impl Engine {
    /// An engine over `store` with the default [`Policy`].
    pub fn new(store: Arc<dyn Store>) -> Self {
        let policy = Policy::default();
        Self {
            store,
            renewals: renewals_for(&policy),
            policy,
            replica: default_replica().into(),
        }
    }

    /// Replaces the policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.renewals = renewals_for(&policy);
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

    fn guard(&self, lease: Lease) -> LeaseGuard {
        LeaseGuard::start(
            Arc::clone(&self.store),
            lease,
            &self.policy,
            Arc::clone(&self.replica),
            self.renewals.as_ref(),
        )
    }

    /// Claims the key or reports what holds it, without waiting.
    ///
    /// Replays and mismatches are added to the key's timeline here; a
    /// conflict is added by whoever gives up on it ([`Inflight::record_conflict`]).
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
        match SeenThrough::claim(self, key, fingerprint).await? {
            Claim::Acquired(lease) => {
                let guard = self.guard(lease);
                let waited = started.elapsed();
                if waited >= self.policy.pending_ttl / 2 {
                    // A claim acknowledged this late (a commit that waited
                    // out a failover) may be past its lease already, and
                    // another request may hold the key by now: running the
                    // work on it could run it twice. Give it back (a fenced
                    // release, a no-op if it was taken over) and let the
                    // retry find what holds the key.
                    guard.release_logged(None).await;
                    return Err(BeginError::Store(StoreError::new(
                        crate::StoreErrorKind::Unavailable,
                        self.store.backend(),
                        format!(
                            "the claim was acknowledged {} ms after it was sent, past half its {} ms lease",
                            waited.as_millis(),
                            self.policy.pending_ttl.as_millis()
                        ),
                    )));
                }
                Ok(Begin::Owner(guard))
            }
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
            Claim::Existing(record) => Ok(Begin::Inflight(Inflight {
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
                Begin::Inflight(inflight) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Ok(Begin::Inflight(inflight));
                    }
                    match inflight.settled(remaining).await? {
                        Settled::Done(record) if record.fingerprint == *fingerprint => {
                            inflight.note(AttemptOutcome::Attached, None).await;
                            return Ok(Begin::Done(record));
                        }
                        Settled::StillPending => return Ok(Begin::Inflight(inflight)),
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
            OnInflight::Wait(max) | OnInflight::Attach(max) => {
                self.begin_waiting(key, fingerprint, max).await?
            }
            OnInflight::Reject => self.begin(key, fingerprint).await?,
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
            Begin::Inflight(inflight) => {
                inflight.record_conflict().await;
                return Err(ExecuteError::Inflight(inflight));
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
        let origin = match guard
            .complete(Bytes::from(payload), Completion::result(None))
            .await
        {
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

fn renewals_for(policy: &Policy) -> Option<Arc<Renewals>> {
    policy
        .heartbeat
        .filter(|every| !every.is_zero())
        .map(Renewals::new)
}

/// A claim that is seen through when its caller stops waiting for it.
///
/// A caller dropped while its claim is on the wire (a client that hung up,
/// a request timeout) may have claimed the key without knowing: the store
/// wrote PENDING, the answer never arrived. Nobody would release that
/// claim, and the key would stay PENDING, refusing or holding its retries,
/// until the lease expired. Dropped before its answer, this finishes the
/// claim in a task of its own and releases a lease it brings, as a
/// [`LeaseGuard`] dropped unfinished does. Outside a runtime it is dropped,
/// and such a claim frees itself when its lease expires.
struct SeenThrough {
    claim: Option<BoxFuture<'static, Result<Claim, StoreError>>>,
    engine: Engine,
}

impl SeenThrough {
    fn claim(engine: &Engine, key: &ScopedKey, fingerprint: &Fingerprint) -> Self {
        let store = Arc::clone(&engine.store);
        let (key, fingerprint) = (key.clone(), *fingerprint);
        let pending_ttl = engine.policy.pending_ttl;
        Self {
            claim: Some(Box::pin(async move {
                store.claim(&key, &fingerprint, pending_ttl).await
            })),
            engine: engine.clone(),
        }
    }
}

impl Future for SeenThrough {
    type Output = Result<Claim, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(claim) = self.claim.as_mut() else {
            return Poll::Ready(Err(StoreError::new(
                crate::StoreErrorKind::Rejected,
                "engine",
                "a claim was polled after it finished",
            )));
        };
        let out = claim.as_mut().poll(cx);
        if out.is_ready() {
            self.claim = None;
        }
        out
    }
}

impl Drop for SeenThrough {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let engine = self.engine.clone();
        handle.spawn(async move {
            if let Ok(Claim::Acquired(lease)) = claim.await {
                // Dropped unfinished at once: the guard releases the key.
                drop(engine.guard(lease));
            }
        });
    }
}
