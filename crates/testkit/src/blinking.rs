//! [`BlinkingStore`]: a store that blinks on command, for the tests of a
//! result held through a store outage (the engine's holding completion,
//! the layer's owner that keeps its result while the write is retried).
//!
//! It wraps a real store and fails the calls its [`Switches`] say with a
//! temporary error (`Unavailable`), or applies a completion and then loses
//! its reply, the case a driver's retry meets. It can also refuse the next
//! completion for good (`Rejected`), or fence it: the key is forgotten just
//! before the write, as an operator's forget or another owner would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, BoxFuture, Fenced, LayeredStore, Lease, Store, StoreError,
    StoreErrorKind,
};

use crate::LONG;

/// What the store does next; flip them from the test.
#[derive(Debug, Default)]
pub struct Switches {
    /// `complete` fails before writing.
    pub complete_down: AtomicBool,
    /// `complete` writes, then fails as if its reply was lost (once).
    pub lose_next_reply: AtomicBool,
    /// `renew` fails.
    pub renew_down: AtomicBool,
    /// The next `complete` fails with a permanent error (`Rejected`)
    /// before writing (once).
    pub refuse_next_complete: AtomicBool,
    /// The key is forgotten just before the next `complete` writes, so
    /// the write is fenced (once).
    pub fence_next_complete: AtomicBool,
    /// Completion writes tried.
    pub completes: AtomicUsize,
}

/// Wraps a store; fails the calls [`Switches`] say.
#[derive(Debug)]
pub struct BlinkingStore {
    inner: Arc<dyn Store>,
    switches: Arc<Switches>,
}

impl BlinkingStore {
    /// Wraps `inner`, every switch off.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            switches: Arc::default(),
        }
    }

    /// The switches (shared: keep it to flip them later).
    pub fn switches(&self) -> Arc<Switches> {
        Arc::clone(&self.switches)
    }
}

fn unavailable() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "blinking", "store blinked")
}

impl LayeredStore for BlinkingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        if self.switches.renew_down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(unavailable()) });
        }
        self.inner.renew(lease, pending_ttl)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            self.switches.completes.fetch_add(1, Ordering::SeqCst);
            if self.switches.complete_down.load(Ordering::SeqCst) {
                return Err(unavailable());
            }
            if self
                .switches
                .refuse_next_complete
                .swap(false, Ordering::SeqCst)
            {
                return Err(StoreError::new(
                    StoreErrorKind::Rejected,
                    "blinking",
                    "write refused",
                ));
            }
            if self
                .switches
                .fence_next_complete
                .swap(false, Ordering::SeqCst)
            {
                let forgot = Attempt {
                    outcome: AttemptOutcome::Forgotten,
                    ..attempt.clone()
                };
                self.inner.forget(&lease.key, &forgot, LONG).await?;
            }
            let written = self
                .inner
                .complete(lease, payload, done_ttl, attempt)
                .await?;
            if self.switches.lose_next_reply.swap(false, Ordering::SeqCst) {
                return Err(unavailable());
            }
            Ok(written)
        })
    }
}
