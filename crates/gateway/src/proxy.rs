//! The upstream proxy: one [`Proxy`] per route, the inner service of the
//! idempotency layer.
//!
//! Bodies stream both ways. Timeouts are layered, and every clock starts when
//! the request is actually sent (after any wait for a concurrency slot, which
//! is measured on its own):
//!
//! | phase | how | outcome |
//! |---|---|---|
//! | queue | `queue_timeout` on the wait for a concurrency slot | 503 `upstream-busy`, retryable |
//! | connect | `connect_timeout` on the client | 504 problem, retryable |
//! | first byte | `tokio::time::timeout` around sending (resolves at response headers) | 504 problem, outcome unknown |
//! | idle | a timeout on each body chunk | body error |
//! | total | one deadline for the whole body (`timeout_at` on each chunk) | body error |
//!
//! Answers are taken in their identity form. The client's `Accept-Encoding`
//! is not forwarded: the upstream client (`proxy/client.rs`) then asks for
//! the encodings it can decode (gzip, brotli, deflate), decodes them, and
//! drops `Content-Encoding` and `Content-Length`. So what is stored, scanned
//! for events and read for token usage is the plain answer, and a replay
//! never sends an encoding the replaying client did not accept. Decoding,
//! rather than asking for `identity`, also covers upstreams (and CDNs in
//! front of them) that compress whatever they are asked.
//! Decoding is bounded, and a `1xx` answer or an encoding that cannot be
//! decoded is a broken answer, never stored (`proxy/decoded.rs`).
//!
//! A refused connection is a 502 problem, retryable. Synthetic responses for
//! failures *before* sending carry a [`RetryableFailure`] marker, so the
//! layer releases the key whatever the route's retryable statuses say: the
//! upstream saw nothing. Failures *after* sending (first-byte timeout, any
//! other error from the send, such as a connection cut before the response)
//! carry an [`OutcomeUnknown`] marker instead: the upstream may have run the
//! work, and the layer decides by route (a charging route keeps the answer).
//!
//! The moment of sending is also told to the layer through the request's
//! [`SendSignal`], so the layer's own deadline, like every clock here,
//! starts after the queue: a request queued behind a long one is not cut
//! for time it spent waiting.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::{BoxError, Service};
use tower_http::decompression::Decompression;
use url::Url;

use idemgate_layer::{IdempotencyContext, OutcomeUnknown, Problem, RetryableFailure, SendSignal};
use idemgate_telemetry::names;

use crate::config::{RouteConfig, Timeouts};
pub use crate::error::ProxyBuildError;
use crate::problem::problem;
pub use client::ClientBuildError;
use client::UpstreamClient;
use decoded::{CountingBody, RawBytes};

/// A body error from the upstream response stream: the response was cut.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamBodyError {
    /// No chunk arrived within the idle timeout.
    #[error("upstream idle for longer than {0:?}")]
    Idle(Duration),
    /// The body did not end within the total timeout.
    #[error("upstream response exceeded the total timeout of {0:?}")]
    Total(Duration),
    /// The upstream connection failed mid-body, or its encoding did not
    /// decode.
    #[error("upstream body failed")]
    Upstream(#[source] BoxError),
    /// A compressed answer decoded past the gateway's bounds (its size or
    /// its ratio to the bytes received).
    #[error("a compressed upstream answer decoded to more than {decoded} bytes from {raw}")]
    DecodedTooLarge {
        /// Bytes decoded so far.
        decoded: u64,
        /// Bytes received so far.
        raw: u64,
    },
}

/// The upstream proxy of one route. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Proxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: UpstreamClient,
    route: Arc<str>,
    upstream: Url,
    prefix: String,
    strip_prefix: bool,
    timeouts: Timeouts,
    key_header: HeaderName,
    body_limit: usize,
    /// Bounds concurrent upstream requests; the permit lives as long as the
    /// response body, so a long stream holds its slot until it ends.
    limit: Option<Arc<Semaphore>>,
    /// Longest wait for a slot of `limit`.
    queue_timeout: Duration,
    /// The route's phase histograms, looked up once: a lookup by name and
    /// labels on every request was a measurable part of a request's cost.
    phases: Phases,
}

/// Histograms of where an upstream request spends its time.
#[derive(Debug, Clone)]
struct Phases {
    queue: metrics::Histogram,
    first_byte: metrics::Histogram,
    total: metrics::Histogram,
}

impl Phases {
    fn of(route: &str) -> Self {
        let phase = |p: &'static str| metrics::histogram!(names::UPSTREAM_PHASE, "route" => route.to_owned(), "phase" => p);
        Self {
            queue: metrics::histogram!(names::UPSTREAM_QUEUE, "route" => route.to_owned()),
            first_byte: phase("first_byte"),
            total: phase("total"),
        }
    }
}

