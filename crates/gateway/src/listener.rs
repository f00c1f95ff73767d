//! The accept loop of both listeners, with the connection limits of
//! [`ConnectionLimits`].
//!
//! Every client of the APIs behind the gateway can open connections to
//! it, so what one connection may hold is bounded, each limit with the
//! answer that fits it and a count in `idemgate_connection_limits_total`:
//!
//! | limit | past it |
//! |---|---|
//! | concurrent connections | the new connection gets 503 (`Retry-After: 1`) and is closed |
//! | header read time | 408 and closed if part of a request head arrived; closed if the connection sat idle |
//! | header size, header count | 431 and closed (hyper's parser) |
//! | request body idle gap, total read time | 408 `request-body-timeout` ([`idemgate_layer::with_timeouts`]) |
//! | send time (a write to the client makes no progress) | closed: the client stopped reading |
//!
//! The header clock also bounds idle kept-alive connections: it runs from
//! the connection's start, or from the end of its previous answer, to the
//! end of the next request head. Bodies are bounded in size by each
//! route's `body_limit`.
//!
//! The loop is written on hyper's HTTP/1 connection rather than
//! `axum::serve`, which sets none of these limits. Connection tasks live
//! in a [`JoinSet`] owned by the loop, so dropping the loop (the end of the
//! shutdown grace) closes every connection still open.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use idemgate_layer::{BodyTimeouts, with_timeouts};
use idemgate_telemetry::Telemetry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tower::ServiceExt;

/// Default of [`ConnectionLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default of [`ConnectionLimits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ConnectionLimits::body`]'s idle gap.
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`ConnectionLimits::body`]'s total read time.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Default of [`ConnectionLimits::send_timeout`].
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of [`ConnectionLimits::max_header_bytes`].
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Default of [`ConnectionLimits::max_headers`].
pub const DEFAULT_MAX_HEADERS: usize = 100;

/// What one client connection may hold (`[connections]` in the
/// configuration file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Client connections open at once; past it a new one gets 503.
    pub max_connections: usize,
    /// Longest time from a connection's start (or its previous answer) to
    /// the end of the next request head.
    pub header_read_timeout: Duration,
    /// Read deadlines of each request body.
    pub body: BodyTimeouts,
    /// Longest time a write to the client may make no progress. A client
    /// that stops reading would otherwise hold its connection (and the
    /// answer queued for it) for good; a stream with no new event to send
    /// is not writing, so this never cuts a quiet stream.
    pub send_timeout: Duration,
    /// Largest request head (request line and header fields), in bytes.
    pub max_header_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body: BodyTimeouts {
                idle: DEFAULT_BODY_IDLE_TIMEOUT,
                total: DEFAULT_BODY_READ_TIMEOUT,
            },
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
        }
    }
}

/// The answer of a connection over the limit, written without reading
/// anything from it.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 41\r\n\r\ntoo many connections; retry in a second.\n";

/// The answer of a connection whose request head did not arrive in time.
const HEAD_TIMED_OUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 42\r\n\r\nthe request head did not arrive in time.\r\n";

