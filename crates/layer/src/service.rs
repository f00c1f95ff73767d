//! The [`Idempotency`] service: what happens to one protected request.
//!
//! The work of an owner runs **detached**: the inner service call and the
//! reading of its response body happen in a spawned task that owns the
//! lease, and the client's response is fed from that task through a channel.
//! A client that times out or disconnects therefore does not cancel the
//! work: it finishes (bounded by `completion_timeout`), is stored DONE, and
//! the client's retry is a replay instead of a second execution — the
//! seed's central scenario. A non-streaming result is stored *before* the
//! client is answered, and a stream's end is sent only after it is stored,
//! so a retry sent right after an answer always replays.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use idemgate_engine::{
    AttemptOutcome, Begin, BeginError, ClientKey, Engine, Fenced, Fingerprint, InFlight,
    LeaseGuard, Record, RecordState, ScopedKey, Settled, StoreError,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tracing::Instrument;

use crate::config::{InflightMode, KeyMode, LayerConfig, StoreErrorMode};
use crate::key::{KeyRefusal, client_key, derive_key, tenant_of};
use crate::live::{
    InProcessLive, Joined, LiveEvents, LiveFollower, LivePublisher, LiveStream, Next,
};
use crate::operations;
use crate::problem::Problem;
use crate::replay::{IDEMPOTENT_REPLAYED, mark, replay_stored};
use crate::shared::Shared;
use crate::sse::{EventScanner, events_to_skip, is_event_stream, rewrite_id};
use crate::stored::{StoredBody, StoredResponse, StreamUsage, usage_of_json};
use crate::telemetry::{Outcome, ReleaseReason};
use sha2::{Digest, Sha256};

mod traceparent;

use traceparent::ensure_traceparent;

const PREFER: HeaderName = HeaderName::from_static("prefer");

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

/// What a graceful shutdown found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Detached executions still running when the grace period ran out;
    /// they were cancelled and their keys released.
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

    /// Detached executions running now.
    pub fn detached(&self) -> usize {
        self.shared.tracker.len()
    }

    /// Streams of this process that duplicates can attach to now.
    pub fn live_streams(&self) -> usize {
        self.shared.live.local_streams()
    }

    /// Graceful shutdown: waits up to `grace` for detached executions to
    /// finish (and be stored), then cancels the rest and waits until each
    /// has released its key. Requests arriving afterwards are answered 503.
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

async fn call_inner<S>(inner: S, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible>,
{
    match inner.oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    }
}

/// A protected request after its key, body and fingerprint are known.
struct Keyed {
    parts: Parts,
    body: Bytes,
    scoped: ScopedKey,
    fingerprint: Fingerprint,
    /// Events to skip on a stream (`Last-Event-ID`).
    skip: usize,
    prefer_async: bool,
}

impl Keyed {
    /// The request to give the inner service, with the key in its extensions.
    fn request(&self) -> Request<Body> {
        let mut req = Request::from_parts(self.parts.clone(), Body::from(self.body.clone()));
        req.extensions_mut().insert(IdempotencyContext {
            key: self.scoped.key.clone(),
            scoped: self.scoped.clone(),
        });
        req
    }
}

