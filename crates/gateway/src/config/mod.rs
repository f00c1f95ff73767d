//! Gateway configuration, in two phases.
//!
//! Phase one reads *raw* values ([`RawConfig`]): strings and numbers as a
//! person writes them, merged from three sources in increasing precedence:
//! a TOML file, `IDEMGATE_*` environment variables (`__` separates nesting
//! levels, e.g. `IDEMGATE_CLIENT_RETRY__ATTEMPTS`), and command-line flags
//! ([`Overrides`]). Phase two ([`GatewayConfig::from_raw`]) validates them
//! once and turns them into typed values ([`GatewayConfig`], [`RouteConfig`]);
//! every error names the field it is about (`routes[1].timeouts.idle`).
//! Two phases, so each source stays a plain serde value and every value is
//! judged by one piece of code whichever source it came from.
//!
//! Some fields describe the deployment rather than steer the gateway:
//! `[client_retry]` (how the callers retry), a route's `longest_generation`
//! and `charges`, and `alert_rules`. `idemgate check` reads them to run the
//! pre-launch checklist ([`crate::plan`]). A design mistake that is not a
//! malformed value (a key template of the body hash alone, a `done_ttl`
//! shorter than the retry window) loads, and is reported there with its fix.
//!
//! # Layout
//! - `raw`: phase one, the serde/figment values and their sources.
//! - `gateway` and `route`: phase two, the typed values and their
//!   validation; `client_retry` for the callers' retry policy.
//! - `parse`: the small parsers (duration, size, header, address, upstream
//!   and store URL), with their unit tests.
//! - `secret`: values hidden from `Debug` and messages.
//! - `error`: [`ConfigError`].
//!
//! The route modes are the idempotency layer's own types, re-exported here.

mod client_retry;
mod error;
mod gateway;
mod parse;
mod raw;
mod route;
mod secret;

pub use error::ConfigError;
pub use gateway::{DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, DEFAULT_STORE, GatewayConfig};
pub use idemgate_layer::{
    DerivePart, DeriveTemplate, KeyMode, OnInflight, StoreErrorMode, StreamDialect, TenantSource,
};
pub use parse::StoreUrl;
pub use raw::{
    ENV_PREFIX, Overrides, RawClientRetry, RawConfig, RawConnections, RawInflightMode, RawKeyMode,
    RawRoute, RawSize, RawTimeouts, figment,
};
pub(crate) use route::prefix_matches;
pub use route::{DEFAULT_BODY_LIMIT, RouteConfig, Timeouts};
pub use secret::Secret;
