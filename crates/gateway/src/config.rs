//! Gateway configuration, in two phases.
//!
//! Phase one reads *raw* values ([`RawConfig`]): strings and numbers as a
//! person writes them, merged from three sources in increasing precedence:
//! a TOML file, `IDEMGATE_*` environment variables (`__` separates nesting
//! levels, e.g. `IDEMGATE_ADMIN_TOKEN`), and command-line flags
//! ([`Overrides`]). Phase two ([`GatewayConfig::from_raw`]) validates them
//! once and turns them into typed values ([`GatewayConfig`], [`RouteConfig`]);
//! every error names the field it is about (`routes[1].timeouts.idle`).
//!
//! Defaults run without a file: listen `127.0.0.1:8080`, admin listen
//! `127.0.0.1:9090`, store `sqlite:idemgate.db`. With only an `upstream`
//! set, one route `/` proxies POST requests with key mode `optional` and
//! `on_inflight = "attach"`.
//!
//! Some fields describe the deployment rather than steer the gateway:
//! `[client_retry]` (how the callers retry), a route's `longest_generation`
//! and `charges`, and `alert_rules`. `idemgate check` reads them to run the
//! pre-launch checklist ([`crate::plan`]). A design mistake that is not a
//! malformed value (a key template of the body hash alone, a `done_ttl`
//! shorter than the retry window) loads, and is reported there with its fix.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::magic::RelativePathBuf;
use http::{HeaderName, Method};
use idemgate_engine::{Jitter, RetryPolicy};
use idemgate_layer::config::default_retryable_statuses;
pub use idemgate_layer::{
    DerivePart, DeriveTemplate, InflightMode, KeyMode, StoreErrorMode, TenantSource,
};
use serde::{Deserialize, Serialize};
use url::Url;

/// Default listen address of the proxy.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default listen address of the admin endpoints.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Default store URL: an SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite:idemgate.db";
/// Default body limit: 10 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;
/// Prefix of the environment variables read.
pub const ENV_PREFIX: &str = "IDEMGATE_";

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A source could not be read or parsed (TOML syntax, wrong value type,
    /// unknown field). The message names the key and the source.
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    /// The configuration file does not exist.
    #[error("configuration file {0} not found")]
    MissingFile(PathBuf),
    /// A value was read but is not valid.
    #[error("configuration field `{field}`: {message}")]
    Invalid {
        /// Path of the offending field, e.g. `routes[0].timeouts.idle`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The field an [`ConfigError::Invalid`] is about.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Load(e) => e.path.last().map(String::as_str),
            Self::MissingFile(_) => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Phase one: raw values.

/// The configuration as written: every field optional, durations and sizes
/// as text. Unknown fields are refused, so a typo is an error, not a default.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Proxy listen address.
    pub listen: Option<String>,
    /// Admin listen address.
    pub admin_listen: Option<String>,
    /// Store URL (`sqlite:PATH`, `memory:`, `redis://…`, `redis+cluster://…`, `postgres://…`).
    pub store: Option<String>,
    /// Default upstream for routes that name none; alone, it makes the `/` route.
    pub upstream: Option<String>,
    /// Default lease length (e.g. `30s`).
    pub pending_ttl: Option<String>,
    /// Default lifetime of DONE records (e.g. `24h`).
    pub done_ttl: Option<String>,
    /// How long shutdown waits for in-flight work before cancelling it.
    pub shutdown_grace: Option<String>,
    /// Token for the admin endpoints that need one.
    pub admin_token: Option<String>,
    /// How the clients in front of the gateway retry (`[client_retry]`);
    /// routes inherit it field by field. Used by `idemgate check`.
    pub client_retry: Option<RawClientRetry>,
    /// Path of the Prometheus rules file deployed for this gateway
    /// (relative paths resolve against the configuration file). Used by
    /// `idemgate check`.
    pub alert_rules: Option<RelativePathBuf>,
    /// The routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RawRoute>,
}

/// `[client_retry]` (top level or per route) as written: the retry policy
/// of the clients calling the gateway. The gateway does not retry; this
/// describes the callers so `idemgate check` can size `done_ttl` (seed §2:
/// attempts × (timeout + backoff) + compensation delay, doubled).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawClientRetry {
    /// Total attempts, the first one included (default 3).
    pub attempts: Option<u32>,
    /// The client's timeout for one attempt (default `600s`).
    pub attempt_timeout: Option<String>,
    /// Backoff before the first retry, doubling after (default `500ms`).
    pub backoff_base: Option<String>,
    /// Longest backoff sleep (default `8s`).
    pub backoff_cap: Option<String>,
    /// `none`, `full` (default) or `equal`.
    pub jitter: Option<String>,
    /// Delay of an asynchronous job that may replay the operation after the
    /// client gave up (default `0s`).
    pub compensation_delay: Option<String>,
}