async fn handle<S>(shared: Arc<Shared>, inner: S, req: Request<Body>) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let cfg = &shared.config;
    if req.method() == Method::GET && req.uri().path().starts_with(&cfg.operations_path) {
        if let Some(res) = operations::get(&shared, req.uri().path(), req.headers()).await {
            return res;
        }
    }
    if !cfg.protects(req.method()) {
        return call_inner(inner, req).await;
    }
    let explicit = match client_key(req.headers()) {
        Ok(k) => k,
        Err(refusal) => return refuse_key(&shared, &refusal),
    };
    let derive = match (&explicit, &cfg.key_mode) {
        (Some(_), _) => None,
        (None, KeyMode::Derive(template)) => Some(template),
        (None, KeyMode::Require) => return refuse_key(&shared, &KeyRefusal::Missing),
        (None, KeyMode::Optional) => {
            // Unprotected, but the route's size limit still holds where the
            // size is declared (the body is streamed through, not read here).
            if declared_length(req.headers()).is_some_and(|n| exceeds(n, cfg.body_limit)) {
                shared.metrics.request(Outcome::Rejected, None);
                return Problem::body_too_large(cfg.body_limit).into_response();
            }
            shared.metrics.request(Outcome::Unprotected, None);
            return call_inner(inner, req).await;
        }
    };
    let tenant = tenant_of(req.headers(), &cfg.tenant);
    let (parts, body) = req.into_parts();
    let body = match read_body(&parts.headers, body, cfg.body_limit).await {
        Ok(b) => b,
        Err(problem) => {
            shared.metrics.request(Outcome::Rejected, None);
            return problem.into_response();
        }
    };
    let key = match (explicit, derive) {
        (Some(k), _) => k,
        (None, Some(template)) => match derive_key(
            template,
            &tenant,
            &parts.headers,
            &body,
            &cfg.fingerprint_ignore,
            SystemTime::now(),
        ) {
            Ok(k) => k,
            Err(refusal) => return refuse_key(&shared, &refusal),
        },
        (None, None) => return refuse_key(&shared, &KeyRefusal::Missing),
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let fingerprint =
        Fingerprint::of_request(parts.method.as_str(), path, &body, &cfg.fingerprint_ignore);
    let skip = events_to_skip(&parts.headers);
    let prefer_async = prefers_async(&parts.headers);
    let mut parts = parts;
    let trace_id = ensure_traceparent(&mut parts.headers);
    // Every line logged while this request is handled (the detached
    // execution included) carries the client's key and the trace id; never
    // the tenant, the credential or a body.
    let span = tracing::info_span!(
        "idempotency",
        idempotency_key = %key,
        trace_id = %trace_id,
        route = %cfg.namespace,
    );
    let keyed = Keyed {
        parts,
        body,
        scoped: ScopedKey::new(tenant, cfg.namespace.clone(), key),
        fingerprint,
        skip,
        prefer_async,
    };
    protected(Arc::clone(&shared), inner, keyed)
        .instrument(span)
        .await
}

async fn protected<S>(shared: Arc<Shared>, inner: S, keyed: Keyed) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let cfg = &shared.config;
    let engine = &shared.engine;
    match engine.begin(&keyed.scoped, &keyed.fingerprint).await {
        Ok(Begin::Owner(guard)) => own(shared, inner, keyed, guard).await,
        Ok(Begin::Done(record)) => replay_record(&shared, &record, &keyed, Outcome::Replayed),
        Ok(Begin::InFlight(inflight)) => {
            // Counted once per request that meets its key in flight,
            // whatever happens next: the seed's overload signal.
            shared.metrics.met_inflight();
            if keyed.prefer_async {
                shared
                    .metrics
                    .request(Outcome::Accepted, Some(&keyed.scoped));
                return operations::accepted_for(cfg, &keyed.scoped.key);
            }
            match cfg.on_inflight {
                // Without a live stream of this process to join (only Attach
                // publishes them), attaching is waiting for the result.
                InflightMode::Attach(max) | InflightMode::Wait(max) => {
                    attach(shared, inner, keyed, inflight, max).await
                }
                InflightMode::Reject => conflict(&shared, &keyed, &inflight).await,
            }
        }
        Err(BeginError::Mismatch) => mismatch(&shared, &keyed),
        Err(BeginError::Store(e)) => store_failed(&shared, inner, &keyed, &e).await,
        Err(other) => {
            tracing::error!(error = %other, "unexpected engine error");
            shared
                .metrics
                .request(Outcome::StoreError, Some(&keyed.scoped));
            Problem::store_unavailable().into_response()
        }
    }
}

fn refuse_key(shared: &Shared, refusal: &KeyRefusal) -> Response {
    shared.metrics.request(Outcome::Rejected, None);
    match refusal {
        KeyRefusal::Missing | KeyRefusal::MissingDimension(_) => {
            Problem::missing_key(refusal.to_string())
        }
        _ => Problem::malformed_key(refusal.to_string()),
    }
    .into_response()
}

fn mismatch(shared: &Shared, keyed: &Keyed) -> Response {
    shared
        .metrics
        .request(Outcome::Mismatch, Some(&keyed.scoped));
    tracing::info!("idempotency key reused with a different request");
    Problem::key_mismatch().into_response()
}

/// Gives up on a key in flight (refused, or the wait ran out). The meeting
/// itself was counted when it happened.
async fn conflict(shared: &Shared, keyed: &Keyed, inflight: &InFlight) -> Response {
    inflight.record_conflict().await;
    shared
        .metrics
        .request(Outcome::Conflict, Some(&keyed.scoped));
    tracing::info!("idempotency key in flight; request refused");
    Problem::in_flight(inflight.retry_after()).into_response()
}

