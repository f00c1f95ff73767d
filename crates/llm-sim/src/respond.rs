//! The shared life of one generation request: count it, pace it, bill it,
//! break it on request.
//!
//! Work runs in spawned tasks, not in the handler: the handler future is
//! dropped when the client goes away, and the point of this simulator is
//! that the provider's work does *not* stop then (non-streaming) or stops
//! only when the provider notices (streaming).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::connection::Connection;
use crate::control::{Control, Fault};
use crate::dialect::{Dialect, ErrorKind, Generation, Meta};
use crate::encoding::Encoding;
use crate::sim::Sim;
use crate::stats::Stats;

/// Response header carrying the execution number of a generated response.
pub const EXECUTION_HEADER: &str = "x-sim-execution";

/// One piece of a response body, from the generating task to the body
/// stream.
#[derive(Debug)]
enum Frame {
    /// Send the response headers now, with no body bytes yet.
    Ready,
    /// Body bytes.
    Data(Bytes),
    /// Break the connection: the body ends with an error, so the client
    /// sees a truncated response rather than a clean end.
    Abort,
}

/// Frames buffered between the generator and the connection. Generation
/// runs at model pace, not client pace, as a provider's does.
const FRAME_BUFFER: usize = 256;

/// The handler for a generation endpoint in dialect `D`.
pub(crate) async fn generate<D: Dialect>(
    State(sim): State<Arc<Sim>>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    sim.stats.request();
    let mut control = match Control::from_headers(&sim.config, &headers) {
        Ok(control) => control,
        Err(message) => {
            return error::<D>(StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, &message);
        }
    };
    let encoding = match Encoding::choose(&headers) {
        Ok(encoding) => encoding,
        Err(message) => {
            return error::<D>(StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, &message);
        }
    };
    let generation = match D::parse(&body, control.completion_tokens) {
        Ok(generation) => generation,
        Err(message) => {
            return error::<D>(StatusCode::BAD_REQUEST, ErrorKind::InvalidRequest, &message);
        }
    };
    control.caller.body_sha256 = hex::encode(Sha256::digest(&body));
    if control.fault.is_some() {
        sim.stats.failure_injected();
    }
    match control.fault {
        Some(Fault::BadRequest) => {
            if !watched_sleep(&sim, control.first_token_delay).await {
                return shutting_down::<D>();
            }
            error::<D>(
                StatusCode::BAD_REQUEST,
                ErrorKind::InvalidRequest,
                "simulated invalid request (x-sim-fail: 400)",
            )
        }
        Some(Fault::RateLimited) => {
            if !watched_sleep(&sim, control.first_token_delay).await {
                return shutting_down::<D>();
            }
            let mut response = error::<D>(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorKind::RateLimit,
                "simulated rate limit (x-sim-fail: 429)",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        Some(Fault::ServerError(code)) => {
            sim.stats.execution(&control.caller);
            if !watched_sleep(&sim, control.first_token_delay).await {
                return shutting_down::<D>();
            }
            let (status, kind) = if code == 503 {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorKind::Overloaded)
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorKind::Server)
            };
            error::<D>(
                status,
                kind,
                &format!("simulated failure (x-sim-fail: {code})"),
            )
        }
        Some(Fault::Close) => {
            sim.stats.execution(&control.caller);
            let connection = extensions.get::<ConnectInfo<Connection>>();
            if !connection.is_some_and(|c| c.0.close()) {
                return error::<D>(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorKind::Server,
                    "x-sim-fail: close needs the simulator's own server",
                );
            }
            // The connection is gone; this future is dropped with it.
            sim.shutdown_signal().await;
            shutting_down::<D>()
        }
        Some(Fault::Hang) => {
            sim.stats.execution(&control.caller);
            let guard = DisconnectGuard::new(&sim.stats);
            sim.shutdown_signal().await;
            guard.disarm();
            shutting_down::<D>()
        }
        Some(
            Fault::ResetAfter(_) | Fault::StallAfter(_) | Fault::ErrorAfter(_) | Fault::EndAfter(_),
        )
        | None => {
            if generation.stream {
                stream::<D>(sim, control, generation, encoding).await
            } else {
                complete::<D>(sim, control, generation, encoding).await
            }
        }
    }
}