/// One `[[routes]]` entry as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// Route id: the namespace of its keys (default: the prefix).
    pub id: Option<String>,
    /// Path prefix, segment-wise (`/v1` matches `/v1` and `/v1/…`).
    pub prefix: Option<String>,
    /// Upstream base URL.
    pub upstream: Option<String>,
    /// Remove the prefix from the path sent upstream (default false).
    pub strip_prefix: Option<bool>,
    /// Protected methods (default `["POST"]`).
    pub methods: Option<Vec<String>>,
    /// `require`, `optional` or `derive`.
    pub key: Option<String>,
    /// For `key = "derive"`: the parts of the key, e.g.
    /// `["tenant", "header:x-user-id", "header:x-session-id", "body"]`.
    pub key_template: Option<Vec<String>>,
    /// For `key = "derive"`: the time window (e.g. `10m`).
    pub key_window: Option<String>,
    /// `reject`, `wait` or `attach`.
    pub on_inflight: Option<String>,
    /// How long `wait`/`attach` hold a duplicate.
    pub inflight_wait: Option<String>,
    /// Lease length for this route.
    pub pending_ttl: Option<String>,
    /// DONE lifetime for this route.
    pub done_ttl: Option<String>,
    /// Upstream timeouts.
    pub timeouts: Option<RawTimeouts>,
    /// Request body limit: bytes, or text like `10MiB`.
    pub body_limit: Option<RawSize>,
    /// Statuses that release the key instead of storing DONE.
    pub retryable_statuses: Option<Vec<u16>>,
    /// Header the client's key is forwarded under (default `Idempotency-Key`).
    pub upstream_key_header: Option<String>,
    /// Header naming the tenant (default: the `Authorization` credential).
    pub tenant_header: Option<String>,
    /// JSON pointers left out of the fingerprint.
    pub fingerprint_ignore: Option<Vec<String>>,
    /// Most concurrent upstream requests of this route.
    pub concurrency_limit: Option<usize>,
    /// `fail_closed` (default) or `fail_open`.
    pub on_store_error: Option<String>,
    /// Renew the lease while the upstream call runs (default true, every
    /// `pending_ttl / 3`). With `false`, `pending_ttl` must outlast the
    /// longest call.
    pub heartbeat: Option<bool>,
    /// The longest generation expected on this route (e.g. `90s`), checked
    /// against `timeouts.total` and the client's timeout.
    pub longest_generation: Option<String>,
    /// The route charges, bills or has other side effects that must never
    /// repeat (default false): it then needs a durable store and
    /// `fail_closed`.
    pub charges: Option<bool>,
    /// This route's clients retry differently: fields set here override the
    /// top-level `[client_retry]`.
    pub client_retry: Option<RawClientRetry>,
}

/// `[routes.timeouts]` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    /// TCP (+TLS) connect.
    pub connect: Option<String>,
    /// From sending the request to the response headers.
    pub first_byte: Option<String>,
    /// Longest gap between two body chunks.
    pub idle: Option<String>,
    /// From sending the request to the end of the body.
    pub total: Option<String>,
}

/// A size: a number of bytes, or text such as `512KiB`, `10MiB`, `1MB`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum RawSize {
    /// Bytes.
    Bytes(u64),
    /// Text with a unit.
    Text(String),
}

