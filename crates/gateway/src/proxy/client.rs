//! The upstream HTTP client of a route: hyper-util's pooled client, a
//! connector that times its connects, and tower-http's decompression.
//!
//! It is built from parts rather than taken whole from reqwest. reqwest
//! runs on the same client, but per request it parses the URL again,
//! clones its connector and runs its redirect policy: on loopback, 25 µs
//! of CPU per request against 14 µs for the same request on these parts
//! (see BENCHMARKS.md, "The upstream client"). What reqwest set by default
//! and a gateway needs is set here too: `TCP_NODELAY` (a streamed answer
//! is written event by event), TCP keepalive probes every 15 s (a
//! generation can be silent for minutes; a peer that vanished is found),
//! idle pooled connections closed after 60 s, redirects not followed.
//!
//! The connect timeout lives in the connector rather than in hyper-util's
//! `HttpConnector`, so it covers the TLS handshake as well, and its error
//! is a type of our own ([`ConnectTimedOut`]) that the proxy finds in the
//! error's chain to tell a timed-out connect from a refused one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;
use tower::{BoxError, Service};

use idemgate_telemetry::names;

/// The transport under the pool: plain TCP, or TCP and TLS.
#[cfg(feature = "tls")]
type Transport = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Transport = HttpConnector;

/// The pooled client a route sends its upstream requests with.
pub(crate) type UpstreamClient = Client<TimedConnect<Transport>, Body>;

/// The connect did not finish (TCP, and TLS where used) within the route's
/// connect timeout.
#[derive(Debug, thiserror::Error)]
#[error("connect timed out after {0:?}")]
pub(crate) struct ConnectTimedOut(pub(crate) Duration);

/// Why a route's client could not be made: only TLS setup can fail.
#[derive(Debug, thiserror::Error)]
#[error("TLS setup failed")]
pub struct ClientBuildError(#[source] std::io::Error);

/// Builds the client of `route` with a connect timeout of `connect`.
pub(crate) fn build(
    route: &Arc<str>,
    connect: Duration,
) -> Result<UpstreamClient, ClientBuildError> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(15)));
    http.set_keepalive_interval(Some(Duration::from_secs(15)));
    http.set_keepalive_retries(Some(3));
    let transport = transport(http)?;
    let connector = TimedConnect {
        inner: transport,
        timeout: connect,
        histogram: metrics::histogram!(names::UPSTREAM_PHASE, "route" => route.to_string(), "phase" => "connect"),
    };
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_timer(TokioTimer::new())
        .build(connector))
}

#[cfg(feature = "tls")]
fn transport(mut http: HttpConnector) -> Result<Transport, ClientBuildError> {
    // The scheme is left to the TLS connector (http or https).
    http.enforce_http(false);
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_platform_verifier(provider)
        .map_err(ClientBuildError)?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

#[cfg(not(feature = "tls"))]
fn transport(http: HttpConnector) -> Result<Transport, ClientBuildError> {
    Ok(http)
}

/// A connector that bounds each connect by a timeout and records how long
/// it took (`phase="connect"`).
#[derive(Clone, Debug)]
pub(crate) struct TimedConnect<C> {
    inner: C,
    timeout: Duration,
    histogram: metrics::Histogram,
}

impl<C> Service<Uri> for TimedConnect<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        let histogram = self.histogram.clone();
        Box::pin(async move {
            let started = Instant::now();
            let out = tokio::time::timeout(timeout, connecting).await;
            histogram.record(started.elapsed().as_secs_f64());
            match out {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            }
        })
    }
}

/// Whether `error`'s chain holds a [`ConnectTimedOut`].
pub(crate) fn connect_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if e.is::<ConnectTimedOut>() {
            return true;
        }
        cur = e.source();
    }
    false
}
