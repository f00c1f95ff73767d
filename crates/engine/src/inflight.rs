//! The waiter's side of a key found PENDING: [`Inflight`] (who holds it,
//! how long to wait) and how the wait [`Settled`].
//!
//! Apart from [`crate::execute`] because a waiter needs none of the
//! engine's running machinery, only the store and the record it found.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::guard::{attempt, record_best_effort};
use crate::record::now_ms;
use crate::{AttemptOutcome, Record, RecordState, ScopedKey, Store, StoreError};

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
pub struct Inflight {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key: ScopedKey,
    pub(crate) record: Record,
    pub(crate) replica: Arc<str>,
    pub(crate) done_ttl: Duration,
    pub(crate) at_ms: u64,
    pub(crate) started: Instant,
}

impl Inflight {
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
