//! The whole gateway, typed and validated: [`GatewayConfig`].
//!
//! Phase two of loading: the merged raw values ([`RawConfig`]) are checked
//! once, here, and become typed values; the first malformed one is an
//! error naming its field. Defaults run without a file (listen
//! `127.0.0.1:8080`, admin `127.0.0.1:9464`, store `sqlite:idemgate.db`);
//! with only an `upstream`, one route `/` proxies POST requests with key
//! mode `optional` and `on_inflight = "attach"`.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use idemgate_check::RetryPolicy;

use super::client_retry::client_retry;
use super::error::ConfigError;
use super::parse::{StoreUrl, addr, duration, duration_or_zero, size, size_or_zero, upstream_url};
use super::raw::{
    Overrides, RawConfig, RawConnections, RawInflightMode, RawKeyMode, RawRoute, figment,
};
use super::route::{RouteConfig, RouteDefaults, route};
use super::secret::Secret;
use crate::listener::ConnectionLimits;

/// Default listen address of the proxy.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default listen address of the admin endpoints.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// Default store URL: an SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite:idemgate.db";

/// The validated gateway configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Proxy listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin_listen: SocketAddr,
    /// Where records are kept.
    pub store: StoreUrl,
    /// Default lease length.
    pub pending_ttl: Duration,
    /// Default DONE lifetime.
    pub done_ttl: Duration,
    /// How long shutdown waits for in-flight work before cancelling it.
    pub shutdown_grace: Duration,
    /// Token for the admin endpoints that need one.
    pub admin_token: Option<Secret>,
    /// Host names the admin listener answers besides IP addresses and
    /// `localhost` (lower case, without port).
    pub admin_hosts: Vec<String>,
    /// The retry policy of the clients, as routes inherit it (default: the
    /// official OpenAI and Anthropic clients' policy).
    pub client_retry: RetryPolicy,
    /// The deployed Prometheus rules file, resolved against the
    /// configuration file's directory.
    pub alert_rules: Option<PathBuf>,
    /// The key file that seals stored responses, resolved against the
    /// configuration file's directory. `None`: stored as received.
    pub encryption_key_file: Option<PathBuf>,
    /// Bytes of DONE records kept in memory to answer replays without a
    /// store round trip (`idemgate_engine::CachedStore`); 0: off.
    pub replay_cache: usize,
    /// Worker threads of the async runtime; `None`: tokio's default (one
    /// per core, or `TOKIO_WORKER_THREADS`).
    pub workers: Option<NonZeroUsize>,
    /// What one client connection may hold.
    pub connections: ConnectionLimits,
    /// Routes, longest prefix first.
    pub routes: Vec<RouteConfig>,
}