async fn store_failed<S>(shared: &Shared, inner: S, keyed: &Keyed, e: &StoreError) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible>,
{
    let cfg = &shared.config;
    match cfg.on_store_error {
        StoreErrorMode::FailClosed => {
            tracing::warn!(error = %e, "store unavailable; request refused");
            shared
                .metrics
                .request(Outcome::StoreError, Some(&keyed.scoped));
            Problem::store_unavailable().into_response()
        }
        StoreErrorMode::FailOpen => {
            tracing::warn!(error = %e, "store unavailable; request forwarded unprotected");
            shared
                .metrics
                .request(Outcome::Unprotected, Some(&keyed.scoped));
            call_inner(inner, keyed.request()).await
        }
    }
}

/// Reads the request body up to `limit`.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Problem> {
    if declared_length(headers).is_some_and(|n| exceeds(n, limit)) {
        return Err(Problem::body_too_large(limit));
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Problem::body_too_large(limit)),
        Err(_) => Err(Problem::request_body_unreadable()),
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok())
}

fn exceeds(n: u64, limit: usize) -> bool {
    n > u64::try_from(limit).unwrap_or(u64::MAX)
}

fn prefers_async(headers: &HeaderMap) -> bool {
    headers.get_all(PREFER).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|pref| {
                pref.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async"))
            })
        })
    })
}

/// Answers from a DONE record.
fn replay_record(shared: &Shared, record: &Record, keyed: &Keyed, outcome: Outcome) -> Response {
    replay_stored(shared, record, &keyed.scoped, keyed.skip, outcome)
}

/// Joins an execution in flight: its live stream if this process runs it
/// and it streams, otherwise its stored result once DONE. Takes the key over
/// if that execution fails. (`Wait` is this without live streams.)
async fn attach<S>(
    shared: Arc<Shared>,
    inner: S,
    keyed: Keyed,
    mut inflight: InFlight,
    max: Duration,
) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let deadline = Instant::now() + max;
    loop {
        // Another process (or the instant before the owner registers):
        // look at the store in short slices, and at the registry between.
        let mut slice = Duration::from_millis(100);
        let fence = match inflight.record().state {
            RecordState::Pending { fence, .. } => fence,
            RecordState::Done { .. } => 0,
        };
        match shared.live.join(&keyed.scoped, fence, deadline).await {
            Joined::Streaming {
                status,
                headers,
                follow,
            } => {
                inflight
                    .note(AttemptOutcome::Attached, Some(status.as_u16()))
                    .await;
                // Tokens saved are counted when the stored result is
                // replayed; a joined live stream has no stored usage yet.
                shared
                    .metrics
                    .request(Outcome::Attached, Some(&keyed.scoped));
                return attached_response(&shared, &keyed, status, headers, follow, max);
            }
            // The owner stores before answering: wait for DONE.
            Joined::NotStreaming => slice = max,
            Joined::Unknown => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return conflict(&shared, &keyed, &inflight).await;
        }
        match inflight.settled(slice.min(remaining)).await {
            Ok(Settled::StillPending) => {}
            Ok(Settled::Done(record)) if record.fingerprint == keyed.fingerprint => {
                inflight.note(AttemptOutcome::Attached, None).await;
                return replay_record(&shared, &record, &keyed, Outcome::Attached);
            }
            Ok(Settled::Done(_)) => return mismatch(&shared, &keyed),
            Ok(Settled::Free) => {
                match shared.engine.begin(&keyed.scoped, &keyed.fingerprint).await {
                    Ok(Begin::Owner(guard)) => return own(shared, inner, keyed, guard).await,
                    Ok(Begin::Done(record)) => {
                        return replay_record(&shared, &record, &keyed, Outcome::Replayed);
                    }
                    Ok(Begin::InFlight(next)) => inflight = next,
                    Err(BeginError::Mismatch) => return mismatch(&shared, &keyed),
                    Err(e) => {
                        tracing::warn!(error = %e, "store failed while attaching");
                        shared
                            .metrics
                            .request(Outcome::StoreError, Some(&keyed.scoped));
                        return Problem::store_unavailable().into_response();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "store failed while attaching");
                shared
                    .metrics
                    .request(Outcome::StoreError, Some(&keyed.scoped));
                return Problem::store_unavailable().into_response();
            }
        }
    }
}