/// Non-streaming: the whole generation takes `latency` and runs to the end
/// whether or not the client is still there.
async fn complete<D: Dialect>(
    sim: Arc<Sim>,
    control: Control,
    generation: Generation,
    encoding: Encoding,
) -> Response {
    let sequence = sim.stats.execution(&control.caller);
    let meta = Meta::new(D::response_id(sequence));
    sim.stats.bill(generation.prompt_tokens, 0);

    let (done_tx, done_rx) = oneshot::channel();
    let worker = Arc::clone(&sim);
    let tokens = generation.completion_tokens();
    let latency = control.latency;
    tokio::spawn(async move {
        if worker.sleep(latency).await {
            worker.stats.complete(tokens);
            // The client may be gone; the work is done and billed anyway.
            let _ = done_tx.send(());
        }
    });

    let guard = DisconnectGuard::new(&sim.stats);
    let finished = done_rx.await.is_ok();
    guard.disarm();
    if !finished {
        return shutting_down::<D>();
    }

    let body = Bytes::from(D::message(&generation, &meta).to_string());
    let cut = match control.fault {
        Some(Fault::ResetAfter(n) | Fault::StallAfter(n)) => {
            // A broken transfer: the first n bytes (never all of them).
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            Some(body.slice(..n.min(body.len().saturating_sub(1))))
        }
        _ => None,
    };
    let Some(prefix) = cut else {
        let (tx, rx) = mpsc::channel(1);
        drop(tx);
        let mut response = body_response(Some(body), rx, encoding);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(execution_header(), HeaderValue::from(sequence));
        return response;
    };

    let (tx, rx) = mpsc::channel(FRAME_BUFFER);
    let fault = control.fault;
    tokio::spawn(async move {
        if tx.send(Frame::Data(prefix)).await.is_err() {
            sim.stats.client_disconnect();
            return;
        }
        match fault {
            Some(Fault::StallAfter(_)) => stall(&sim, &tx).await,
            _ => abort_after(&sim, &tx, Duration::ZERO).await,
        }
    });
    let mut response = body_response(None, rx, encoding);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(execution_header(), HeaderValue::from(sequence));
    response
}

/// Streaming: headers and the first token after `first_token_delay`, then
/// one token per `token_interval`. Generation stops when the client leaves.
async fn stream<D: Dialect>(
    sim: Arc<Sim>,
    control: Control,
    generation: Generation,
    encoding: Encoding,
) -> Response {
    let sequence = sim.stats.execution(&control.caller);
    let meta = Meta::new(D::response_id(sequence));
    sim.stats.bill(generation.prompt_tokens, 0);

    let (tx, mut rx) = mpsc::channel(FRAME_BUFFER);
    tokio::spawn(run_stream::<D>(
        Arc::clone(&sim),
        control,
        generation,
        meta,
        tx,
    ));

    // Headers go out with the first event, as a provider's do: until then
    // the client has received nothing (its first-byte clock is running).
    let initial = match rx.recv().await {
        Some(Frame::Data(bytes)) => Some(bytes),
        Some(Frame::Ready) => None,
        Some(Frame::Abort) | None => return shutting_down::<D>(),
    };
    let mut response = body_response(initial, rx, encoding);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(execution_header(), HeaderValue::from(sequence));
    response
}

/// The generating side of a stream.
async fn run_stream<D: Dialect>(
    sim: Arc<Sim>,
    control: Control,
    generation: Generation,
    meta: Meta,
    tx: mpsc::Sender<Frame>,
) {
    if !pace(&sim, &tx, control.first_token_delay).await {
        return;
    }
    let total = generation.tokens.len();
    let emitted = match control.fault {
        Some(
            Fault::ResetAfter(n) | Fault::StallAfter(n) | Fault::ErrorAfter(n) | Fault::EndAfter(n),
        ) => usize::try_from(n).unwrap_or(usize::MAX).min(total),
        _ => total,
    };
    let mut pending = D::stream_start(&generation, &meta);
    for (i, token) in generation.tokens[..emitted].iter().enumerate() {
        if i > 0 && !pace(&sim, &tx, control.token_interval).await {
            return;
        }
        sim.stats.bill(0, 1);
        pending.push_str(&D::stream_token(&generation, &meta, token));
        if tx
            .send(Frame::Data(Bytes::from(std::mem::take(&mut pending))))
            .await
            .is_err()
        {
            sim.stats.client_disconnect();
            return;
        }
    }
    match control.fault {
        Some(Fault::ResetAfter(_) | Fault::StallAfter(_)) => {
            // With zero tokens nothing has been sent: release the headers
            // alone, so the client holds an open, silent response.
            if emitted == 0 && tx.send(Frame::Ready).await.is_err() {
                sim.stats.client_disconnect();
                return;
            }
            if let Some(Fault::StallAfter(_)) = control.fault {
                stall(&sim, &tx).await;
            } else {
                // The reset comes when the next token would have.
                abort_after(&sim, &tx, control.token_interval).await;
            }
        }
        Some(Fault::ErrorAfter(_) | Fault::EndAfter(_)) => {
            // The provider stops after it has answered 200: with its error
            // event, or with nothing at all. Nothing more is generated.
            if let Some(Fault::ErrorAfter(_)) = control.fault {
                pending.push_str(&D::stream_error(
                    &meta,
                    "simulated failure during generation (x-sim-fail: error-after)",
                ));
            }
            sim.stats.complete(0);
            if tx.send(Frame::Data(Bytes::from(pending))).await.is_err() {
                sim.stats.client_disconnect();
            }
        }
        _ => {
            pending.push_str(&D::stream_end(&generation, &meta));
            // Counted before the last bytes leave, so that a client that
            // has read `[DONE]` already sees the generation as completed.
            sim.stats.complete(0);
            if tx.send(Frame::Data(Bytes::from(pending))).await.is_err() {
                sim.stats.client_disconnect();
            }
        }
    }
}

