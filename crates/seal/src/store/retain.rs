//! What [`SealedStore`](super::SealedStore) keeps in memory about the
//! leases it handed out, and for how long.
//!
//! Sealing draws a fresh random nonce, so the same answer sealed twice
//! gives two different byte strings. A store recognises a retried
//! `complete` (sent again after a temporary error although the first write
//! had landed: its reply was lost) by comparing the payload with the DONE
//! record the lease already wrote, so the retry must carry the very bytes
//! of the first try. For that the wrapper keeps, per lease, the sealed
//! bytes of its last `complete` and a SHA-256 digest of the plaintext they
//! seal: the digest tells a retry of the same answer from another answer,
//! and no plaintext stays in memory once `complete` has returned.
//!
//! How long each piece is kept:
//!
//! | what | until |
//! |---|---|
//! | fingerprint of a lease | released, or dropped with its completion (below); pruned past [`FORGET_AFTER`] once more than 10,000 are held |
//! | sealed bytes of a `complete` that failed with a temporary error | the lease is released or completed (the engine retries while the lease lasts) |
//! | … that failed with a permanent error | dropped at once: nothing retries it |
//! | sealed bytes of an acknowledged `complete` | [`RETRY_WINDOW`] after the acknowledgement, and at most 16 MiB or 10,000 completions in all, oldest dropped first |
//!
//! A background task (spawned when the wrapper is built inside a tokio
//! runtime) drops acknowledged completions when their window ends, so a
//! quiet replica holds no answers a few seconds after its last request. It
//! sleeps until the next expiry, never polls, and ends when the wrapper is
//! dropped. Built outside a runtime, expired entries go at the next call.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use bytes::Bytes;
use idemgate_engine::Fingerprint;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{FORGET_AFTER, RETRY_WINDOW};
use crate::SealError;

/// Above this many remembered leases, those older than [`FORGET_AFTER`] are
/// dropped; also the most acknowledged completions kept.
const PRUNE_ABOVE: usize = 10_000;

/// Most sealed bytes of acknowledged completions kept at once.
const COMPLETED_BYTES: usize = 16 * 1024 * 1024;

/// The last payload sealed for a lease.
struct Sealed {
    /// SHA-256 of the plaintext.
    digest: [u8; 32],
    /// Its sealed form, as sent to the backend.
    bytes: Bytes,
}

/// What is remembered of one lease.
struct LeaseEntry {
    fingerprint: Fingerprint,
    sealed: Option<Sealed>,
    /// Its `complete` was acknowledged (it is in the completion queue).
    acknowledged: bool,
    at: Instant,
}

/// An acknowledged completion whose sealed bytes are still kept.
struct Completed {
    token: u128,
    size: usize,
    until: Instant,
}

#[derive(Default)]
struct State {
    leases: HashMap<u128, LeaseEntry>,
    /// Acknowledged completions, oldest first. One window for all, so
    /// this is also the order in which they expire.
    completed: VecDeque<Completed>,
    /// Sum of the sizes in `completed`.
    completed_bytes: usize,
}

impl State {
    /// Drops the completions whose window ended by `now`; returns when the
    /// next one ends.
    fn purge(&mut self, now: Instant) -> Option<Instant> {
        while let Some(first) = self.completed.front() {
            if first.until > now {
                return Some(first.until);
            }
            self.pop_completed();
        }
        None
    }

    fn pop_completed(&mut self) {
        if let Some(old) = self.completed.pop_front() {
            self.completed_bytes -= old.size;
            self.leases.remove(&old.token);
        }
    }
}

/// The state behind [`Retained`], shared with the purge task (which holds
/// it weakly, so dropping the wrapper frees it).
struct Shared {
    /// A std mutex: it is never held across an `.await`, and sealing
    /// happens outside it.
    state: Mutex<State>,
    /// Wakes the purge task when a first completion is queued, or when the
    /// wrapper is dropped. Apart from `state` so the task can wait on it
    /// without keeping the state alive.
    wake: Arc<Notify>,
}

/// The lease memory of a [`SealedStore`](super::SealedStore).
pub(super) struct Retained {
    shared: Arc<Shared>,
}

