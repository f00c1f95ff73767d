//! The [`IdempotencyLayer`], the [`Idempotency`] service it makes and its
//! graceful shutdown; and what happens to one protected request, phase by
//! phase, in the child modules:
//!
//! - `admit`: the request becomes a `Keyed` one (key, body, fingerprint,
//!   `Last-Event-ID`, `Prefer`, trace id), or is forwarded or refused;
//! - here, [`dispatch`]: the store says who the request is for its key
//!   (owner, retry of a settled key, duplicate of one in flight);
//! - `detached`: an owner's work, detached from its client, and
//!   `listeners`: who hears from it (its client, attached duplicates);
//! - `attach`: a duplicate that waits for (or follows) the owner;
//! - `body`, `record`: the bodies streamed to clients, and what an owner
//!   keeps for the store;
//! - `inner`, `traceparent`: the wrapped service's bound and markers, and
//!   W3C trace context.
//!
//! These sit in a `service/` directory because they are the request path's
//! private parts: the crate root keeps the public modules and the leaves
//! both the request path and `operations` use (`shared`, `replay`,
//! `refusal`). Dependencies point one way only: the children never use this
//! module, and nothing at the root uses the children.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::{Method, Request};
use idemgate_engine::{Begin, BeginError, Engine, StoreError};
use tower::{Layer, Service};
use tracing::Instrument;

use crate::config::{LayerConfig, OnInflight, StoreErrorMode};
use crate::live::{InProcessLive, LiveEvents};
use crate::operations;
use crate::problem::Problem;
use crate::refusal::Log;
use crate::shared::Shared;
use crate::telemetry::RequestOutcome;

mod admit;
mod attach;
mod body;
mod detachable;
mod detached;
mod inner;
mod listeners;
mod record;
mod traceparent;

#[cfg(feature = "fuzzing")]
pub(crate) use admit::prefers_async;
use admit::{Keyed, NotKeyed};
use inner::Inner;
pub use inner::{IdempotencyContext, OutcomeUnknown, RetryableFailure, SendSignal};

/// What a graceful shutdown found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Detached executions still running when the grace period ran out;
    /// they were cancelled and their keys released (on a route that keeps
    /// `outcome-unknown` answers, one whose request was already sent is
    /// kept as `outcome-unknown` instead).
    pub cancelled: usize,
}

/// The idempotency layer. Cheap to clone (clones share state).
#[derive(Debug, Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl IdempotencyLayer {
    /// A layer protecting a route with `config`, keeping records in `engine`.
    /// Streams in progress are visible to duplicates served by this process.
    pub fn new(engine: Engine, config: LayerConfig) -> Self {
        Self::with_live_events(engine, config, Arc::new(InProcessLive::default()))
    }

    /// Like [`IdempotencyLayer::new`], with streams in progress published
    /// through `live` (e.g. shared by every replica of a gateway).
    pub fn with_live_events(
        engine: Engine,
        config: LayerConfig,
        live: Arc<dyn LiveEvents>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared::new(engine, config, live)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LayerConfig {
        &self.shared.config
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// Executions running now, whether still inside their client's request
    /// or detached from it (a graceful shutdown waits for both).
    pub fn detached(&self) -> usize {
        self.shared.tracker.len()
    }

    /// Streams of this process that duplicates can attach to now.
    pub fn live_streams(&self) -> usize {
        self.shared.live.local_streams()
    }

    /// Graceful shutdown: waits up to `grace` for detached executions to
    /// finish (and be stored), then cancels the rest and waits until each
    /// has released its key, or, on a route that keeps `outcome-unknown`
    /// answers, stored that answer for a request already sent (its outcome
    /// is unknown: a retry must not run it again). Requests arriving
    /// afterwards are answered 503.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let s = &self.shared;
        s.tracker.close();
        if tokio::time::timeout(grace, s.tracker.wait()).await.is_ok() {
            s.cancel.cancel();
            return ShutdownReport { cancelled: 0 };
        }
        let cancelled = s.tracker.len();
        s.cancel.cancel();
        s.tracker.wait().await;
        ShutdownReport { cancelled }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service made by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request<Body>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The inner service is driven to readiness where it is called
        // (possibly in a detached task), with `oneshot`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let inner = self.inner.clone();
        Box::pin(async move { Ok(handle(shared, inner, req).await) })
    }
}

/// One request: an operation lookup, a request forwarded as it is, or a
/// keyed one, dispatched in its span.
async fn handle<S: Inner>(shared: Arc<Shared>, inner: S, req: Request<Body>) -> Response {
    let cfg = &shared.config;
    if req.method() == Method::GET
        && req.uri().path().starts_with(&cfg.operations_path)
        && let Some(res) = operations::get(&shared, req.uri().path(), req.headers()).await
    {
        return res;
    }
    let keyed = match Keyed::admit(&shared, req).await {
        Ok(keyed) => keyed,
        Err(NotKeyed::Forward(req)) => return inner::call(inner, req).await,
        Err(NotKeyed::Refused(res)) => return res,
    };
    let span = keyed.span();
    dispatch(shared, inner, keyed).instrument(span).await
}

/// Begins the key and hands the request to whoever serves its case: the
/// owner's detached execution, a replay, or the in-flight handling.
async fn dispatch<S: Inner>(shared: Arc<Shared>, inner: S, keyed: Keyed) -> Response {
    let cfg = &shared.config;
    match shared.engine.begin(&keyed.scoped, &keyed.fingerprint).await {
        Ok(Begin::Owner(guard)) => detached::own(shared, inner, keyed, guard).await,
        Ok(Begin::Done(record)) => keyed.replay(&shared, &record, RequestOutcome::Replayed),
        Ok(Begin::Inflight(inflight)) => {
            // Counted once per request that meets its key in flight,
            // whatever happens next: the route's overload signal (clients
            // retrying work that is still running).
            shared.metrics.met_inflight(&keyed.scoped);
            if keyed.prefer_async {
                shared
                    .metrics
                    .request(RequestOutcome::Accepted, Some(&keyed.scoped));
                return operations::accepted_for(cfg, &keyed.scoped.key, &keyed.fingerprint);
            }
            match cfg.on_inflight {
                OnInflight::Reject => attach::conflict(&shared, &keyed, &inflight).await,
                // Without a live stream of this process to join (only Attach
                // publishes them), attaching is waiting for the result.
                mode => attach::attach(shared, inner, keyed, inflight, mode.wait_bound()).await,
            }
        }
        Err(BeginError::Mismatch) => keyed.mismatch(&shared),
        Err(BeginError::Store(e)) => store_failed(&shared, inner, &keyed, &e).await,
        Err(other) => keyed.refuse(
            &shared,
            RequestOutcome::StoreError,
            Log::Error("unexpected engine error", &other),
            Problem::store_unavailable(),
        ),
    }
}

/// The store cannot begin the key: refuse, or forward unprotected, as the
/// route says.
async fn store_failed<S: Inner>(
    shared: &Shared,
    inner: S,
    keyed: &Keyed,
    e: &StoreError,
) -> Response {
    match shared.config.on_store_error {
        StoreErrorMode::FailClosed => {
            keyed.store_unavailable(shared, "store unavailable; request refused", e)
        }
        StoreErrorMode::FailOpen => {
            tracing::warn!(error = %e, "store unavailable; request forwarded unprotected");
            shared
                .metrics
                .request(RequestOutcome::UnprotectedStoreError, Some(&keyed.scoped));
            inner::call(inner, keyed.request()).await
        }
    }
}