/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

impl Proxy {
    /// A proxy for `route`.
    ///
    /// # Errors
    /// The HTTP client could not be built (TLS setup failed).
    pub fn new(route: &RouteConfig) -> Result<Self, ProxyBuildError> {
        let label: Arc<str> = route.id.as_str().into();
        let client =
            client::build(&label, route.timeouts.connect).map_err(|source| ProxyBuildError {
                route: route.id.clone(),
                source: Box::new(source),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                route: label,
                upstream: route.upstream.clone(),
                prefix: route.prefix.clone(),
                strip_prefix: route.strip_prefix,
                timeouts: route.timeouts,
                key_header: route.upstream_key_header.clone(),
                body_limit: route.body_limit,
                limit: route.concurrency_limit.map(|n| Arc::new(Semaphore::new(n))),
                queue_timeout: route.queue_timeout,
                phases: Phases::of(route.id.as_str()),
            }),
        })
    }

    /// Forwards one request and returns the upstream's response (its body
    /// streaming), or a synthetic problem response.
    pub async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let inner = &self.inner;
        let queued = Instant::now();
        let permit: Option<OwnedSemaphorePermit> = match &inner.limit {
            Some(sem) => {
                match tokio::time::timeout(inner.queue_timeout, Arc::clone(sem).acquire_owned())
                    .await
                {
                    // The semaphore is never closed; if it were, run unlimited.
                    Ok(permit) => permit.ok(),
                    Err(_) => return inner.queue_timed_out(),
                }
            }
            None => None,
        };
        let queue_wait = queued.elapsed();
        inner.phases.queue.record(queue_wait.as_secs_f64());
        if inner.limit.is_some() {
            tracing::debug!(route = %inner.route, queue_wait_ms = queue_wait.as_millis() as u64, "upstream slot acquired");
        }

        let (parts, body) = req.into_parts();
        let url = match inner.upstream_url(&parts.uri) {
            Some(u) => u,
            None => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "bad-path",
                    "Bad path",
                    "the request path cannot be mapped to the upstream",
                );
            }
        };
        let headers = inner.upstream_headers(&parts.headers, &parts.extensions);
        let body = match inner.upstream_body(body).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let uri = match http::Uri::try_from(String::from(url)) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(route = %inner.route, error = %e, "upstream request not built");
                return problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unavailable",
                    "Upstream request failed",
                    "the upstream request could not be built",
                );
            }
        };
        let mut request = Request::new(body);
        *request.method_mut() = parts.method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;

        // Every upstream clock starts here, after the queue; the layer's too.
        if let Some(signal) = parts.extensions.get::<SendSignal>() {
            signal.sent();
        }
        let sent = Instant::now();
        let deadline = sent + inner.timeouts.total;
        let first_byte = inner.timeouts.first_byte.min(inner.timeouts.total);
        let raw = RawBytes::default();
        let counted = raw.clone();
        let counting = tower::ServiceExt::map_response(&inner.client, move |r: Response<_>| {
            r.map(|body| CountingBody::new(body, counted.clone()))
        });
        let sending = Decompression::new(counting).call(request);
        let response = match tokio::time::timeout(first_byte, sending).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return inner.send_failed(&e),
            Err(_) => {
                let mut resp = inner.timed_out("first_byte", first_byte);
                // Sent, no answer: the upstream may be doing the work.
                resp.extensions_mut().remove::<RetryableFailure>();
                resp.extensions_mut().insert(OutcomeUnknown {
                    phase: "first_byte",
                });
                return resp;
            }
        };
        inner.phases.first_byte.record(sent.elapsed().as_secs_f64());

        let (mut head, body) = response.into_parts();
        if let Some(why) = decoded::unstorable(head.status, &head.headers) {
            return inner.broken_answer(&why);
        }
        strip_hop_by_hop(&mut head.headers);
        let stream = timed_body(
            body.into_data_stream(),
            BodyClock {
                route: Arc::clone(&inner.route),
                total_phase: inner.phases.total.clone(),
                sent,
                deadline,
                idle: inner.timeouts.idle,
                total: inner.timeouts.total,
                raw,
                decoded: 0,
                _permit: permit,
            },
        );
        let mut resp = Response::new(Body::from_stream(stream));
        *resp.status_mut() = head.status;
        *resp.headers_mut() = head.headers;
        resp
    }
}

