//! One route, typed and validated: [`RouteConfig`] and its [`Timeouts`],
//! made from a [`RawRoute`] with the top-level values as defaults.
//!
//! The route's behaviour is said in the layer's own types ([`KeyMode`],
//! [`OnInflight`], [`StoreErrorMode`], …), so what the file asks for is
//! what the idempotency layer is given ([`RouteConfig::layer_config`]),
//! with no translation in between; the mode names were already read by
//! serde ([`super::raw`]). A value that is malformed is refused
//! here, naming its field (`routes[0].on_inflight`); a design mistake that
//! is well formed (a key of the body hash alone) loads, and is the
//! checklist's to report ([`crate::plan`]).

use std::time::Duration;

use http::{HeaderName, Method};
use idemgate_check::RetryPolicy;
use idemgate_layer::config::default_retryable_statuses;
use idemgate_layer::{
    CompletionClock, DerivePart, DeriveTemplate, KeyMode, LayerConfig, OnInflight,
    OutcomeUnknownMode, StoreErrorMode, StreamDialect, TenantSource,
};
use url::Url;

use super::client_retry::client_retry;
use super::error::ConfigError;
use super::parse::{duration, header, size, upstream_url};
use super::raw::{RawInflightMode, RawKeyMode, RawRoute, RawTimeouts};

/// Default `queue_timeout`: long enough to ride out a burst, short enough
/// that a client hears "busy" well before its own timeout.
pub(crate) const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default body limit: 10 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// Response headers kept with a stored result for replay, besides
/// `content-type` (the layer always keeps it).
const STORED_HEADERS: [&str; 4] = [
    "x-request-id",
    "request-id",
    "openai-model",
    "anthropic-ratelimit-requests-remaining",
];

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
    pub on_inflight: OnInflight,
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
    /// Header the client's key is read from.
    pub key_header: HeaderName,
    /// Header the key is forwarded upstream under.
    pub upstream_key_header: HeaderName,
    /// Where the tenant of a request comes from.
    pub tenant: TenantSource,
    /// JSON pointers left out of the fingerprint.
    pub fingerprint_ignore: Vec<String>,
    /// Most concurrent upstream requests; `None`: unlimited.
    pub concurrency_limit: Option<usize>,
    /// Longest wait for a concurrency slot; it is not part of the upstream
    /// timeouts, which start when the request is sent.
    pub queue_timeout: Duration,
    /// What to do when the store cannot be reached.
    pub on_store_error: StoreErrorMode,
    /// Lease renewal interval while the upstream call runs (`pending_ttl /
    /// 3`); `None`: no renewal, the lease must outlast the call.
    pub heartbeat: Option<Duration>,
    /// The longest generation expected on this route, if declared.
    pub longest_generation: Option<Duration>,
    /// Whether every response on the route is an event stream (for
    /// `idemgate check`).
    pub streaming: bool,
    /// Whether the route charges or has side effects that must never repeat.
    pub charges: bool,
    /// How event streams end and fail; `None`: from each request's path.
    pub stream_dialect: Option<StreamDialect>,
    /// Whether the response body is stored (`store_body`, default true).
    pub store_body: bool,
    /// The retry policy of this route's clients.
    pub client_retry: RetryPolicy,
}

impl RouteConfig {
    /// Whether `path` falls under this route's prefix (segment-wise).
    pub fn matches(&self, path: &str) -> bool {
        prefix_matches(&self.prefix, path)
    }

    /// What the idempotency layer of this route is given.
    pub fn layer_config(&self) -> LayerConfig {
        let operations_path = if self.prefix == "/" {
            "/idemgate/operations/".to_owned()
        } else {
            format!("{}/idemgate/operations/", self.prefix)
        };
        LayerConfig {
            namespace: self.id.clone(),
            key_mode: self.key_mode.clone(),
            on_inflight: self.on_inflight,
            methods: self.methods.clone(),
            body_limit: self.body_limit,
            tenant: self.tenant.clone(),
            fingerprint_ignore: self.fingerprint_ignore.clone(),
            retryable_statuses: self.retryable_statuses.clone(),
            stored_headers: STORED_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            on_store_error: self.on_store_error,
            // A detached execution ends with the upstream's total timeout; a
            // little slack lets the body error arrive first.
            completion_timeout: self.timeouts.total + Duration::from_secs(1),
            // The proxy says when the request left its queue for the
            // upstream; the layer's clock starts then, like the proxy's own.
            completion_clock: CompletionClock::Sent,
            on_outcome_unknown: if self.charges {
                OutcomeUnknownMode::Store
            } else {
                OutcomeUnknownMode::Release
            },
            operations_path,
            stream_dialect: self.stream_dialect,
            key_header: self.key_header.clone(),
            store_body: self.store_body,
            ..LayerConfig::default()
        }
    }
}