/// How long the loop pauses when accepting fails for want of file
/// descriptors, so it does not spin while connections drain.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` and serves `app` on each, within
/// `limits`, until `stop` turns true; then stops accepting, asks every
/// open connection to finish its current request and close, and returns
/// once all have. `counted`: report `idemgate_connections_open` and the
/// limits (the proxy listener; the admin listener is not counted).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
    counted: bool,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = counted.then(|| Telemetry::shared().connections_open());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .keep_alive(true);
    if limits.max_headers != DEFAULT_MAX_HEADERS {
        // hyper's default; setting any value moves the parse to the heap.
        http.max_headers(limits.max_headers);
    }
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                accept_failed(&e).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if counted {
                Telemetry::shared().connection_limit("connections");
            }
            // Nothing is read: the request is not this connection's to get.
            let _ = stream.try_write(OVER_CAPACITY);
            continue;
        };
        // Without TCP_NODELAY, an answer written in parts (a stream's head,
        // then each event) waits on Nagle's algorithm for the client's
        // delayed ACK on a kept-alive connection: ~40 ms per stream on Linux.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
        let http = http.clone();
        let app = app.clone();
        let mut stop = stop.clone();
        let open = open.clone();
        connections.spawn(async move {
            let _slot = slot;
            if let Some(g) = &open {
                g.increment(1.0);
            }
            let ended = Arc::new(Ended::default());
            let io = Watched {
                stream,
                read_since_write: false,
                send_timeout: limits.send_timeout,
                stalled: None,
                ended: Arc::clone(&ended),
            };
            let body = limits.body;
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let app = app.clone();
                let req = req.map(|b| with_timeouts(Body::new(b), body));
                async move { Ok::<_, Infallible>(app.oneshot(req).await.unwrap_or_else(|e| match e {})) }
            });
            // Boxed so it can be dropped (with its socket) before the
            // connection is counted closed.
            let mut conn = Box::pin(http.serve_connection(TokioIo::new(io), service));
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                connection_ended(&e, counted, &ended);
            }
            // Dropping the connection drops its socket (and writes the 408
            // if one is due).
            drop(conn);
            if let Some(g) = &open {
                g.decrement(1.0);
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// What an accept error means for the loop: out of descriptors, wait for
/// some to close; anything else (a connection reset before it was
/// accepted) concerns that connection only.
async fn accept_failed(e: &io::Error) {
    let out_of_descriptors = matches!(e.raw_os_error(), Some(23 | 24)); // ENFILE, EMFILE
    if out_of_descriptors {
        tracing::warn!(error = %e, "cannot accept: out of file descriptors; lower connections.max or raise the limit");
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

/// How a connection ended, as its socket saw it.
#[derive(Debug, Default)]
struct Ended {
    /// The header clock ran out: the socket writes the 408 on drop.
    head_timed_out: AtomicBool,
    /// A write made no progress for the send timeout.
    send_timed_out: AtomicBool,
}

/// Counts the limit a connection ended on, and arranges the 408 of a
/// request head that ran out of time.
fn connection_ended(e: &hyper::Error, counted: bool, ended: &Ended) {
    let limit = if ended.send_timed_out.load(Ordering::Relaxed) {
        Some("send_time")
    } else if e.is_timeout() {
        ended.head_timed_out.store(true, Ordering::Relaxed);
        Some("header_read_time")
    } else if e.is_parse_too_large() {
        Some("header_size")
    } else {
        None
    };
    match limit {
        Some(limit) => {
            tracing::debug!(error = %e, limit, "connection closed by a limit");
            if counted {
                Telemetry::shared().connection_limit(limit);
            }
        }
        None => tracing::debug!(error = %e, "connection ended with an error"),
    }
}

/// A client socket with two duties hyper leaves to its IO:
/// - it knows whether bytes arrived since it last wrote: when the header
///   clock runs out, hyper closes the connection without an answer, and
///   this writes the 408 on drop if a request head had begun (an idle
///   kept-alive connection is closed silently);
/// - a write that makes no progress for `send_timeout` fails, which ends
///   the connection.
struct Watched {
    stream: TcpStream,
    read_since_write: bool,
    send_timeout: Duration,
    /// Running while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
    ended: Arc<Ended>,
}

impl Watched {
    /// The outcome of a write poll, with the send clock applied: started
    /// when a write cannot proceed, cleared when one does.
    fn clocked(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Pending => {
                let timeout = self.send_timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stalled.as_mut().poll(cx).is_ready() {
                    self.ended.send_timed_out.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client read nothing for the send timeout",
                    )));
                }
                Poll::Pending
            }
            Poll::Ready(r) => {
                self.stalled = None;
                if matches!(r, Ok(n) if n > 0) {
                    self.read_since_write = false;
                }
                Poll::Ready(r)
            }
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.read_since_write && self.ended.head_timed_out.load(Ordering::Relaxed) {
            // Best effort, without blocking: the socket is being closed.
            let _ = self.stream.try_write(HEAD_TIMED_OUT);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.read_since_write = true;
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.clocked(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.clocked(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
