//! The service the layer wraps, as the request path sees it: one bound
//! ([`Inner`]) instead of the same five-line `where` clause on every
//! function, the call that drives it, and the two markers the layer and
//! that service exchange: the [`IdempotencyContext`] a request carries in,
//! the [`RetryableFailure`] a response may carry out.

use std::convert::Infallible;

use axum::body::Body;
use axum::response::Response;
use http::Request;
use idemgate_engine::{ClientKey, ScopedKey};
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
