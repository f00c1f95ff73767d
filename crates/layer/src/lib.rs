//! A tower [`Layer`](tower::Layer) that makes any axum service's handlers
//! idempotent: each operation runs at most once per idempotency key, and a
//! retry gets the stored response (JSON or a whole SSE stream) instead of
//! running the handler again.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use axum::{Router, routing::post};
//! use idemgate_engine::{Engine, MemoryStore};
//! use idemgate_layer::{IdempotencyLayer, LayerConfig};
//!
//! let engine = Engine::new(Arc::new(MemoryStore::new()));
//! let app: Router = Router::new()
//!     .route("/charge", post(|| async { "charged" }))
//!     .layer(IdempotencyLayer::new(engine, LayerConfig::new("charges")));
//! ```
//!
//! A service that streams (SSE) should set `TCP_NODELAY` on its accepted
//! connections (`axum::serve::ListenerExt::tap_io`, as `idemgate serve`
//! does): otherwise, on a kept-alive connection, an event written after the
//! response's head waits on Nagle's algorithm for the client's delayed ACK,
//! about 40 ms per stream on Linux.
//!
//! # Layout
//! Public modules:
//! - [`body_timeout`]: request bodies with an idle and a total read
//!   deadline, and the 408 a stalled body gets.
//! - [`config`]: [`LayerConfig`] and its modes (key, in-flight, tenant,
//!   store errors), with safe defaults.
//! - [`key`]: tenant (a hash of the credential) and key extraction or
//!   derivation.
//! - [`problem`]: RFC 9457 problem responses, one constructor per case.
//! - [`stored`]: the versioned binary form of a stored response and token
//!   usage extraction.
//! - [`sse`]: event boundary scanner, id rewriting, `Last-Event-ID`.
//! - [`live`]: streams in progress, for duplicates that attach: the
//!   [`LiveEvents`] trait and its in-process default.
//! - [`operations`]: `Prefer: respond-async` and the operation resource.
//! - [`telemetry`]: what the layer counts, through `idemgate-telemetry`
//!   (one outcome per request, hits, tokens saved, conflicts, releases).
//!
//! Private modules:
//! - `shared`: the state every clone of the layer shares.
//! - `verdict`: whether a 200 event stream succeeded, from its events.
//! - `partial`: what a broken stream on a charging route keeps (its
//!   events, then an `outcome-unknown` error event with the counts).
//! - `refusal`: the one path of a refusal (count, log, problem).
//! - `latency`: how long a route's executions take, for the delay a 409
//!   tells the client to wait.
//! - `replay`: answering from a stored result, and [`IDEMPOTENT_REPLAYED`].
//! - `service`: [`IdempotencyLayer`], the [`Idempotency`] service, shutdown,
//!   and the request path in its children (admission, the detached owner,
//!   duplicates that attach).
//! - `fuzzing` (feature `fuzzing` only): entry points to private parsers
//!   for the fuzz targets; not part of the API.
//!
//! Dependencies point one way: state, types and errors sit in leaves
//! (`config`, `problem`, `sse`, `stored`, `shared`, …), `replay` and
//! `refusal` build on them, `operations` on those, and `service` on top of
//! everything; nothing uses `service`, so the module graph has no cycle.
//!
//! # The key decision
//! The owner's work holds the lease and is **detachable** from the client's
//! request future: it runs inside the request until it answers, and when
//! the client times out or disconnects (the request is dropped), or the
//! answer is a stream, it moves to a task of its own. So the inner service
//! call and the reading of its response body continue without the client,
//! and the result is stored: the client's retry is a replay rather than a
//! second execution (and a second bill). The client is fed from the work
//! through a channel; results are stored before the client hears the end,
//! so a retry that follows an answer always finds the key settled.
//! A stream that breaks, a retryable status, a timeout or a shutdown
//! releases the key, so the retry runs again instead of waiting for a TTL
//! (on a route that keeps `outcome-unknown` answers, a failure after the
//! request was sent, a shutdown's cut included, is kept as that answer).

pub mod body_timeout;
pub mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod key;
mod latency;
pub mod live;
pub mod operations;
mod partial;
pub mod problem;
mod refusal;
mod replay;
mod service;
mod shared;
pub mod sse;
pub mod stored;
pub mod telemetry;
mod verdict;

pub use body_timeout::{BodyDeadline, BodyTimeout, BodyTimeouts, with_timeouts};
pub use config::{
    CompletionClock, DerivePart, DeriveTemplate, KeyMode, LayerConfig, OnInflight,
    OutcomeUnknownMode, StoreErrorMode, StreamDialect, TenantSource,
};
pub use live::{InProcessLive, LiveEvents};
pub use problem::Problem;
pub use replay::{IDEMPOTENT_REPLAYED, IDEMPOTENT_STORED};
pub use service::{
    Idempotency, IdempotencyContext, IdempotencyLayer, OutcomeUnknown, RetryableFailure,
    SendSignal, ShutdownReport,
};
pub use stored::{StoredBody, StoredResponse, StreamUsage, Usage};