/// Values given on the command line; each set one overrides the file and
/// the environment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Overrides {
    /// `--upstream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--admin-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<String>,
    /// `--store`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// `--pending-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_ttl: Option<String>,
    /// `--done-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_ttl: Option<String>,
}

/// The merged sources: `file` (if any), then `IDEMGATE_*` variables, then
/// `overrides`. Later sources win.
///
/// # Errors
/// [`ConfigError::MissingFile`] when `file` does not exist.
pub fn figment(file: Option<&Path>, overrides: &Overrides) -> Result<Figment, ConfigError> {
    let mut f = Figment::new();
    if let Some(path) = file {
        if !path.is_file() {
            return Err(ConfigError::MissingFile(path.to_owned()));
        }
        f = f.merge(Toml::file_exact(path));
    }
    Ok(f.merge(
        Env::prefixed(ENV_PREFIX)
            .split("__")
            .ignore(&["config", "log"]),
    )
    .merge(Serialized::defaults(overrides)))
}

// ---------------------------------------------------------------------------
// Phase two: typed values.

/// Where records are kept.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// In this process only (`memory:`).
    Memory,
    /// An SQLite file (`sqlite:PATH`).
    Sqlite(PathBuf),
    /// A Redis node (`redis://…` or `rediss://…`).
    Redis(Url),
    /// A Redis Cluster (`redis+cluster://…`).
    RedisCluster(Url),
    /// PostgreSQL (`postgres://…`).
    Postgres(Url),
}

impl StoreUrl {
    /// Parses a store URL.
    ///
    /// # Errors
    /// An unknown scheme or a malformed URL, as a message.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "memory:" || s == "memory" || s == "memory://" {
            return Ok(Self::Memory);
        }
        if let Some(path) = s
            .strip_prefix("sqlite://")
            .or_else(|| s.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err("`sqlite:` needs a file path, e.g. `sqlite:idemgate.db`".into());
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        let url = Url::parse(s).map_err(|e| {
            format!(
                "`{}` is not a store URL ({e}); use sqlite:PATH, memory:, redis://…, redis+cluster://… or postgres://…",
                redact_text(s)
            )
        })?;
        match url.scheme() {
            "redis" | "rediss" => Ok(Self::Redis(url)),
            "redis+cluster" | "rediss+cluster" => Ok(Self::RedisCluster(url)),
            "postgres" | "postgresql" => Ok(Self::Postgres(url)),
            other => Err(format!(
                "unknown store scheme `{other}`; use sqlite:PATH, memory:, redis://…, redis+cluster://… or postgres://…"
            )),
        }
    }

    /// The backend name (`memory`, `sqlite`, `redis`, `redis-cluster`, `postgres`).
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Redis(_) => "redis",
            Self::RedisCluster(_) => "redis-cluster",
            Self::Postgres(_) => "postgres",
        }
    }
}

/// Replaces a password in URL-like text, for messages.
fn redact_text(s: &str) -> String {
    match Url::parse(s) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => s.to_owned(),
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory:"),
            Self::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            Self::Redis(u) | Self::RedisCluster(u) | Self::Postgres(u) => {
                f.write_str(&redact_text(u.as_str()))
            }
        }
    }
}

/// Passwords never reach logs.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// A secret that `Debug` does not print.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself; compare it in constant time.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The layered upstream timeouts of a route. Clocks start when the request
/// is sent upstream, not while it waits for a concurrency slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP (+TLS) connect.
    pub connect: Duration,
    /// From sending the request to the response headers.
    pub first_byte: Duration,
    /// Longest gap between two body chunks.
    pub idle: Duration,
    /// From sending the request to the end of the body.
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            total: Duration::from_secs(600),
        }
    }
}

