//! A tower [`Layer`](tower::Layer) that makes any axum service's handlers
//! idempotent: each operation runs at most once per idempotency key, and a
//! retry gets the stored response (JSON or a whole SSE stream) instead of
//! running the handler again.
//!
//! # Layout
//! - [`config`]: [`LayerConfig`] and its modes (key, in-flight, tenant,
//!   store errors), with safe defaults.
//! - [`key`]: tenant (a hash of the credential) and key extraction or
//!   derivation.
//! - [`problem`]: RFC 9457 problem responses, one constructor per case.
//! - [`stored`]: the versioned binary form of a stored response and token
//!   usage extraction.
//! - [`sse`]: event boundary scanner, id rewriting, `Last-Event-ID`.

pub mod config;
pub mod key;
pub mod problem;
pub mod sse;
pub mod stored;

pub use config::{
    DerivePart, DeriveTemplate, InflightMode, KeyMode, LayerConfig, StoreErrorMode, TenantSource,
};
pub use problem::Problem;
pub use stored::{StoredBody, StoredResponse, StreamUsage, Usage};