/// The error a client's stream ends with when the stream it follows broke:
/// the key was released, and the client should retry.
#[derive(Debug, thiserror::Error)]
#[error("the response stream broke before its end; the idempotency key was released")]
struct StreamBroken;

fn attached_response(
    shared: &Arc<Shared>,
    keyed: &Keyed,
    status: StatusCode,
    headers: HeaderMap,
    follow: Box<dyn LiveFollower>,
    wait: Duration,
) -> Response {
    let following = Following {
        follow,
        cursor: keyed.skip,
        first: keyed.skip,
        sent: Sha256::new(),
        shared: Arc::clone(shared),
        key: keyed.scoped.clone(),
        fingerprint: keyed.fingerprint,
        wait,
        done: false,
    };
    let stream = futures_util::stream::unfold(Some(following), |state| async move {
        let mut f = state?;
        match f.step().await {
            Some(Ok(chunk)) => Some((Ok(chunk), Some(f))),
            Some(Err(broken)) => Some((Err(broken), None)),
            None => None,
        }
    });
    let mut res = Response::new(Body::from_stream(stream));
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    mark(res, true)
}

/// An attached client's stream: live events, and the stored record when
/// the live feed cannot say more.
struct Following {
    follow: Box<dyn LiveFollower>,
    /// Events the client has (its `Last-Event-ID`, then what was sent).
    cursor: usize,
    /// The cursor the client came with.
    first: usize,
    /// Hash of the events sent, to check them against a stored result.
    sent: Sha256,
    shared: Arc<Shared>,
    key: ScopedKey,
    fingerprint: Fingerprint,
    /// How long to wait for the record to settle once the feed broke.
    wait: Duration,
    /// The rest came from the stored record: nothing more to send.
    done: bool,
}

impl Following {
    /// The next chunk for the client, `None` at a clean end.
    async fn step(&mut self) -> Option<Result<Bytes, StreamBroken>> {
        if self.done {
            return None;
        }
        loop {
            match self.follow.next(&mut self.cursor).await {
                Next::Events(chunk) => {
                    self.sent.update(&chunk);
                    return Some(Ok(chunk));
                }
                Next::End => return None,
                Next::Failed => return Some(Err(StreamBroken)),
                Next::Unsure => match self.rest_from_store().await {
                    Ok(Some(rest)) => {
                        self.done = true;
                        return Some(Ok(rest));
                    }
                    Ok(None) => {}
                    Err(broken) => return Some(Err(broken)),
                },
            }
        }
    }

    /// Looks at the record: `Ok(None)` while it is PENDING (follow on),
    /// the events after the cursor once it is DONE — provided the events
    /// already sent are the stored ones — and an error otherwise.
    async fn rest_from_store(&self) -> Result<Option<Bytes>, StreamBroken> {
        let store = self.shared.engine.store();
        let record = match store.get(&self.key).await {
            Ok(Some(record)) => record,
            Ok(None) => return Err(StreamBroken),
            Err(e) => {
                tracing::warn!(error = %e, "store failed while following a stream");
                return Err(StreamBroken);
            }
        };
        if record.fingerprint != self.fingerprint {
            return Err(StreamBroken);
        }
        let Some(payload) = record.payload() else {
            store
                .changed(&self.key, self.wait.min(Duration::from_millis(100)))
                .await;
            return Ok(None);
        };
        let stored = StoredResponse::decode(payload).map_err(|_| StreamBroken)?;
        let StoredBody::Events(events) = &stored.body else {
            return Err(StreamBroken);
        };
        let sent = events.get(self.first..self.cursor).ok_or(StreamBroken)?;
        let mut check = Sha256::new();
        for e in sent {
            check.update(e);
        }
        if check.finalize() != self.sent.clone().finalize() {
            tracing::warn!("the stored stream is not the one followed; stream ended");
            return Err(StreamBroken);
        }
        Ok(Some(stored.body_bytes(self.cursor)))
    }
}

/// What the client's streaming body receives from the detached execution.
enum Chunk {
    Data(Bytes),
    /// The stream is stored: end the body cleanly.
    End,
    /// The stream broke: end the body with an error.
    Abort,
}