/// One validated route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// Route id: the namespace of its keys.
    pub id: String,
    /// Path prefix (starts with `/`, no trailing `/` except for `/` itself).
    pub prefix: String,
    /// Upstream base URL.
    pub upstream: Url,
    /// Remove the prefix from the path sent upstream.
    pub strip_prefix: bool,
    /// Protected methods.
    pub methods: Vec<Method>,
    /// How the key is found.
    pub key_mode: KeyMode,
    /// What a duplicate of a PENDING key gets.
    pub on_inflight: InflightMode,
    /// Lease length.
    pub pending_ttl: Duration,
    /// DONE lifetime.
    pub done_ttl: Duration,
    /// Upstream timeouts.
    pub timeouts: Timeouts,
    /// Request body limit in bytes.
    pub body_limit: usize,
    /// Statuses that release the key instead of storing DONE.
    pub retryable_statuses: Vec<u16>,
    /// Header the key is forwarded upstream under.
    pub upstream_key_header: HeaderName,
    /// Header naming the tenant; `None`: the `Authorization` credential.
    pub tenant_header: Option<HeaderName>,
    /// JSON pointers left out of the fingerprint.
    pub fingerprint_ignore: Vec<String>,
    /// Most concurrent upstream requests; `None`: unlimited.
    pub concurrency_limit: Option<usize>,
    /// What to do when the store cannot be reached.
    pub on_store_error: StoreErrorMode,
    /// Lease renewal interval while the upstream call runs (`pending_ttl /
    /// 3`); `None`: no renewal, the lease must outlast the call.
    pub heartbeat: Option<Duration>,
    /// The longest generation expected on this route, if declared.
    pub longest_generation: Option<Duration>,
    /// Whether the route charges or has side effects that must never repeat.
    pub charges: bool,
    /// The retry policy of this route's clients.
    pub client_retry: RetryPolicy,
}

impl RouteConfig {
    /// Whether `path` falls under this route's prefix (segment-wise).
    pub fn matches(&self, path: &str) -> bool {
        prefix_matches(&self.prefix, path)
    }

    /// Where the layer finds the tenant of a request on this route.
    pub fn tenant(&self) -> TenantSource {
        match &self.tenant_header {
            Some(h) => TenantSource::Header(h.clone()),
            None => TenantSource::Authorization,
        }
    }
}

pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

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
    /// The retry policy of the clients, as routes inherit it (default: the
    /// official OpenAI and Anthropic clients' policy).
    pub client_retry: RetryPolicy,
    /// The deployed Prometheus rules file, resolved against the
    /// configuration file's directory.
    pub alert_rules: Option<PathBuf>,
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
            Some(t) => Some(Secret(t)),
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
                key: Some("optional".into()),
                on_inflight: Some("attach".into()),
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
            client_retry,
            alert_rules,
            routes,
        })
    }

    /// The route serving `path`: the longest matching prefix.
    pub fn route_for(&self, path: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.matches(path))
    }
}

struct RouteDefaults {
    upstream: Option<Url>,
    pending_ttl: Duration,
    done_ttl: Duration,
    client_retry: RetryPolicy,
}