impl Inner {
    fn upstream_url(&self, uri: &http::Uri) -> Option<Url> {
        let path = uri.path();
        let path = if self.strip_prefix && self.prefix != "/" {
            path.strip_prefix(self.prefix.as_str())?
        } else {
            path
        };
        let base = self.upstream.path().trim_end_matches('/');
        let mut url = self.upstream.clone();
        if path.is_empty() {
            url.set_path(if base.is_empty() { "/" } else { base });
        } else if path.starts_with('/') {
            url.set_path(&format!("{base}{path}"));
        } else {
            return None;
        }
        url.set_query(uri.query());
        Some(url)
    }

    fn upstream_headers(&self, incoming: &HeaderMap, ext: &http::Extensions) -> HeaderMap {
        let mut headers = incoming.clone();
        strip_hop_by_hop(&mut headers);
        // The client sets Host from the upstream URL and the length from the body.
        headers.remove(header::HOST);
        headers.remove(header::CONTENT_LENGTH);
        // The client asks for, and decodes, the encodings it knows (module docs).
        headers.remove(header::ACCEPT_ENCODING);
        // The body was read (or is being streamed) already: an upstream
        // must not wait to be asked for it.
        headers.remove(header::EXPECT);
        // The key the idempotency layer used (sent or derived); without the
        // layer, the client's own header.
        let key = ext
            .get::<IdempotencyContext>()
            .map(|c| c.key.as_str().to_owned())
            .or_else(|| {
                incoming
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|raw| idemgate_engine::ClientKey::parse(raw).ok())
                    .map(|k| k.as_str().to_owned())
            });
        if let Some(value) = key.and_then(|k| HeaderValue::from_str(&k).ok()) {
            headers.insert(self.key_header.clone(), value);
        }
        headers
    }

    /// A body of known size (the idempotency layer buffers what it
    /// protects) is sent with its length; any other is streamed chunked and
    /// cut at the body limit.
    async fn upstream_body(&self, body: Body) -> Result<Body, Response<Body>> {
        let limit = self.body_limit;
        if let Some(len) = body.size_hint().exact() {
            if usize::try_from(len).map_or(true, |l| l > limit) {
                return Err(too_large(limit));
            }
            return match body.collect().await {
                Ok(collected) => Ok(Body::from(collected.to_bytes())),
                Err(e) => {
                    tracing::debug!(route = %self.route, error = %e, "request body failed");
                    if let Some(idemgate_layer::BodyTimeout(deadline)) =
                        idemgate_layer::BodyTimeout::find(&e)
                    {
                        return Err(axum::response::IntoResponse::into_response(
                            idemgate_layer::Problem::request_body_timeout(deadline),
                        ));
                    }
                    Err(problem(
                        StatusCode::BAD_REQUEST,
                        "bad-body",
                        "Request body failed",
                        "the request body could not be read",
                    ))
                }
            };
        }
        let mut seen = 0usize;
        let stream = TryStreamExt::and_then(
            TryStreamExt::map_err(body.into_data_stream(), std::io::Error::other),
            move |chunk: Bytes| {
                seen = seen.saturating_add(chunk.len());
                let over = seen > limit;
                async move {
                    if over {
                        Err(std::io::Error::other(
                            "request body exceeds the route limit",
                        ))
                    } else {
                        Ok(chunk)
                    }
                }
            },
        );
        Ok(Body::from_stream(stream))
    }

    fn send_failed(&self, e: &hyper_util::client::legacy::Error) -> Response<Body> {
        if e.is_connect() && client::connect_timed_out(e) {
            return self.timed_out("connect", self.timeouts.connect);
        }
        let phase = if e.is_connect() { "connect" } else { "send" };
        metrics::counter!(names::UPSTREAM_ERRORS, "route" => self.route.to_string(), "phase" => phase)
            .increment(1);
        tracing::warn!(route = %self.route, phase, error = %e, "upstream unavailable");
        let mut resp = problem(
            StatusCode::BAD_GATEWAY,
            "upstream-unavailable",
            "Upstream unavailable",
            &format!("the upstream failed before answering ({phase})"),
        );
        if e.is_connect() {
            resp.extensions_mut().insert(RetryableFailure { phase });
        } else {
            // The connection failed after the request went out (for
            // example, cut before the response): it may have run.
            resp.extensions_mut().insert(OutcomeUnknown { phase });
        }
        resp
    }

    /// An answer that must never be stored (a `1xx`, an encoding that
    /// cannot be decoded): the request was sent and may have run, so it is
    /// a broken answer, like a body cut mid-way.
    fn broken_answer(&self, why: &str) -> Response<Body> {
        metrics::counter!(names::UPSTREAM_ERRORS, "route" => self.route.to_string(), "phase" => "answer")
            .increment(1);
        tracing::warn!(route = %self.route, reason = why, "upstream answer cannot be stored");
        let mut resp = problem(
            StatusCode::BAD_GATEWAY,
            "upstream-answer-broken",
            "Upstream answer broken",
            why,
        );
        resp.extensions_mut()
            .insert(OutcomeUnknown { phase: "answer" });
        resp
    }

    /// No slot freed within the queue timeout: nothing was sent, so the key
    /// is released and a retry is safe.
    fn queue_timed_out(&self) -> Response<Body> {
        metrics::counter!(names::UPSTREAM_TIMEOUTS, "route" => self.route.to_string(), "phase" => "queue")
            .increment(1);
        tracing::warn!(route = %self.route, queue_timeout_ms = self.queue_timeout.as_millis() as u64, "no upstream slot within the queue timeout");
        let mut resp = Problem::upstream_busy(self.queue_timeout).into_response();
        resp.extensions_mut()
            .insert(RetryableFailure { phase: "queue" });
        resp
    }

    fn timed_out(&self, phase: &'static str, after: Duration) -> Response<Body> {
        metrics::counter!(names::UPSTREAM_TIMEOUTS, "route" => self.route.to_string(), "phase" => phase)
            .increment(1);
        tracing::warn!(route = %self.route, phase, timeout_ms = after.as_millis() as u64, "upstream timeout");
        let mut resp = problem(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream-timeout",
            "Upstream timeout",
            &format!("the upstream did not answer within the {phase} timeout of {after:?}"),
        );
        resp.extensions_mut().insert(RetryableFailure { phase });
        resp
    }
}