/// A body fed by the detached execution. Ends with an error unless told
/// the stream completed, so an execution that dies (panics) never looks
/// like a complete stream to the client.
fn channel_body(rx: mpsc::UnboundedReceiver<Chunk>) -> Body {
    let stream = futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Chunk::Data(b)) => Some((Ok(b), Some(rx))),
            Some(Chunk::End) => None,
            Some(Chunk::Abort) | None => Some((Err(StreamBroken), None)),
        }
    });
    Body::from_stream(stream)
}

/// Runs the work as the key's owner, detached from the client.
async fn own<S>(shared: Arc<Shared>, inner: S, keyed: Keyed, guard: LeaseGuard) -> Response
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let cfg = &shared.config;
    let publisher = matches!(cfg.on_inflight, InflightMode::Attach(_)).then(|| {
        shared.live.publish(LiveStream {
            key: keyed.scoped.clone(),
            fence: guard.lease().fence,
            horizon: cfg.completion_timeout,
        })
    });
    let (reply_tx, reply_rx) = oneshot::channel();
    let request = keyed.request();
    let task = Detached {
        shared: Arc::clone(&shared),
        key: keyed.scoped.clone(),
        reply: Some(reply_tx),
        pending: None,
        body_tx: None,
        publisher,
        events: 0,
        status: None,
    };
    shared
        .tracker
        .spawn(task.run(inner, request, guard).in_current_span());
    if keyed.prefer_async {
        // Counted when the execution ends, like any owner's.
        return operations::accepted_for(cfg, &keyed.scoped.key);
    }
    match reply_rx.await {
        Ok(res) => res,
        Err(_) => Problem::internal().into_response(),
    }
}

/// How a detached execution ends for the store.
enum Decision {
    /// Store this response (PENDING → DONE).
    Store(StoredResponse),
    /// Give the key back, for this reason.
    Release(ReleaseReason),
}

/// The state of one detached execution.
struct Detached {
    shared: Arc<Shared>,
    /// The key this execution owns (for the requests-per-key count).
    key: ScopedKey,
    /// The client's response, until it is sent.
    reply: Option<oneshot::Sender<Response>>,
    /// A response to send once the store has been written.
    pending: Option<Response>,
    /// The client's streaming body, once the head is sent.
    body_tx: Option<mpsc::UnboundedSender<Chunk>>,
    /// Live state for duplicates that attach (Attach mode only).
    publisher: Option<Box<dyn LivePublisher>>,
    /// Events relayed so far (stream responses).
    events: usize,
    /// The inner service's status, for the timeline.
    status: Option<u16>,
}

impl Detached {
    async fn run<S>(mut self, inner: S, request: Request<Body>, guard: LeaseGuard)
    where
        S: Service<Request<Body>, Response = Response, Error = Infallible> + Send,
        S::Future: Send,
    {
        let shared = Arc::clone(&self.shared);
        let decision = {
            let work = self.execute(inner, request);
            tokio::select! {
                d = work => d,
                () = tokio::time::sleep(shared.config.completion_timeout) => Decision::Release(ReleaseReason::CompletionTimeout),
                () = shared.cancel.cancelled() => Decision::Release(ReleaseReason::Shutdown),
            }
        };
        self.finish(decision, guard).await;
    }