fn route(at: &str, r: RawRoute, d: &RouteDefaults) -> Result<RouteConfig, ConfigError> {
    let field = |name: &str| format!("{at}.{name}");
    let prefix = r
        .prefix
        .ok_or_else(|| ConfigError::invalid(field("prefix"), "missing"))?;
    if !prefix.starts_with('/') {
        return Err(ConfigError::invalid(field("prefix"), "must start with `/`"));
    }
    let prefix = if prefix.len() > 1 {
        prefix.trim_end_matches('/').to_owned()
    } else {
        prefix
    };
    let prefix = if prefix.is_empty() {
        "/".into()
    } else {
        prefix
    };
    let id = r.id.unwrap_or_else(|| prefix.clone());
    if id.is_empty() {
        return Err(ConfigError::invalid(field("id"), "must not be empty"));
    }
    let upstream = match r.upstream {
        Some(u) => upstream_url(&field("upstream"), &u)?,
        None => d.upstream.clone().ok_or_else(|| {
            ConfigError::invalid(field("upstream"), "missing (and no top-level `upstream`)")
        })?,
    };
    let methods = match r.methods {
        None => vec![Method::POST],
        Some(ms) if ms.is_empty() => {
            return Err(ConfigError::invalid(field("methods"), "must not be empty"));
        }
        Some(ms) => ms
            .iter()
            .map(|m| {
                Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes()).map_err(|_| {
                    ConfigError::invalid(field("methods"), format!("bad method `{m}`"))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let timeouts = timeouts(at, r.timeouts.unwrap_or_default())?;
    let key = r.key.as_deref().unwrap_or("optional");
    if key != "derive" && (r.key_template.is_some() || r.key_window.is_some()) {
        return Err(ConfigError::invalid(
            field("key_template"),
            "only allowed with `key = \"derive\"`",
        ));
    }
    let key_mode = match key {
        "require" => KeyMode::Require,
        "optional" => KeyMode::Optional,
        "derive" => KeyMode::Derive(template(at, r.key_template, r.key_window.as_deref())?),
        other => {
            return Err(ConfigError::invalid(
                field("key"),
                format!("`{other}`: expected `require`, `optional` or `derive`"),
            ));
        }
    };
    // A duplicate waits at most as long as a generation may take.
    let inflight_wait = duration(
        &field("inflight_wait"),
        r.inflight_wait.as_deref(),
        timeouts.total,
    )?;
    let on_inflight = match r.on_inflight.as_deref().unwrap_or("reject") {
        "reject" => InflightMode::Reject,
        "wait" => InflightMode::Wait(inflight_wait),
        "attach" => InflightMode::Attach(inflight_wait),
        other => {
            return Err(ConfigError::invalid(
                field("on_inflight"),
                format!("`{other}`: expected `reject`, `wait` or `attach`"),
            ));
        }
    };
    let pending_ttl = duration(
        &field("pending_ttl"),
        r.pending_ttl.as_deref(),
        d.pending_ttl,
    )?;
    let done_ttl = duration(&field("done_ttl"), r.done_ttl.as_deref(), d.done_ttl)?;
    let body_limit = match r.body_limit {
        None => DEFAULT_BODY_LIMIT,
        Some(s) => size(&field("body_limit"), &s)?,
    };
    let retryable_statuses = match r.retryable_statuses {
        None => default_retryable_statuses(),
        Some(v) => {
            if let Some(bad) = v.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(ConfigError::invalid(
                    field("retryable_statuses"),
                    format!("{bad} is not an HTTP status"),
                ));
            }
            v
        }
    };
    let upstream_key_header = header(
        &field("upstream_key_header"),
        r.upstream_key_header
            .as_deref()
            .unwrap_or("idempotency-key"),
    )?;
    let tenant_header = r
        .tenant_header
        .as_deref()
        .map(|h| header(&field("tenant_header"), h))
        .transpose()?;
    let fingerprint_ignore = r.fingerprint_ignore.unwrap_or_default();
    if let Some(bad) = fingerprint_ignore
        .iter()
        .find(|p| !p.is_empty() && !p.starts_with('/'))
    {
        return Err(ConfigError::invalid(
            field("fingerprint_ignore"),
            format!("`{bad}` is not a JSON pointer (must start with `/`)"),
        ));
    }
    let concurrency_limit = match r.concurrency_limit {
        Some(0) => {
            return Err(ConfigError::invalid(
                field("concurrency_limit"),
                "must be at least 1",
            ));
        }
        other => other,
    };
    let on_store_error = match r.on_store_error.as_deref() {
        None => StoreErrorMode::FailClosed,
        Some(s) => keyword(&field("on_store_error"), s)?,
    };
    let heartbeat = match r.heartbeat {
        Some(false) => None,
        Some(true) | None => Some(pending_ttl / 3),
    };
    let longest_generation = r
        .longest_generation
        .as_deref()
        .map(|g| duration(&field("longest_generation"), Some(g), Duration::ZERO))
        .transpose()?;
    let client_retry = match &r.client_retry {
        Some(raw) => client_retry(&field("client_retry"), raw, d.client_retry)?,
        None => d.client_retry,
    };
    Ok(RouteConfig {
        id,
        prefix,
        upstream,
        strip_prefix: r.strip_prefix.unwrap_or(false),
        methods,
        key_mode,
        on_inflight,
        pending_ttl,
        done_ttl,
        timeouts,
        body_limit,
        retryable_statuses,
        upstream_key_header,
        tenant_header,
        fingerprint_ignore,
        concurrency_limit,
        on_store_error,
        heartbeat,
        longest_generation,
        charges: r.charges.unwrap_or(false),
        client_retry,
    })
}

/// A retry policy: the fields of `raw` over `base`.
fn client_retry(
    at: &str,
    raw: &RawClientRetry,
    base: RetryPolicy,
) -> Result<RetryPolicy, ConfigError> {
    let f = |n: &str| format!("{at}.{n}");
    let attempts = raw.attempts.unwrap_or(base.attempts);
    if attempts == 0 {
        return Err(ConfigError::invalid(
            f("attempts"),
            "must be at least 1 (the first attempt counts)",
        ));
    }
    let policy = RetryPolicy {
        attempts,
        attempt_timeout: duration(
            &f("attempt_timeout"),
            raw.attempt_timeout.as_deref(),
            base.attempt_timeout,
        )?,
        backoff_base: duration_or_zero(
            &f("backoff_base"),
            raw.backoff_base.as_deref(),
            base.backoff_base,
        )?,
        backoff_cap: duration_or_zero(
            &f("backoff_cap"),
            raw.backoff_cap.as_deref(),
            base.backoff_cap,
        )?,
        jitter: match raw.jitter.as_deref().map(str::trim) {
            None => base.jitter,
            Some("none") => Jitter::None,
            Some("full") => Jitter::Full,
            Some("equal") => Jitter::Equal,
            Some(other) => {
                return Err(ConfigError::invalid(
                    f("jitter"),
                    format!("`{other}`: expected `none`, `full` or `equal`"),
                ));
            }
        },
        compensation_delay: duration_or_zero(
            &f("compensation_delay"),
            raw.compensation_delay.as_deref(),
            base.compensation_delay,
        )?,
    };
    if policy.backoff_cap < policy.backoff_base {
        return Err(ConfigError::invalid(
            f("backoff_cap"),
            "must not be shorter than backoff_base",
        ));
    }
    Ok(policy)
}

fn timeouts(at: &str, t: RawTimeouts) -> Result<Timeouts, ConfigError> {
    let d = Timeouts::default();
    let f = |n: &str| format!("{at}.timeouts.{n}");
    let out = Timeouts {
        connect: duration(&f("connect"), t.connect.as_deref(), d.connect)?,
        first_byte: duration(&f("first_byte"), t.first_byte.as_deref(), d.first_byte)?,
        idle: duration(&f("idle"), t.idle.as_deref(), d.idle)?,
        total: duration(&f("total"), t.total.as_deref(), d.total)?,
    };
    if out.total < out.first_byte {
        return Err(ConfigError::invalid(
            f("total"),
            "must not be shorter than first_byte",
        ));
    }
    Ok(out)
}

fn template(
    at: &str,
    parts: Option<Vec<String>>,
    window: Option<&str>,
) -> Result<DeriveTemplate, ConfigError> {
    let field = format!("{at}.key_template");
    let parts = parts.ok_or_else(|| {
        ConfigError::invalid(&field, "missing: `key = \"derive\"` needs a template")
    })?;
    let parts: Vec<DerivePart> = parts
        .iter()
        .map(|p| {
            p.parse()
                .map_err(|e| ConfigError::invalid(&field, format!("{e}")))
        })
        .collect::<Result<_, _>>()?;
    if parts.is_empty() {
        return Err(ConfigError::invalid(&field, "must not be empty"));
    }
    // A template of the body hash alone loads: it is a design mistake, not
    // a malformed value, and `idemgate check` reports it with the fix
    // (`idemgate serve` refuses to start with it).
    let window = window
        .map(|w| duration(&format!("{at}.key_window"), Some(w), Duration::ZERO))
        .transpose()?;
    Ok(DeriveTemplate { parts, window })
}

fn addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.trim().parse().map_err(|e| {
        ConfigError::invalid(
            field,
            format!("`{s}` is not an address like 127.0.0.1:8080 ({e})"),
        )
    })
}

fn upstream_url(field: &str, s: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(s.trim())
        .map_err(|e| ConfigError::invalid(field, format!("`{s}` is not a URL ({e})")))?;
    match url.scheme() {
        "http" => {}
        "https" if cfg!(feature = "tls") => {}
        "https" => {
            return Err(ConfigError::invalid(
                field,
                "https upstreams need the gateway built with the `tls` feature",
            ));
        }
        other => {
            return Err(ConfigError::invalid(
                field,
                format!("scheme `{other}`: expected http or https"),
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(field, "has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::invalid(
            field,
            "must not have a query or fragment",
        ));
    }
    Ok(url)
}

fn header(field: &str, s: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(s.as_bytes())
        .map_err(|_| ConfigError::invalid(field, format!("`{s}` is not a header name")))
}

/// A value spelled as one of a layer mode's serde names (`fail_open`).
fn keyword<T: serde::de::DeserializeOwned>(field: &str, s: &str) -> Result<T, ConfigError> {
    use serde::de::IntoDeserializer;
    let d: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
        s.trim().into_deserializer();
    T::deserialize(d).map_err(|e| ConfigError::invalid(field, e.to_string()))
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A positive duration (`500ms`, `30s`, `24h`, `1h 30m`).
fn duration(field: &str, s: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    let d = duration_or_zero(field, s, default)?;
    if d.is_zero() && s.is_some() {
        return Err(ConfigError::invalid(field, "must be greater than zero"));
    }
    Ok(d)
}

fn duration_or_zero(
    field: &str,
    s: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match s {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s.trim()).map_err(|e| {
            ConfigError::invalid(
                field,
                format!("`{s}` is not a duration like 500ms, 30s or 24h ({e})"),
            )
        }),
    }
}

fn size(field: &str, s: &RawSize) -> Result<usize, ConfigError> {
    let bytes = match s {
        RawSize::Bytes(n) => *n,
        RawSize::Text(t) => parse_size(t).ok_or_else(|| {
            ConfigError::invalid(
                field,
                format!("`{t}` is not a size like 65536, 512KiB or 10MiB"),
            )
        })?,
    };
    if bytes == 0 {
        return Err(ConfigError::invalid(field, "must be greater than zero"));
    }
    usize::try_from(bytes).map_err(|_| ConfigError::invalid(field, "too large"))
}

fn parse_size(t: &str) -> Option<u64> {
    let t = t.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1000,
        "kib" => 1 << 10,
        "mb" | "m" => 1_000_000,
        "mib" => 1 << 20,
        "gb" | "g" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("10 MiB"), Some(10 << 20));
        assert_eq!(parse_size("1MB"), Some(1_000_000));
        assert_eq!(parse_size("1XB"), None);
        assert_eq!(parse_size("MiB"), None);
    }

    #[test]
    fn prefixes_match_by_segment() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/v1", "/v1"));
        assert!(prefix_matches("/v1", "/v1/chat"));
        assert!(!prefix_matches("/v1", "/v10/chat"));
        assert!(!prefix_matches("/v1", "/"));
    }

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("memory:"), Ok(StoreUrl::Memory));
        assert_eq!(
            StoreUrl::parse("sqlite:/tmp/x.db"),
            Ok(StoreUrl::Sqlite("/tmp/x.db".into()))
        );
        assert!(matches!(
            StoreUrl::parse("redis+cluster://h:7000"),
            Ok(StoreUrl::RedisCluster(_))
        ));
        assert!(matches!(
            StoreUrl::parse("postgres://u:p@h/db"),
            Ok(StoreUrl::Postgres(_))
        ));
        assert!(StoreUrl::parse("mysql://h").is_err());
        assert!(StoreUrl::parse("sqlite:").is_err());
        let shown = format!("{:?}", StoreUrl::parse("postgres://u:hunter2@h/db"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
