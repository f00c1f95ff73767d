//! The owner's side of a claimed key: [`LeaseGuard`] keeps the lease alive
//! with a heartbeat while the work runs (registered with its engine's
//! renewals, which give a run its own task only once it lives long enough
//! to need a renewal), writes DONE (fenced by the lease,
//! holding the result through temporary store errors), and gives the key
//! back on every other path, drop included.
//!
//! A leaf below [`crate::execute`]: the engine hands a guard out; the guard
//! knows only the store, its lease and where it is registered for renewals.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::policy::Policy;
use crate::record::now_ms;
use crate::renewals::{Registration, Renewals, Run};
use crate::{Attempt, AttemptOutcome, Fenced, Lease, ScopedKey, Store, StoreError};

pub(crate) fn attempt(
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
        repeated: None,
    }
}

pub(crate) async fn record_best_effort(
    store: &dyn Store,
    key: &ScopedKey,
    attempt: &Attempt,
    ttl: Duration,
) {
    if let Err(e) = store.record_attempt(key, attempt, ttl).await {
        tracing::warn!(error = %e, outcome = attempt.outcome.as_str(), "timeline entry not recorded");
    }
}

/// Ownership of a PENDING key while the work runs.
///
/// Renews the lease in the background; dropping the guard without calling
/// [`complete`](Self::complete) or [`release`](Self::release) releases the
/// key (from a spawned task), so a cancelled request never locks its key.
#[derive(Debug)]
pub struct LeaseGuard {
    run: Arc<Run>,
    replica: Arc<str>,
    done_ttl: Duration,
    at_ms: u64,
    /// The run's place among its engine's renewals (`None`: not renewed).
    renewals: Option<Registration>,
    finished: bool,
}

impl LeaseGuard {
    pub(crate) fn start(
        store: Arc<dyn Store>,
        lease: Lease,
        policy: &Policy,
        replica: Arc<str>,
        renewals: Option<&Arc<Renewals>>,
    ) -> Self {
        let run = Arc::new(Run::new(store, lease, policy.pending_ttl));
        let renewals = renewals.and_then(|r| r.register(&run));
        Self {
            run,
            replica,
            done_ttl: policy.done_ttl,
            at_ms: now_ms(),
            renewals,
            finished: false,
        }
    }

    /// Time left before the lease may lapse, as far as this process knows:
    /// from the send of the last renewal that applied (or from the claim),
    /// `pending_ttl` less a tenth of it as a safety margin.
    pub fn lease_time_left(&self) -> Duration {
        let run = &self.run;
        let renewed = Duration::from_millis(run.renewed_at.load(Ordering::Relaxed));
        let lasts = run.pending_ttl.saturating_sub(run.pending_ttl / 10);
        (run.started + renewed + lasts).saturating_duration_since(Instant::now())
    }

    /// Stops renewing the lease, once a renewal on its way (if any) has
    /// landed: after this returns, nothing of this guard writes the record
    /// until [`complete`](Self::complete) or [`release`](Self::release).
    ///
    /// For completing inside a caller's transaction at REPEATABLE READ or
    /// SERIALIZABLE: a renewal committed after the transaction's snapshot
    /// would make its completion fail with a serialization error. Without
    /// renewals the lease lapses after `pending_ttl`, so the store must keep
    /// the record from being taken over meanwhile (PostgreSQL's `lock_in`
    /// locks the row for the rest of the transaction).
    pub async fn pause_heartbeat(&mut self) {
        let run = Arc::clone(&self.run);
        let inflight = run.renewing.lock().await;
        self.stop_heartbeat();
        drop(inflight);
    }

    /// The lease held.
    pub fn lease(&self) -> &Lease {
        &self.run.lease
    }

    /// Whether a heartbeat found the lease taken over. The work may go on,
    /// but its result will be fenced.
    pub fn lease_lost(&self) -> bool {
        self.run.lost.load(Ordering::Relaxed)
    }

    /// When this run started.
    pub fn started(&self) -> Instant {
        self.run.started
    }

    /// Stores the result (PENDING → DONE), fenced by this guard's lease:
    /// `how` says what the payload is (the work's result, or an answer
    /// saying its outcome is unknown), the status the timeline records,
    /// and whether a temporary store error is held and retried
    /// ([`Completion::holding`]).
    ///
    /// A retry after a write whose reply was lost is safe: the store
    /// acknowledges the DONE record this lease wrote with the same payload.
    ///
    /// # Errors
    /// A store error (a permanent one, or for a holding completion a
    /// temporary one once the lease has no time left for another try);
    /// the guard then releases the key on drop.
    pub async fn complete(self, payload: Bytes, how: Completion<'_>) -> Result<Fenced, StoreError> {
        match how.on_held {
            Some(on_held) => {
                self.hold_as(how.outcome, payload, how.status, on_held)
                    .await
            }
            None => self.complete_as(how.outcome, payload, how.status).await,
        }
    }