    /// Calls the inner service and reads its response; returns what to do
    /// with the key. Relays stream events to the client as they arrive.
    async fn execute<S>(&mut self, inner: S, request: Request<Body>) -> Decision
    where
        S: Service<Request<Body>, Response = Response, Error = Infallible>,
    {
        let res = call_inner(inner, request).await;
        let status = res.status();
        self.status = Some(status.as_u16());
        let cfg = &self.shared.config;
        if let Some(failure) = res.extensions().get::<RetryableFailure>() {
            tracing::info!(phase = failure.phase, "upstream failed; key released");
            self.not_streaming();
            self.pending = Some(fresh(res));
            return Decision::Release(ReleaseReason::RetryableFailure);
        }
        if cfg.is_retryable(status.as_u16()) {
            tracing::info!(status = status.as_u16(), "retryable status; key released");
            self.not_streaming();
            self.pending = Some(fresh(res));
            return Decision::Release(ReleaseReason::RetryableStatus);
        }
        let (mut parts, body) = res.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::TRANSFER_ENCODING);
        if is_event_stream(parts.headers.get(header::CONTENT_TYPE)) {
            return self.stream(parts, body).await;
        }
        self.not_streaming();
        let max = cfg.max_stored_body;
        let mut data = body.into_data_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = data.next().await {
            match chunk {
                Ok(chunk) if buf.len().saturating_add(chunk.len()) > max => {
                    // Too large to store: give the client the response as it
                    // comes (after the key is released), not stored.
                    buf.extend_from_slice(&chunk);
                    let head =
                        futures_util::stream::once(
                            async move { Ok::<_, axum::Error>(buf.freeze()) },
                        );
                    let body = Body::from_stream(head.chain(data));
                    self.pending = Some(fresh(Response::from_parts(parts, body)));
                    tracing::warn!(max, "response body too large to store; key released");
                    return Decision::Release(ReleaseReason::TooLarge);
                }
                Ok(chunk) => buf.extend_from_slice(&chunk),
                Err(e) => {
                    tracing::warn!(error = %e, "response body failed; key released");
                    self.pending = Some(
                        Problem::upstream_unavailable("the response body broke before its end")
                            .into_response(),
                    );
                    return Decision::Release(ReleaseReason::BodyError);
                }
            }
        }
        let body = buf.freeze();
        let stored = StoredResponse {
            status,
            headers: kept_headers(&parts.headers, cfg),
            usage: usage_of_json(&body),
            body: StoredBody::Bytes(body.clone()),
        };
        self.pending = Some(fresh(Response::from_parts(parts, Body::from(body))));
        Decision::Store(stored)
    }

    /// Relays an event stream: each event gets a sequential id, is sent to
    /// the client, published for attachers and recorded.
    async fn stream(&mut self, parts: http::response::Parts, body: Body) -> Decision {
        let cfg = &self.shared.config;
        let status = parts.status;
        let stored_headers = kept_headers(&parts.headers, cfg);
        if let Some(p) = &self.publisher {
            let mut attached = parts.headers.clone();
            attached.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            p.streaming(status, attached);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.body_tx = Some(tx);
        let head = fresh(Response::from_parts(parts, channel_body(rx)));
        if let Some(reply) = self.reply.take() {
            // The client may be gone already; the work goes on regardless.
            let _ = reply.send(head);
        }
        let max = cfg.max_stored_body;
        let mut scanner = EventScanner::new();
        let mut usage = StreamUsage::default();
        let mut recorded: Vec<Bytes> = Vec::new();
        let mut size = 0usize;
        let mut over = false;
        let mut data = body.into_data_stream();
        let mut blocks = Vec::new();
        loop {
            let end = match data.next().await {
                Some(Ok(chunk)) => {
                    scanner.push(&chunk, &mut blocks);
                    false
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, events = self.events, "response stream broke; key released");
                    return Decision::Release(ReleaseReason::StreamError);
                }
                None => {
                    blocks.extend(scanner.finish());
                    true
                }
            };
            for block in blocks.drain(..) {
                self.events += 1;
                let event = rewrite_id(&block, u64::try_from(self.events).unwrap_or(u64::MAX));
                usage.add_event(&event);
                size = size.saturating_add(event.len());
                if !over && size > max {
                    over = true;
                    recorded = Vec::new();
                    tracing::warn!(
                        max,
                        "event stream too large to store; it will not be replayable"
                    );
                    if let Some(p) = self.publisher.take() {
                        p.fail();
                    }
                }
                if !over {
                    recorded.push(event.clone());
                    if let Some(p) = &self.publisher {
                        p.event(event.clone());
                    }
                }
                self.send(Chunk::Data(event));
            }
            if end {
                break;
            }
        }
        if over {
            return Decision::Release(ReleaseReason::TooLarge);
        }
        Decision::Store(StoredResponse {
            status,
            headers: stored_headers,
            body: StoredBody::Events(recorded),
            usage: usage.finish(),
        })
    }

    fn not_streaming(&self) {
        if let Some(p) = &self.publisher {
            p.not_streaming();
        }
    }

    fn send(&mut self, chunk: Chunk) {
        if let Some(tx) = &self.body_tx {
            if tx.send(chunk).is_err() {
                tracing::debug!("client went away; the execution goes on");
                self.body_tx = None;
            }
        }
    }

    /// Writes the outcome to the store, then tells the client (and
    /// attachers): a retry arriving after the answer finds the key settled.
    async fn finish(mut self, decision: Decision, guard: LeaseGuard) {
        let shared = Arc::clone(&self.shared);
        let metrics = &shared.metrics;
        match decision {
            Decision::Store(stored) => {
                let outcome = match stored.encode() {
                    Ok(payload) => match guard.complete(payload, self.status).await {
                        Ok(Fenced::Applied) => {
                            tracing::info!(status = self.status, "executed; result stored");
                            Outcome::Executed
                        }
                        Ok(Fenced::Stale) => {
                            tracing::warn!("lease lost before completion; result not stored");
                            Outcome::Fenced
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "result not stored; key released");
                            Outcome::StoreError
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "result cannot be encoded; key released");
                        release(guard, self.status).await;
                        metrics.released(ReleaseReason::Encode);
                        Outcome::Failed
                    }
                };
                // Counted before the client hears the end.
                metrics.request(outcome, Some(&self.key));
                if let Some(p) = self.publisher.take() {
                    p.complete();
                }
                self.send(Chunk::End);
                self.answer(None);
            }
            Decision::Release(reason) => {
                release(guard, self.status).await;
                metrics.released(reason);
                if self.events > 0 && !reason.delivered() {
                    metrics.events_lost(self.events);
                }
                // A response too large to store was still delivered whole.
                let outcome = if reason.delivered() {
                    Outcome::Executed
                } else {
                    Outcome::Failed
                };
                metrics.request(outcome, Some(&self.key));
                if let Some(p) = self.publisher.take() {
                    p.fail();
                }
                self.send(Chunk::Abort);
                let fallback = match reason {
                    ReleaseReason::CompletionTimeout => Problem::upstream_timeout("total"),
                    ReleaseReason::Shutdown => Problem::shutting_down(),
                    ReleaseReason::RetryableFailure
                    | ReleaseReason::RetryableStatus
                    | ReleaseReason::TooLarge
                    | ReleaseReason::BodyError
                    | ReleaseReason::StreamError
                    | ReleaseReason::Encode => {
                        Problem::upstream_unavailable("the upstream response failed")
                    }
                };
                self.answer(Some(fallback));
            }
        }
    }

    /// Sends the pending response (or `fallback`) if the client has not
    /// been answered yet.
    fn answer(&mut self, fallback: Option<Problem>) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let res = match (self.pending.take(), fallback) {
            (Some(res), _) => res,
            (None, Some(p)) => p.into_response(),
            (None, None) => Problem::internal().into_response(),
        };
        let _ = reply.send(res);
    }
}

