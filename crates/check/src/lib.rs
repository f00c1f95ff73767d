//! `idemgate check`: a pre-launch checklist for an idempotent deployment,
//! as findings.
//!
//! Idempotency fails quietly: a TTL a little too short, a timeout a little too
//! tight, a key that changes between retries — nothing errors, and duplicates
//! slip through when nobody is watching. This crate turns each of those
//! mistakes into a rule over a [`Plan`] (what a deployment is configured to
//! do, independent of how the configuration is written), each producing a
//! [`Finding`] with a severity, what is wrong in figures, and how to fix it.
//!
//! # Layout
//! - [`Plan`] / [`RoutePlan`]: the facts the rules need; [`AlertRules`]
//!   judges a deployed Prometheus rules file.
//! - [`backoff`]: capped exponential backoff with jitter ([`Backoff`],
//!   [`Jitter`]), the one implementation the TTL rule, the Rust client and
//!   the demo share.
//! - [`retry`]: how long a client's retries can go on, and so how long a
//!   DONE record must live ([`RetryPolicy`], [`check_done_ttl`]). It lives
//!   here, not in the engine, because only configuration checks need it:
//!   the engine runs with whatever TTL it is given.
//! - [`check`]: runs every rule; [`has_errors`] decides the exit status.
//! - `rules`: the rules, one plain function per deployment mistake.
//!
//! The rules are plain functions over the plan, one per checklist item, so a
//! test can show each one firing and staying quiet.

pub mod backoff;
pub mod retry;
mod rules;

use std::fmt;
use std::time::Duration;

use serde::Serialize;

pub use backoff::{Backoff, Jitter};
pub use retry::{RetryPolicy, TtlTooShort, check_done_ttl};
use rules::*;

/// How bad a finding is. `Error` makes `idemgate check` exit non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing.
    Info,
    /// Likely a mistake; duplicates are possible in some situations.
    Warning,
    /// Duplicates (or lost results) will happen; fix before launch.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so `{:<7}` lines findings up.
        f.pad(match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Error => "error",
        })
    }
}

/// One result of the checklist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable identifier of the rule (e.g. `done-ttl-short`).
    pub rule: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// The route concerned, if any.
    pub route: Option<String>,
    /// What is wrong, with the figures.
    pub message: String,
    /// What to change.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.route {
            Some(r) => write!(
                f,
                "{:<7} [{}] route {r}: {}",
                self.severity, self.rule, self.message
            )?,
            None => write!(f, "{:<7} [{}] {}", self.severity, self.rule, self.message)?,
        }
        write!(f, "\n        fix: {}", self.fix)
    }
}

/// The kind of store a deployment uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process memory: lost on restart, not shared between replicas.
    Memory,
    /// Embedded SQLite file.
    Sqlite,
    /// Redis (single node or cluster).
    Redis,
    /// PostgreSQL.
    Postgres,
}

/// One dimension of a derived key template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// The tenant (an organisation or API credential, not a person).
    Tenant,
    /// A request header naming the user, session, order… (`x-user-id`).
    Header(String),
    /// Hash of the canonical request body.
    BodyHash,
    /// A time window the key is bucketed into.
    Window(Duration),
}

/// How a route gets its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPlan {
    /// The client must send `Idempotency-Key`.
    Require,
    /// Keyed requests are protected; others pass through.
    Optional,
    /// The gateway derives the key from these parts.
    Derive(Vec<KeyPart>),
}

/// What the rules need to know about one route.
#[derive(Clone, Debug)]
pub struct RoutePlan {
    /// Route name or path prefix.
    pub name: String,
    /// The retry policy of the route's clients (attempts, backoff, timeout,
    /// compensation delay).
    pub client_retry: RetryPolicy,
    /// How long DONE records are kept.
    pub done_ttl: Duration,
    /// Lease length.
    pub pending_ttl: Duration,
    /// Lease renewal interval while work runs, if any.
    pub heartbeat: Option<Duration>,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Upstream time-to-first-byte timeout.
    pub first_byte_timeout: Duration,
    /// Upstream total timeout.
    pub total_timeout: Duration,
    /// The longest generation expected on this route, if declared.
    pub longest_generation: Option<Duration>,
    /// Whether every response on the route is an event stream (its headers
    /// come at once, before the generation); otherwise a JSON response's
    /// headers come only when the generation ends.
    pub streaming: bool,
    /// Key source.
    pub key: KeyPlan,
    /// Whether the route charges, bills or otherwise has side effects that
    /// must never repeat.
    pub charges: bool,
    /// Whether store errors forward requests unprotected.
    pub fail_open: bool,
    /// Upstream statuses that release the key for a retry.
    pub retryable_statuses: Vec<u16>,
    /// Host name of the route's upstream (`api.anthropic.com`).
    pub upstream_host: String,
    /// The request headers the tenant is read from, in order (lowercase).
    pub tenant_headers: Vec<String>,
}