    async fn complete_as(
        mut self,
        outcome: AttemptOutcome,
        payload: Bytes,
        status: Option<u16>,
    ) -> Result<Fenced, StoreError> {
        self.stop_heartbeat();
        let a = attempt(&self.replica, outcome, status, self.at_ms, self.run.started);
        let written = self
            .run
            .store
            .complete(&self.run.lease, payload, self.done_ttl, &a)
            .await?;
        self.finished = true;
        if written == Fenced::Stale {
            let a = attempt(
                &self.replica,
                AttemptOutcome::Fenced,
                status,
                self.at_ms,
                self.run.started,
            );
            record_best_effort(&*self.run.store, &self.run.lease.key, &a, self.done_ttl).await;
        }
        Ok(written)
    }

    async fn hold_as(
        mut self,
        outcome: AttemptOutcome,
        payload: Bytes,
        status: Option<u16>,
        held: &mut (dyn FnMut(&StoreError) + Send),
    ) -> Result<Fenced, StoreError> {
        let a = attempt(&self.replica, outcome, status, self.at_ms, self.run.started);
        let mut backoff = Duration::from_millis(50);
        let written = loop {
            match self
                .run
                .store
                .complete(&self.run.lease, payload.clone(), self.done_ttl, &a)
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
                self.run.started,
            );
            record_best_effort(&*self.run.store, &self.run.lease.key, &a, self.done_ttl).await;
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
            self.run.started,
        );
        self.run
            .store
            .release(&self.run.lease, &a, self.done_ttl)
            .await
    }

    pub(crate) async fn release_logged(self, status: Option<u16>) {
        if let Err(e) = self.release(status).await {
            tracing::warn!(error = %e, "release failed; the key frees itself when its lease expires");
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(renewals) = self.renewals.take() {
            renewals.end();
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
        let run = Arc::clone(&self.run);
        let a = attempt(
            &self.replica,
            AttemptOutcome::Failed,
            None,
            self.at_ms,
            self.run.started,
        );
        let ttl = self.done_ttl;
        handle.spawn(async move {
            if let Err(e) = run.store.release(&run.lease, &a, ttl).await {
                tracing::warn!(error = %e, "release of a dropped lease failed");
            }
        });
    }
}

/// How [`LeaseGuard::complete`] writes a result.
///
/// ```
/// # use idemgate_engine::Completion;
/// // The work's result, answered 200; a store error fails the write.
/// let plain = Completion::result(Some(200));
/// // An answer saying the work may have run (it failed after it was
/// // handed on); temporary store errors are held and retried.
/// let mut held = 0;
/// let mut on_held = |_: &idemgate_engine::StoreError| held += 1;
/// let kept = Completion::outcome_unknown(Some(504)).holding(&mut on_held);
/// # let _ = (plain, kept);
/// ```
pub struct Completion<'a> {
    outcome: AttemptOutcome,
    status: Option<u16>,
    on_held: Option<&'a mut (dyn FnMut(&StoreError) + Send)>,
}

impl<'a> Completion<'a> {
    /// The work's result. `status` goes into the timeline.
    pub fn result(status: Option<u16>) -> Self {
        Self {
            outcome: AttemptOutcome::Executed,
            status,
            on_held: None,
        }
    }

    /// An answer saying the work's outcome is unknown (it failed after
    /// being handed on, and may have run), stored as the key's final
    /// answer; the timeline records the attempt as
    /// [`AttemptOutcome::OutcomeUnknown`] so it says why.
    pub fn outcome_unknown(status: Option<u16>) -> Self {
        Self {
            outcome: AttemptOutcome::OutcomeUnknown,
            status,
            on_held: None,
        }
    }

    /// A temporary store error does not lose the result: it stays in
    /// memory, the heartbeat keeps the lease, and the write is tried again
    /// with backoff (50 ms doubling to 1 s, never past the lease) while
    /// the lease has time left ([`LeaseGuard::lease_time_left`]).
    /// `on_held` is called with each temporary error before its retry, so
    /// the caller can count and log it.
    pub fn holding(mut self, on_held: &'a mut (dyn FnMut(&StoreError) + Send)) -> Self {
        self.on_held = Some(on_held);
        self
    }
}

impl std::fmt::Debug for Completion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("outcome", &self.outcome)
            .field("status", &self.status)
            .field("holding", &self.on_held.is_some())
            .finish()
    }
}