impl Retained {
    /// Empty; spawns the purge task if called inside a tokio runtime.
    pub(super) fn new() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Arc::new(Notify::new()),
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(purge_task(
                Arc::downgrade(&shared),
                Arc::clone(&shared.wake),
            ));
        }
        Self { shared }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A lease handed out by `claim`.
    pub(super) fn remember(&self, token: u128, fingerprint: Fingerprint) {
        let now = Instant::now();
        let mut state = self.lock();
        state.purge(now);
        if state.leases.len() >= PRUNE_ABOVE {
            state
                .leases
                .retain(|_, e| now.saturating_duration_since(e.at) < FORGET_AFTER);
        }
        state.leases.insert(
            token,
            LeaseEntry {
                fingerprint,
                sealed: None,
                acknowledged: false,
                at: now,
            },
        );
    }

    /// The fingerprint the lease `token` was claimed with, if remembered.
    pub(super) fn fingerprint(&self, token: u128) -> Option<Fingerprint> {
        self.lock().leases.get(&token).map(|e| e.fingerprint)
    }

    /// `payload` sealed for the lease `token`: the bytes sealed before for
    /// the same payload, or `seal`'s (remembered if the lease is).
    pub(super) fn sealed_for(
        &self,
        token: u128,
        payload: &[u8],
        seal: impl FnOnce() -> Result<Vec<u8>, SealError>,
    ) -> Result<Bytes, SealError> {
        let digest: [u8; 32] = Sha256::digest(payload).into();
        if let Some(sealed) = self
            .lock()
            .leases
            .get(&token)
            .and_then(|e| e.sealed.as_ref())
            .filter(|s| s.digest == digest)
        {
            return Ok(sealed.bytes.clone());
        }
        // Sealed outside the lock: a large payload does not hold up the
        // other requests' claims.
        let bytes = Bytes::from(seal()?);
        if let Some(entry) = self.lock().leases.get_mut(&token) {
            entry.sealed = Some(Sealed {
                digest,
                bytes: bytes.clone(),
            });
        }
        Ok(bytes)
    }

    /// The `complete` of lease `token` was acknowledged: its sealed bytes
    /// stay for [`RETRY_WINDOW`], or until newer completions push them out.
    pub(super) fn completed(&self, token: u128) {
        let now = Instant::now();
        let first = {
            let mut state = self.lock();
            state.purge(now);
            let Some(entry) = state.leases.get_mut(&token) else {
                return;
            };
            if entry.acknowledged {
                // A retry of an acknowledged write: its window runs on.
                return;
            }
            let Some(size) = entry.sealed.as_ref().map(|s| s.bytes.len()) else {
                state.leases.remove(&token);
                return;
            };
            entry.acknowledged = true;
            let first = state.completed.is_empty();
            state.completed.push_back(Completed {
                token,
                size,
                until: now + RETRY_WINDOW,
            });
            state.completed_bytes += size;
            while state.completed_bytes > COMPLETED_BYTES || state.completed.len() > PRUNE_ABOVE {
                state.pop_completed();
            }
            first
        };
        if first {
            self.shared.wake.notify_one();
        }
    }

    /// The `complete` of lease `token` failed for good: no retry will send
    /// its sealed bytes again.
    pub(super) fn forget_sealed(&self, token: u128) {
        if let Some(entry) = self.lock().leases.get_mut(&token) {
            entry.sealed = None;
        }
    }

    /// The lease `token` was released: nothing of it is needed any more.
    pub(super) fn drop_lease(&self, token: u128) {
        self.lock().leases.remove(&token);
    }

    /// Acknowledged completions whose sealed bytes are still kept, and
    /// their total size.
    pub(super) fn completions(&self) -> (usize, usize) {
        let state = self.lock();
        (state.completed.len(), state.completed_bytes)
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // The task finds the state gone and ends.
        self.shared.wake.notify_one();
    }
}

/// Drops each acknowledged completion when its window ends; sleeps until
/// the next one ends, or until woken.
async fn purge_task(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = match shared.upgrade() {
            Some(s) => s
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .purge(Instant::now()),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