/// The header each well-known provider reads its API key from, by host:
/// an exact host, or a suffix starting with `.`. A route in front of one of
/// them whose tenant does not come from that header puts every client in
/// one tenant.
pub const PROVIDER_CREDENTIAL_HEADERS: [(&str, &str); 4] = [
    ("api.openai.com", "authorization"),
    ("api.anthropic.com", "x-api-key"),
    (".openai.azure.com", "api-key"),
    ("generativelanguage.googleapis.com", "x-goog-api-key"),
];

/// The credential header of the provider at `host`, if it is a known one.
pub fn provider_credential_header(host: &str) -> Option<&'static str> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    PROVIDER_CREDENTIAL_HEADERS
        .iter()
        .find(|(pattern, _)| match pattern.strip_prefix('.') {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            None => host == *pattern,
        })
        .map(|(_, header)| *header)
}

/// The alerts a deployment needs: the hit ratio doubling against its
/// baseline (retries rising, minutes before the error rate moves) and
/// in-flight conflicts surging (requests outlasting client timeouts).
pub const REQUIRED_ALERTS: [&str; 2] = [
    "IdempotencyHitRatioSurge",
    "IdempotencyInflightConflictSurge",
];

/// What is known about the deployed Prometheus alert rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlertRules {
    /// A rules file with every alert of [`REQUIRED_ALERTS`] was found.
    Deployed,
    /// No rules file is configured.
    NotConfigured,
    /// The configured file does not exist or cannot be read.
    Unreadable {
        /// The configured path.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The file was read but lacks some of [`REQUIRED_ALERTS`].
    Incomplete {
        /// The configured path.
        path: String,
        /// The alerts not found in it.
        missing: Vec<&'static str>,
    },
}

impl AlertRules {
    /// Judges the text of a Prometheus rules file: every alert of
    /// [`REQUIRED_ALERTS`] must be defined (`alert: Name`) in it.
    pub fn from_rules_text(path: impl Into<String>, text: &str) -> Self {
        let defined: Vec<&str> = text
            .lines()
            .filter_map(|line| {
                let line = line.trim_start().trim_start_matches('-').trim_start();
                let name = line.strip_prefix("alert:")?;
                Some(
                    name.split('#')
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .trim_matches(|c| c == '"' || c == '\''),
                )
            })
            .collect();
        let missing: Vec<&'static str> = REQUIRED_ALERTS
            .iter()
            .copied()
            .filter(|name| !defined.contains(name))
            .collect();
        if missing.is_empty() {
            Self::Deployed
        } else {
            Self::Incomplete {
                path: path.into(),
                missing,
            }
        }
    }
}

/// Whether stored responses are sealed at rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// A key file was configured and read.
    Configured,
    /// No key file is configured: responses are stored as received.
    NotConfigured,
    /// The configured key file cannot be read or parsed.
    Unreadable {
        /// The configured path.
        path: String,
        /// Why (never the key text).
        reason: String,
    },
}

/// What the rules need to know about a deployment.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The store.
    pub store: StoreKind,
    /// Whether stored responses are sealed.
    pub encryption: Encryption,
    /// Whether alert rules for the hit ratio and conflicts are deployed.
    pub alert_rules: AlertRules,
    /// Routes.
    pub routes: Vec<RoutePlan>,
}

/// Runs every rule. Findings are sorted, errors first.
pub fn check(plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    alert_rules(&plan.alert_rules, &mut out);
    key_file(&plan.encryption, &mut out);
    for route in &plan.routes {
        encryption_at_rest(&plan.encryption, route, &mut out);
        done_ttl_covers_retry_window(route, &mut out);
        total_timeout_covers_generation(route, &mut out);
        first_byte_covers_generation(route, &mut out);
        pending_ttl_vs_operation(route, &mut out);
        timeouts_are_layered(route, &mut out);
        key_template(route, &mut out);
        store_for_charges(plan.store, route, &mut out);
        charging_route_key_optional(route, &mut out);
        retryable_statuses(route, &mut out);
        tenant_reads_credential(route, &mut out);
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.rule.cmp(b.rule)));
    out
}

/// Whether any finding is an error (`idemgate check` then exits non-zero).
pub fn has_errors(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

#[cfg(test)]
mod tests;
