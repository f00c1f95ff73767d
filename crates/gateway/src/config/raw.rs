//! Phase one: the configuration as a person writes it.
//!
//! Every field is optional, durations and sizes are text, and unknown
//! fields are refused (a typo is an error, not a default). A mode is its
//! serde enum (the layer's [`StoreErrorMode`] and [`StreamDialect`], the
//! checklist's [`Jitter`], and the names of a key mode and an in-flight
//! mode whose data sit in sibling fields), so a name that is not one of
//! them is refused while reading, with the field and the accepted names
//! (`routes[0].on_inflight`: `` `queue`: expected `reject`, `wait` or
//! `attach` ``), whichever source it came from. Three sources
//! are merged, later ones winning: a TOML file, `IDEMGATE_*` environment
//! variables (`__` separates nesting levels, e.g.
//! `IDEMGATE_CLIENT_RETRY__ATTEMPTS`), and command-line flags
//! ([`Overrides`]). Nothing here judges a value; [`super::gateway`] does,
//! once, so a value is checked the same way whichever source it came from.

use std::fmt;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::magic::RelativePathBuf;
use idemgate_check::Jitter;
use idemgate_layer::{StoreErrorMode, StreamDialect};
use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::secret::redact_text;

/// Prefix of the environment variables read.
pub const ENV_PREFIX: &str = "IDEMGATE_";

/// The configuration as written: every field optional, durations and sizes
/// as text. Unknown fields are refused, so a typo is an error, not a default.
/// `Debug` hides the admin token and the store URL's password.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq)]
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
    /// Host names the admin listener answers besides IP addresses and
    /// `localhost` (e.g. the name Prometheus scrapes it by).
    pub admin_hosts: Option<Vec<String>>,
    /// How the clients in front of the gateway retry (`[client_retry]`);
    /// routes inherit it field by field. Used by `idemgate check`.
    pub client_retry: Option<RawClientRetry>,
    /// Path of the Prometheus rules file deployed for this gateway
    /// (relative paths resolve against the configuration file). Used by
    /// `idemgate check`.
    pub alert_rules: Option<RelativePathBuf>,
    /// Path of the key file that seals stored responses (relative paths
    /// resolve against the configuration file). Unset: responses are stored
    /// as received.
    pub encryption_key_file: Option<RelativePathBuf>,
    /// Memory for replays answered without a store round trip (each copy
    /// trusted for a second after the store confirmed it): bytes, or text
    /// like `64MiB`; `0` turns it off. Default `64MiB`.
    pub replay_cache: Option<RawSize>,
    /// Worker threads of the async runtime; unset: tokio's default (one
    /// per core, or `TOKIO_WORKER_THREADS`).
    pub workers: Option<u64>,
    /// What one client connection may hold (`[connections]`).
    pub connections: Option<RawConnections>,
    /// The routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RawRoute>,
}

/// `[connections]` as written: the limits of each client connection on
/// the proxy listener.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawConnections {
    /// Client connections open at once (default 10000); past it a new one
    /// gets 503.
    pub max: Option<u64>,
    /// Longest time to receive a request head, from the connection's
    /// start or its previous answer (default `10s`); also how long an idle
    /// kept-alive connection stays open.
    pub header_read_timeout: Option<String>,
    /// Longest gap between two parts of a request body (default `30s`).
    pub body_idle_timeout: Option<String>,
    /// Longest time to receive a whole request body (default `120s`).
    pub body_read_timeout: Option<String>,
    /// Longest time a write to the client may make no progress (the
    /// client stopped reading) before the connection is closed (default
    /// `60s`).
    pub send_timeout: Option<String>,
    /// Largest request head: bytes, or text like `64KiB` (default).
    pub max_header_bytes: Option<RawSize>,
    /// Most header fields in one request (default 100).
    pub max_headers: Option<u64>,
}

