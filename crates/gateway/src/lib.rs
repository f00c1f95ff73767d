//! The idemgate HTTP gateway: a reverse proxy in front of LLM APIs (or any
//! HTTP service) that runs each keyed request at most once.
//!
//! # Layout
//! Leaves first; each module uses only the ones above it in this list.
//! - [`GatewayError`] (module `error`): why the gateway could not start or
//!   stopped.
//! - [`problem`]: the gateway's own RFC 9457 problem responses.
//! - [`listener`]: the accept loop of both listeners and the connection
//!   limits (count, header and body read time, header size).
//! - [`config`]: configuration in two phases (raw TOML/env/flags, then typed
//!   and validated [`GatewayConfig`]); a route's modes are the idempotency
//!   layer's own types.
//! - [`plan`]: the configuration as the pre-launch checklist's plan
//!   (`idemgate check`), and which findings refuse a start.
//! - [`proxy`]: the upstream proxy service with layered timeouts.
//! - [`telemetry`]: the metrics pipeline (idemgate-telemetry's Prometheus
//!   recorder) behind the admin `/metrics`.
//! - `admin`: the admin listener's endpoints.
//! - `stores`: opening the configured store (memory, SQLite, Redis,
//!   Redis Cluster, PostgreSQL) and the live-event fan-out that goes with it.
//! - [`serve`](mod@serve): [`serve()`] and [`bind_and_serve()`]: the start
//!   checks, store, per-route engine + idempotency layer + proxy, the
//!   router, the admin listener and graceful shutdown.
//! - `test_util` (feature `test-util`): `TestGateway`, a gateway on real
//!   loopback listeners for integration tests.
//!
//! # The key decision
//! The upstream proxy is a plain inner service of the idempotency layer,
//! and it reports the *kind* of a failure rather than hiding it: a failure
//! before the upstream answered (connect error, connect or first-byte
//! timeout) is a synthetic 502/504 marked retryable, so the layer releases
//! the key; a failure mid-body (reset, idle or total timeout) is a body
//! error, so the layer stores nothing. Only a complete answer becomes
//! DONE. The timeout clocks start when the request is sent upstream, never
//! while it queues behind the route's concurrency limit, so a busy gateway
//! does not turn its own queue into upstream timeouts.
//!
//! Configuration is validated once, up front, into typed values: a bad file
//! is a startup error naming the field, never a surprise on the first request.
//! A well-formed configuration whose derived key would merge different
//! operations is refused by [`serve()`] itself, so an embedder gets the same
//! guarantee as `idemgate serve`.
//!
//! [`GatewayConfig`]: config::GatewayConfig

mod admin;
pub mod config;
mod error;
pub mod listener;
pub mod plan;
pub mod problem;
pub mod proxy;
pub mod serve;
mod stores;
pub mod telemetry;
#[cfg(feature = "test-util")]
pub mod test_util;

pub use config::{ConfigError, GatewayConfig, Overrides, RouteConfig, StoreUrl};
pub use error::GatewayError;
pub use idemgate_layer::{OutcomeUnknown, RetryableFailure};
pub use listener::ConnectionLimits;
pub use proxy::{Proxy, UpstreamBodyError};
pub use serve::{bind_and_serve, guard_panics, serve};
pub use stores::{load_key_ring, open_records};