/// Whether `path` falls under `prefix`, segment-wise: `/v1` matches `/v1`
/// and `/v1/chat`, never `/v10`.
pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// What a route inherits from the top level of the configuration.
pub(super) struct RouteDefaults {
    /// The top-level `upstream`.
    pub(super) upstream: Option<Url>,
    /// The top-level `pending_ttl`.
    pub(super) pending_ttl: Duration,
    /// The top-level `done_ttl`.
    pub(super) done_ttl: Duration,
    /// The top-level `[client_retry]`.
    pub(super) client_retry: RetryPolicy,
}

/// Validates the route at `at` (`routes[2]`, the prefix of its fields'
/// names in errors).
pub(super) fn route(at: &str, r: RawRoute, d: &RouteDefaults) -> Result<RouteConfig, ConfigError> {
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
    let key = r.key.unwrap_or(RawKeyMode::Optional);
    if key != RawKeyMode::Derive && (r.key_template.is_some() || r.key_window.is_some()) {
        return Err(ConfigError::invalid(
            field("key_template"),
            "only allowed with `key = \"derive\"`",
        ));
    }
    let key_mode = match key {
        RawKeyMode::Require => KeyMode::Require,
        RawKeyMode::Optional => KeyMode::Optional,
        RawKeyMode::Derive => {
            KeyMode::Derive(template(at, r.key_template, r.key_window.as_deref())?)
        }
    };
    // A duplicate waits at most as long as a generation may take.
    let inflight_wait = duration(
        &field("inflight_wait"),
        r.inflight_wait.as_deref(),
        timeouts.total,
    )?;
    let on_inflight = match r.on_inflight.unwrap_or(RawInflightMode::Attach) {
        RawInflightMode::Reject => OnInflight::Reject,
        RawInflightMode::Wait => OnInflight::Wait(inflight_wait),
        RawInflightMode::Attach => OnInflight::Attach(inflight_wait),
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
    let key_header = header(
        &field("key_header"),
        r.key_header.as_deref().unwrap_or("idempotency-key"),
    )?;
    let upstream_key_header = header(
        &field("upstream_key_header"),
        r.upstream_key_header
            .as_deref()
            .unwrap_or("idempotency-key"),
    )?;
    let tenant = match r.tenant_headers {
        None => TenantSource::Credential,
        Some(names) if names.is_empty() => {
            return Err(ConfigError::invalid(
                field("tenant_headers"),
                "must not be empty (leave it out for the credential headers)",
            ));
        }
        Some(names) => TenantSource::Headers(
            names
                .iter()
                .map(|h| header(&field("tenant_headers"), h))
                .collect::<Result<_, _>>()?,
        ),
    };
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
    let queue_timeout = duration(
        &field("queue_timeout"),
        r.queue_timeout.as_deref(),
        DEFAULT_QUEUE_TIMEOUT,
    )?;
    let on_store_error = r.on_store_error.unwrap_or(StoreErrorMode::FailClosed);
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
        key_header,
        upstream_key_header,
        tenant,
        fingerprint_ignore,
        concurrency_limit,
        queue_timeout,
        on_store_error,
        heartbeat,
        longest_generation,
        streaming: r.streaming.unwrap_or(false),
        charges: r.charges.unwrap_or(false),
        stream_dialect: r.stream_dialect,
        store_body: r.store_body.unwrap_or(true),
        client_retry,
    })
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
    // (`serve()` refuses to start with it).
    let window = window
        .map(|w| duration(&format!("{at}.key_window"), Some(w), Duration::ZERO))
        .transpose()?;
    Ok(DeriveTemplate { parts, window })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_by_segment() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/v1", "/v1"));
        assert!(prefix_matches("/v1", "/v1/chat"));
        assert!(!prefix_matches("/v1", "/v10/chat"));
        assert!(!prefix_matches("/v1", "/"));
    }
}
