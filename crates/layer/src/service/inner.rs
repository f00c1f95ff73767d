//! The service the layer wraps, as the request path sees it: one bound
//! ([`Inner`]) instead of the same five-line `where` clause on every
//! function, the call that drives it, and the two markers the layer and
//! that service exchange: the [`IdempotencyContext`] and [`SendSignal`] a
//! request carries in, the [`RetryableFailure`] or [`OutcomeUnknown`] a
//! response may carry out.
//!
//! # Why the inner service signals "sent"
//! The layer bounds each detached execution with `completion_timeout`. A
//! proxy in front of a concurrency limit may hold a request in its queue
//! before sending it, and if the layer's clock ran during that wait, a
//! request queued behind a long one would be cut (and its key released,
//! and its retry run upstream a second time) though the upstream had its
//! full budget left. So the clock can start at the inner service's own
//! word: the layer puts a [`SendSignal`] in the request, the proxy fires it
//! the moment the request leaves for the upstream, and the layer's
//! deadline is that instant plus `completion_timeout`
//! (`CompletionClock::Sent`). The queue has its own bound, in the proxy.
//! A signal dropped unfired means nothing was sent: the clock starts then.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use http::Request;
use idemgate_engine::{ClientKey, ScopedKey};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::{Service, ServiceExt};

/// The key of the request being served, in the request extensions seen by
/// the inner service (a proxy forwards `key` upstream).
#[derive(Debug, Clone)]
pub struct IdempotencyContext {
    /// The client's (or derived) key.
    pub key: ClientKey,
    /// The record's address.
    pub scoped: ScopedKey,
}

/// Response extension marking a synthetic failure (connect error, connect
/// or first-byte timeout) whatever its status: the layer releases the key.
#[derive(Debug, Clone, Copy)]
pub struct RetryableFailure {
    /// Which phase failed (`connect`, `first_byte`, …), for logs.
    pub phase: &'static str,
}

/// Response extension marking a synthetic failure *after* the request was
/// sent (first-byte timeout, connection cut before the response): the
/// upstream may have done the work. The layer stores an `outcome-unknown`
/// problem or releases the key, as the route's `on_outcome_unknown` says.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeUnknown {
    /// Which phase failed (`first_byte`, `send`, …), for logs.
    pub phase: &'static str,
}

/// Request extension through which the inner service says when it sent the
/// request on; see the module docs. Cheap to clone; the first
/// [`SendSignal::sent`] counts.
#[derive(Debug, Clone)]
pub struct SendSignal {
    tx: Arc<Mutex<Option<oneshot::Sender<Instant>>>>,
    /// Set as the signal fires, for a layer that must know at once (the
    /// receiver hears it only when it is next polled).
    fired: Arc<AtomicBool>,
}

impl SendSignal {
    /// A signal, the receiver that hears when the request was sent (an
    /// error if every clone was dropped unfired), and a flag that is true
    /// from the moment it fired.
    pub(super) fn new() -> (Self, oneshot::Receiver<Instant>, Arc<AtomicBool>) {
        let (tx, rx) = oneshot::channel();
        let fired = Arc::new(AtomicBool::new(false));
        let signal = Self {
            tx: Arc::new(Mutex::new(Some(tx))),
            fired: Arc::clone(&fired),
        };
        (signal, rx, fired)
    }

    /// The request is being sent now.
    pub fn sent(&self) {
        self.fired.store(true, Ordering::Relaxed);
        let tx = match self.tx.lock() {
            Ok(mut slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(tx) = tx {
            // The layer stopped listening: nothing to tell.
            let _ = tx.send(Instant::now());
        }
    }
}

/// An inner service the layer can protect: an infallible axum service that
/// can be cloned into a detached task.
pub(super) trait Inner:
    Service<Request<Body>, Response = Response, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Inner for S where
    S: Service<Request<Body>, Response = Response, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// Drives `inner` to readiness and calls it with `req`.
pub(super) async fn call<S: Inner>(inner: S, req: Request<Body>) -> Response {
    match inner.oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    }
}
