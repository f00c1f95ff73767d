//! The idemgate HTTP gateway: a reverse proxy in front of LLM APIs (or any
//! HTTP service) that runs each keyed request at most once.
//!
//! # Layout
//! - [`config`]: configuration in two phases (raw TOML/env/flags, then typed
//!   and validated [`GatewayConfig`]).
//! - [`proxy`]: the upstream proxy service with layered timeouts.
//! - [`problem`]: the gateway's own RFC 9457 problem responses.
//! - [`serve`](mod@serve): [`serve()`]: store, per-route engine + idempotency
//!   layer + proxy, the router, the admin listener and graceful shutdown.
//!
//! # The key decision
//! Configuration is validated once, up front, into typed values: a bad file
//! is a startup error naming the field, never a surprise on the first request.
//!
//! [`GatewayConfig`]: config::GatewayConfig

pub mod config;
pub mod problem;
pub mod proxy;
pub mod serve;

pub use config::{ConfigError, GatewayConfig, Overrides, RouteConfig, StoreUrl};
pub use idemgate_layer::RetryableFailure;
pub use proxy::{Proxy, UpstreamBodyError};
pub use serve::{GatewayError, serve};