/// Waits `delay` unless the client leaves (counted) or the simulator shuts
/// down (the stream is aborted). True when generation may go on.
async fn pace(sim: &Sim, tx: &mpsc::Sender<Frame>, delay: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = tx.closed() => {
            sim.stats.client_disconnect();
            false
        }
        () = sim.shutdown_signal() => {
            let _ = tx.try_send(Frame::Abort);
            false
        }
    }
}

/// Keeps the response open and silent until the client leaves (counted)
/// or the simulator shuts down.
async fn stall(sim: &Sim, tx: &mpsc::Sender<Frame>) {
    tokio::select! {
        () = tx.closed() => sim.stats.client_disconnect(),
        () = sim.shutdown_signal() => {
            let _ = tx.try_send(Frame::Abort);
        }
    }
}

/// Breaks the connection after `delay`. The delay also lets the bytes
/// already queued reach the client before the break.
async fn abort_after(sim: &Sim, tx: &mpsc::Sender<Frame>, delay: Duration) {
    if pace(sim, tx, delay).await {
        let _ = tx.send(Frame::Abort).await;
    }
}

/// A response whose body is `initial` followed by the frames of `rx`, in
/// `encoding` (each frame flushed as it comes).
fn body_response(
    initial: Option<Bytes>,
    rx: mpsc::Receiver<Frame>,
    encoding: Encoding,
) -> Response {
    let start = Some((initial, rx, encoding.encoder()));
    let frames = futures_util::stream::unfold(start, |state| async move {
        let (mut initial, mut rx, mut encoder) = state?;
        if let Some(bytes) = initial.take() {
            let out = encoder.chunk(&bytes);
            return Some((out, Some((None, rx, encoder))));
        }
        loop {
            match rx.recv().await {
                Some(Frame::Data(bytes)) => {
                    let out = encoder.chunk(&bytes);
                    return Some((out, Some((None, rx, encoder))));
                }
                Some(Frame::Ready) => continue,
                Some(Frame::Abort) => {
                    let error = io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "simulated connection reset",
                    );
                    return Some((Err(error), None));
                }
                None => {
                    let tail = encoder.finish().ok().filter(|b| !b.is_empty())?;
                    return Some((Ok(tail), None));
                }
            }
        }
    });
    let mut response = Response::new(Body::from_stream(frames));
    if let Some(value) = encoding.header_value() {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static(value));
    }
    response
}

fn execution_header() -> header::HeaderName {
    header::HeaderName::from_static(EXECUTION_HEADER)
}

/// A provider-shaped JSON error response.
pub(crate) fn error<D: Dialect>(status: StatusCode, kind: ErrorKind, message: &str) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        D::error_body(kind, message).to_string(),
    )
        .into_response()
}

fn shutting_down<D: Dialect>() -> Response {
    error::<D>(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Overloaded,
        "the simulator is shutting down",
    )
}

/// Counts a client disconnect if dropped while armed: the handler future
/// is dropped when the client goes away before the response is ready.
struct DisconnectGuard<'a> {
    stats: &'a Stats,
    armed: bool,
}

impl<'a> DisconnectGuard<'a> {
    fn new(stats: &'a Stats) -> Self {
        Self { stats, armed: true }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for DisconnectGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.stats.client_disconnect();
        }
    }
}

/// Sleeps `delay` before answering; a client leaving meanwhile is counted.
/// False if the simulator shuts down first.
async fn watched_sleep(sim: &Sim, delay: Duration) -> bool {
    let guard = DisconnectGuard::new(&sim.stats);
    let slept = sim.sleep(delay).await;
    guard.disarm();
    slept
}