async fn release(guard: LeaseGuard, status: Option<u16>) {
    if let Err(e) = guard.release(status).await {
        tracing::warn!(error = %e, "release failed; the key frees itself when its lease expires");
    }
}

/// Marks a response as executed now.
fn fresh(res: Response) -> Response {
    mark(res, false)
}

/// Headers of hop-by-hop or framing nature are never stored.
const NEVER_STORED: [HeaderName; 5] = [
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TRAILER,
    header::UPGRADE,
];

fn kept_headers(headers: &HeaderMap, cfg: &LayerConfig) -> HeaderMap {
    let mut out = HeaderMap::new();
    // The body is stored as sent: its type and encoding go with it.
    let wanted = [&header::CONTENT_TYPE, &header::CONTENT_ENCODING]
        .into_iter()
        .chain(cfg.stored_headers.iter());
    for name in wanted {
        if NEVER_STORED.contains(name) || out.contains_key(name) {
            continue;
        }
        for v in headers.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefer_parsing() {
        let mut h = HeaderMap::new();
        assert!(!prefers_async(&h));
        h.insert(
            PREFER,
            HeaderValue::from_static("return=minimal, Respond-Async; wait=5"),
        );
        assert!(prefers_async(&h));
        h.insert(PREFER, HeaderValue::from_static("respond-asyncx"));
        assert!(!prefers_async(&h));
    }

    #[test]
    fn stored_headers_keep_content_type_and_the_configured_ones() {
        let cfg = LayerConfig {
            stored_headers: vec![
                HeaderName::from_static("x-request-id"),
                header::CONTENT_LENGTH,
            ],
            ..LayerConfig::default()
        };
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert("x-request-id", HeaderValue::from_static("r1"));
        h.insert("set-cookie", HeaderValue::from_static("s=1"));
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let kept = kept_headers(&h, &cfg);
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[header::CONTENT_ENCODING], "gzip");
        assert_eq!(kept["x-request-id"], "r1");
        assert!(kept.get(header::CONTENT_LENGTH).is_none());
    }
}