/// `[client_retry]` (top level or per route) as written: the retry policy
/// of the clients calling the gateway. The gateway does not retry; this
/// describes the callers so `idemgate check` can size `done_ttl`: the longest
/// retry window (attempts × (timeout + backoff) + compensation delay),
/// doubled.
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
    pub jitter: Option<Jitter>,
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
    /// `require`, `optional` (default) or `derive`.
    pub key: Option<RawKeyMode>,
    /// For `key = "derive"`: the parts of the key, e.g.
    /// `["tenant", "header:x-user-id", "header:x-session-id", "body"]`.
    pub key_template: Option<Vec<String>>,
    /// For `key = "derive"`: the time window (e.g. `10m`).
    pub key_window: Option<String>,
    /// `reject`, `wait` or `attach` (default).
    pub on_inflight: Option<RawInflightMode>,
    /// How long `wait`/`attach` hold a duplicate (default: the route's
    /// total timeout).
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
    /// Header the client's key is read from (default `Idempotency-Key`).
    pub key_header: Option<String>,
    /// Header the client's key is forwarded under (default `Idempotency-Key`).
    pub upstream_key_header: Option<String>,
    /// Headers naming the tenant, in order: the first one present is
    /// hashed (default: the credential headers `Authorization`, `x-api-key`,
    /// `api-key`, `x-goog-api-key`).
    pub tenant_headers: Option<Vec<String>>,
    /// JSON pointers left out of the fingerprint.
    pub fingerprint_ignore: Option<Vec<String>>,
    /// Most concurrent upstream requests of this route.
    pub concurrency_limit: Option<usize>,
    /// Longest wait for a concurrency slot (default 30 s); past it the
    /// request is answered 503 and its key released, since nothing was sent.
    pub queue_timeout: Option<String>,
    /// `fail_closed` (default) or `fail_open`.
    pub on_store_error: Option<StoreErrorMode>,
    /// Renew the lease while the upstream call runs (default true, every
    /// `pending_ttl / 3`). With `false`, `pending_ttl` must outlast the
    /// longest call.
    pub heartbeat: Option<bool>,
    /// The longest generation expected on this route (e.g. `90s`), checked
    /// against `timeouts.total` and the client's timeout.
    pub longest_generation: Option<String>,
    /// Every response on this route is an event stream (default false):
    /// `idemgate check` then lets `first_byte` be shorter than
    /// `longest_generation`, since a stream's headers come before it.
    pub streaming: Option<bool>,
    /// The route charges, bills or has other side effects that must never
    /// repeat (default false): it then needs a durable store and
    /// `fail_closed`.
    pub charges: Option<bool>,
    /// How this route's event streams end and fail: `openai`, `anthropic`,
    /// `openai_responses` or `none` (default: recognised from each
    /// request's path).
    pub stream_dialect: Option<StreamDialect>,
    /// Store the response body (default true); `false` keeps only status
    /// and headers, and a retry gets an empty body.
    pub store_body: Option<bool>,
    /// This route's clients retry differently: fields set here override the
    /// top-level `[client_retry]`.
    pub client_retry: Option<RawClientRetry>,
}

/// A route's `key` as written: the name of an [`idemgate_layer::KeyMode`],
/// whose template is in the sibling fields `key_template` and
/// `key_window`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawKeyMode {
    /// [`idemgate_layer::KeyMode::Require`].
    Require,
    /// [`idemgate_layer::KeyMode::Optional`].
    Optional,
    /// [`idemgate_layer::KeyMode::Derive`].
    Derive,
}

/// A route's `on_inflight` as written: the name of an
/// [`idemgate_layer::OnInflight`], whose bound is the sibling field
/// `inflight_wait`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawInflightMode {
    /// [`idemgate_layer::OnInflight::Reject`].
    Reject,
    /// [`idemgate_layer::OnInflight::Wait`].
    Wait,
    /// [`idemgate_layer::OnInflight::Attach`].
    Attach,
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
/// the environment. `Debug` hides the store URL's password.
#[derive(Clone, Default, Serialize)]
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
    /// `--encryption-key-file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption_key_file: Option<String>,
    /// `--workers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<u64>,
}

impl fmt::Debug for RawConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured, so a new field cannot be printed unseen.
        let Self {
            listen,
            admin_listen,
            store,
            upstream,
            pending_ttl,
            done_ttl,
            shutdown_grace,
            admin_token,
            admin_hosts,
            client_retry,
            alert_rules,
            encryption_key_file,
            replay_cache,
            workers,
            connections,
            routes,
        } = self;
        f.debug_struct("RawConfig")
            .field("listen", listen)
            .field("admin_listen", admin_listen)
            .field("store", &store.as_deref().map(redact_text))
            .field("upstream", upstream)
            .field("pending_ttl", pending_ttl)
            .field("done_ttl", done_ttl)
            .field("shutdown_grace", shutdown_grace)
            .field("admin_token", &admin_token.as_ref().map(|_| "***"))
            .field("admin_hosts", admin_hosts)
            .field("client_retry", client_retry)
            .field("alert_rules", alert_rules)
            .field("encryption_key_file", encryption_key_file)
            .field("replay_cache", replay_cache)
            .field("workers", workers)
            .field("connections", connections)
            .field("routes", routes)
            .finish()
    }
}

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            upstream,
            listen,
            admin_listen,
            store,
            pending_ttl,
            done_ttl,
            encryption_key_file,
            workers,
        } = self;
        f.debug_struct("Overrides")
            .field("upstream", upstream)
            .field("listen", listen)
            .field("admin_listen", admin_listen)
            .field("store", &store.as_deref().map(redact_text))
            .field("pending_ttl", pending_ttl)
            .field("done_ttl", done_ttl)
            .field("encryption_key_file", encryption_key_file)
            .field("workers", workers)
            .finish()
    }
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
            // Read by the binary itself, not configuration: `--config`,
            // the log filter, and `keys show`'s credential.
            .ignore(&["config", "log", "credential"]),
    )
    .merge(Serialized::defaults(overrides)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token_and_the_store_password() {
        let raw = RawConfig {
            store: Some("postgres://u:hunter2@h/db".into()),
            admin_token: Some("s3cret".into()),
            ..RawConfig::default()
        };
        let shown = format!("{raw:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        let over = Overrides {
            store: raw.store.clone(),
            ..Overrides::default()
        };
        let shown = format!("{over:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