impl GatewayConfig {
    /// Reads `file` (if any), the environment and `overrides`, and validates.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the offending field.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        Self::from_figment(&figment(file, overrides)?)
    }

    /// Validates what `figment` holds.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the offending field.
    pub fn from_figment(figment: &Figment) -> Result<Self, ConfigError> {
        let raw: RawConfig = figment.extract().map_err(Box::new)?;
        Self::from_raw(raw)
    }

    /// A configuration with every default and one route `/` to `upstream`.
    ///
    /// # Errors
    /// A malformed upstream URL.
    pub fn for_upstream(upstream: &str) -> Result<Self, ConfigError> {
        Self::from_raw(RawConfig {
            upstream: Some(upstream.to_owned()),
            ..RawConfig::default()
        })
    }

    /// Phase two: validates raw values into typed ones.
    ///
    /// # Errors
    /// A [`ConfigError::Invalid`] naming the first offending field.
    pub fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let listen = addr("listen", raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN))?;
        let admin_listen = addr(
            "admin_listen",
            raw.admin_listen.as_deref().unwrap_or(DEFAULT_ADMIN_LISTEN),
        )?;
        let store = StoreUrl::parse(raw.store.as_deref().unwrap_or(DEFAULT_STORE))
            .map_err(|m| ConfigError::invalid("store", m))?;
        let pending_ttl = duration("pending_ttl", raw.pending_ttl.as_deref(), secs(30))?;
        let done_ttl = duration("done_ttl", raw.done_ttl.as_deref(), secs(24 * 3600))?;
        let shutdown_grace =
            duration_or_zero("shutdown_grace", raw.shutdown_grace.as_deref(), secs(30))?;
        let admin_token = match raw.admin_token {
            Some(t) if t.is_empty() => {
                return Err(ConfigError::invalid("admin_token", "must not be empty"));
            }
            Some(t) => Some(Secret::new(t)),
            None => None,
        };
        let default_upstream = raw
            .upstream
            .as_deref()
            .map(|u| upstream_url("upstream", u))
            .transpose()?;
        let client_retry_raw = raw.client_retry.unwrap_or_default();
        let client_retry = client_retry("client_retry", &client_retry_raw, RetryPolicy::default())?;
        let alert_rules = match raw.alert_rules {
            Some(p) if p.original().as_os_str().is_empty() => {
                return Err(ConfigError::invalid("alert_rules", "must not be empty"));
            }
            Some(p) => Some(p.relative()),
            None => None,
        };
        let replay_cache = raw
            .replay_cache
            .as_ref()
            .map(|s| size_or_zero("replay_cache", s))
            .transpose()?
            .unwrap_or(idemgate_engine::CachedStore::DEFAULT_BYTES);
        let workers = raw.workers.map(workers).transpose()?;
        let connections = connections(&raw.connections.unwrap_or_default())?;
        let encryption_key_file = match raw.encryption_key_file {
            Some(p) if p.original().as_os_str().is_empty() => {
                return Err(ConfigError::invalid(
                    "encryption_key_file",
                    "must not be empty",
                ));
            }
            Some(p) => Some(p.relative()),
            None => None,
        };

        let mut raw_routes = raw.routes;
        if raw_routes.is_empty() {
            if default_upstream.is_none() {
                return Err(ConfigError::invalid(
                    "routes",
                    "no routes: set `upstream` (or --upstream URL) or add [[routes]]",
                ));
            }
            raw_routes.push(RawRoute {
                prefix: Some("/".into()),
                key: Some(RawKeyMode::Optional),
                on_inflight: Some(RawInflightMode::Attach),
                ..RawRoute::default()
            });
        }
        let defaults = RouteDefaults {
            upstream: default_upstream,
            pending_ttl,
            done_ttl,
            client_retry,
        };
        let mut routes = Vec::with_capacity(raw_routes.len());
        for (i, r) in raw_routes.into_iter().enumerate() {
            let route = route(&format!("routes[{i}]"), r, &defaults)?;
            if let Some(other) = routes
                .iter()
                .find(|o: &&RouteConfig| o.prefix == route.prefix || o.id == route.id)
            {
                let what = if other.prefix == route.prefix {
                    format!("prefix `{}` is used by two routes", route.prefix)
                } else {
                    format!("id `{}` is used by two routes", route.id)
                };
                return Err(ConfigError::invalid(format!("routes[{i}]"), what));
            }
            routes.push(route);
        }
        // Longest prefix first: the first match is the most specific one.
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Ok(Self {
            listen,
            admin_listen,
            store,
            pending_ttl,
            done_ttl,
            shutdown_grace,
            admin_token,
            admin_hosts: raw
                .admin_hosts
                .unwrap_or_default()
                .into_iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            client_retry,
            alert_rules,
            encryption_key_file,
            replay_cache,
            workers,
            connections,
            routes,
        })
    }

    /// The route serving `path`: the longest matching prefix.
    pub fn route_for(&self, path: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.matches(path))
    }
}

/// Past this, a thread count is a typo: each worker is a thread with its
/// own stack and run queue.
const MAX_WORKERS: u64 = 1024;

fn workers(n: u64) -> Result<NonZeroUsize, ConfigError> {
    if n > MAX_WORKERS {
        return Err(ConfigError::invalid(
            "workers",
            format!("{n} threads: at most {MAX_WORKERS}"),
        ));
    }
    usize::try_from(n)
        .ok()
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| ConfigError::invalid("workers", "must be at least 1"))
}

/// `[connections]`: every field optional, each checked on its own.
fn connections(raw: &RawConnections) -> Result<ConnectionLimits, ConfigError> {
    let d = ConnectionLimits::default();
    let count = |field: &str, v: Option<u64>, default: usize| match v {
        None => Ok(default),
        Some(0) => Err(ConfigError::invalid(field, "must be at least 1")),
        Some(n) => {
            usize::try_from(n).map_err(|_| ConfigError::invalid(field, format!("{n} is too large")))
        }
    };
    let max_header_bytes = match &raw.max_header_bytes {
        Some(s) => size("connections.max_header_bytes", s)?,
        None => d.max_header_bytes,
    };
    Ok(ConnectionLimits {
        max_connections: count("connections.max", raw.max, d.max_connections)?,
        header_read_timeout: duration(
            "connections.header_read_timeout",
            raw.header_read_timeout.as_deref(),
            d.header_read_timeout,
        )?,
        body: idemgate_layer::BodyTimeouts {
            idle: duration(
                "connections.body_idle_timeout",
                raw.body_idle_timeout.as_deref(),
                d.body.idle,
            )?,
            total: duration(
                "connections.body_read_timeout",
                raw.body_read_timeout.as_deref(),
                d.body.total,
            )?,
        },
        send_timeout: duration(
            "connections.send_timeout",
            raw.send_timeout.as_deref(),
            d.send_timeout,
        )?,
        max_header_bytes,
        max_headers: count("connections.max_headers", raw.max_headers, d.max_headers)?,
    })
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