fn too_large(limit: usize) -> Response<Body> {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "Body too large",
        &format!("the request body exceeds the route limit of {limit} bytes"),
    )
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named by `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// State of a response body in flight: its deadlines, its concurrency slot.
struct BodyClock {
    route: Arc<str>,
    total_phase: metrics::Histogram,
    sent: Instant,
    deadline: Instant,
    idle: Duration,
    total: Duration,
    /// Bytes received, under the decoder.
    raw: RawBytes,
    /// Bytes decoded so far.
    decoded: u64,
    /// Held until the body ends or is dropped.
    _permit: Option<OwnedSemaphorePermit>,
}

fn timed_body<S>(
    upstream: S,
    clock: BodyClock,
) -> impl Stream<Item = Result<Bytes, UpstreamBodyError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
{
    let upstream = Box::pin(upstream);
    futures_util::stream::unfold(Some((upstream, clock)), |state| async move {
        let (mut upstream, mut clock) = state?;
        let idle_at = Instant::now() + clock.idle;
        let (at, phase) = if idle_at < clock.deadline {
            (idle_at, "idle")
        } else {
            (clock.deadline, "total")
        };
        match tokio::time::timeout_at(at, upstream.next()).await {
            Ok(Some(Ok(chunk))) => {
                clock.decoded += chunk.len() as u64;
                let raw = clock.raw.get();
                if decoded::past_bounds(clock.decoded, raw) {
                    metrics::counter!(names::UPSTREAM_ERRORS, "route" => clock.route.to_string(), "phase" => "decode")
                        .increment(1);
                    tracing::warn!(route = %clock.route, decoded = clock.decoded, raw, "compressed upstream answer past the decoding bounds");
                    let err = UpstreamBodyError::DecodedTooLarge {
                        decoded: clock.decoded,
                        raw,
                    };
                    return Some((Err(err), None));
                }
                Some((Ok(chunk), Some((upstream, clock))))
            }
            Ok(Some(Err(e))) => {
                metrics::counter!(names::UPSTREAM_ERRORS, "route" => clock.route.to_string(), "phase" => "body")
                    .increment(1);
                tracing::warn!(route = %clock.route, error = %e, "upstream body failed");
                Some((Err(UpstreamBodyError::Upstream(e)), None))
            }
            Ok(None) => {
                clock.total_phase.record(clock.sent.elapsed().as_secs_f64());
                None
            }
            Err(_) => {
                metrics::counter!(names::UPSTREAM_TIMEOUTS, "route" => clock.route.to_string(), "phase" => phase)
                    .increment(1);
                tracing::warn!(route = %clock.route, phase, "upstream timeout mid-body");
                let err = if phase == "idle" {
                    UpstreamBodyError::Idle(clock.idle)
                } else {
                    UpstreamBodyError::Total(clock.total)
                };
                Some((Err(err), None))
            }
        }
    })
}

impl Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

mod client;
mod decoded;
#[cfg(test)]
mod tests;
