//! The gateway's configuration as an [`idemgate_check::Plan`]: what
//! `idemgate check` judges, and what [`serve()`](crate::serve()) (and so
//! `idemgate serve`) refuses to start with.
//!
//! The mapping states what the gateway will really do with each route: the
//! lease and its heartbeat (`pending_ttl / 3`, as the engine renews), the
//! layered timeouts, the key source, the store, the store-error mode. The
//! only I/O is reading the deployed alert rules file, and, in
//! [`store_findings`], one question to a PostgreSQL store's server.

use std::path::Path;

use crate::config::{GatewayConfig, RouteConfig, StoreUrl};
use idemgate_check::{
    AlertRules, Encryption, Finding, KeyPart, KeyPlan, Plan, RoutePlan, Severity, StoreKind,
};

use idemgate_layer::{DerivePart, KeyMode, StoreErrorMode};

/// Rules whose error findings make [`serve()`](crate::serve()) refuse to
/// start.
///
/// A key that merges different operations (a content hash without a user
/// or session, or neither user nor request) makes the gateway answer one
/// person's request with another's stored result: a wrong answer, not a
/// missed duplicate, and nothing at run time can tell. Every other finding
/// leaves the gateway no worse than no gateway (a short TTL lets a late
/// retry run again), so serving goes on and the findings are logged.
pub const REFUSED_AT_START: [&str; 2] = ["content-hash-only-key", "key-too-coarse"];

/// The plan of `config`, reading its alert rules file.
pub fn plan(config: &GatewayConfig) -> Plan {
    Plan {
        store: store_kind(&config.store),
        encryption: encryption(config.encryption_key_file.as_deref()),
        alert_rules: alert_rules(config.alert_rules.as_deref()),
        routes: config.routes.iter().map(route_plan).collect(),
    }
}

/// The checklist's findings for `config`, errors first.
pub fn findings(config: &GatewayConfig) -> Vec<Finding> {
    idemgate_check::check(&plan(config))
}

/// Findings only the store's server can give, for a PostgreSQL store:
/// whether autovacuum runs (the store's tables grow without it), and, for
/// charging routes, whether a committed DONE survives a failover (a
/// synchronous standby). Asks the server once, within `timeout`; nothing
/// is written. Other stores give none.
pub async fn store_findings(config: &GatewayConfig, timeout: std::time::Duration) -> Vec<Finding> {
    let StoreUrl::Postgres(url) = &config.store else {
        return Vec::new();
    };
    let charging: Vec<&str> = config
        .routes
        .iter()
        .filter(|r| r.charges)
        .map(|r| r.id.as_str())
        .collect();
    let fix = "set synchronous_standby_names on the primary (with at least one standby) and keep \
               synchronous_commit = on or remote_apply; otherwise a failover can lose answers \
               the store acknowledged"
        .to_owned();
    let routes = charging.join(", ");
    let settings =
        idemgate_postgres::server_settings(&crate::stores::postgres_driver_url(url), timeout).await;
    let mut findings = Vec::new();
    match settings {
        Ok(s) => {
            if !charging.is_empty() && !s.commits_survive_failover() {
                findings.push(Finding {
                    rule: "postgres-async-replication",
                    severity: Severity::Warning,
                    route: None,
                    message: format!(
                        "charging route(s) {routes} use a PostgreSQL server without a synchronous \
                         standby (synchronous_standby_names = {:?}, synchronous_commit = {}): a \
                         failover can lose a DONE record, and its retry would run again",
                        s.synchronous_standby_names, s.synchronous_commit
                    ),
                    fix,
                });
            }
            if !s.vacuums() {
                findings.push(Finding {
                    rule: "postgres-autovacuum-off",
                    severity: Severity::Warning,
                    route: None,
                    message: format!(
                        "the PostgreSQL server runs with autovacuum = {}: every completion and \
                         lease renewal leaves an old row version in the store's tables, and \
                         nothing reclaims them, so the tables and their indexes grow without bound",
                        s.autovacuum
                    ),
                    fix: "turn autovacuum on (the default), or VACUUM the store's tables on a \
                          schedule"
                        .to_owned(),
                });
            }
        }
        // Nothing to say about vacuuming without an answer; a charging
        // route's need for a standby is said anyway.
        Err(e) if !charging.is_empty() => findings.push(Finding {
            rule: "postgres-async-replication",
            severity: Severity::Info,
            route: None,
            message: format!(
                "could not ask the PostgreSQL server whether it has a synchronous standby \
                 ({e}); charging route(s) {routes} need one to keep answers across a failover"
            ),
            fix,
        }),
        Err(_) => {}
    }
    findings
}

/// The findings that stop [`serve()`](crate::serve()) ([`REFUSED_AT_START`]).
pub fn start_refusals(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| {
            f.severity == idemgate_check::Severity::Error && REFUSED_AT_START.contains(&f.rule)
        })
        .collect()
}

/// What the rules file at `path` (if configured) holds.
pub fn alert_rules(path: Option<&Path>) -> AlertRules {
    let Some(path) = path else {
        return AlertRules::NotConfigured;
    };
    let shown = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => AlertRules::from_rules_text(shown, &text),
        Err(e) => AlertRules::Unreadable {
            path: shown,
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                _ => e.to_string(),
            },
        },
    }
}

/// Whether the key file at `path` (if configured) loads. Its errors name
/// the file and the line, never key text.
pub fn encryption(path: Option<&Path>) -> Encryption {
    match path {
        None => Encryption::NotConfigured,
        Some(p) => match idemgate_seal::KeyRing::from_file(p) {
            Ok(_) => Encryption::Configured,
            Err(e) => Encryption::Unreadable {
                path: p.display().to_string(),
                reason: e.to_string(),
            },
        },
    }
}

fn store_kind(store: &StoreUrl) -> StoreKind {
    match store {
        StoreUrl::Memory => StoreKind::Memory,
        StoreUrl::Sqlite(_) => StoreKind::Sqlite,
        StoreUrl::Redis(_) | StoreUrl::RedisCluster(_) => StoreKind::Redis,
        StoreUrl::Postgres(_) => StoreKind::Postgres,
    }
}

fn route_plan(route: &RouteConfig) -> RoutePlan {
    RoutePlan {
        name: route.id.clone(),
        client_retry: route.client_retry,
        done_ttl: route.done_ttl,
        pending_ttl: route.pending_ttl,
        heartbeat: route.heartbeat,
        connect_timeout: route.timeouts.connect,
        first_byte_timeout: route.timeouts.first_byte,
        total_timeout: route.timeouts.total,
        longest_generation: route.longest_generation,
        streaming: route.streaming,
        key: match &route.key_mode {
            KeyMode::Require => KeyPlan::Require,
            KeyMode::Optional => KeyPlan::Optional,
            KeyMode::Derive(t) => {
                // A part the plan does not know counts for nothing: the
                // checklist then judges the key coarser, never finer.
                let mut parts: Vec<KeyPart> = t
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        DerivePart::Tenant => Some(KeyPart::Tenant),
                        DerivePart::Header(h) => Some(KeyPart::Header(h.as_str().to_owned())),
                        DerivePart::BodyHash => Some(KeyPart::BodyHash),
                        _ => None,
                    })
                    .collect();
                if let Some(w) = t.window {
                    parts.push(KeyPart::Window(w));
                }
                KeyPlan::Derive(parts)
            }
            // A mode the configuration cannot name: no derived key to judge.
            _ => KeyPlan::Optional,
        },
        charges: route.charges,
        fail_open: route.on_store_error == StoreErrorMode::FailOpen,
        retryable_statuses: route.retryable_statuses.clone(),
        upstream_host: route.upstream.host_str().unwrap_or_default().to_owned(),
        tenant_headers: route
            .tenant
            .headers()
            .iter()
            .map(|h| h.as_str().to_owned())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{RawConfig, RawKeyMode, RawRoute};

    fn config(route: RawRoute) -> GatewayConfig {
        GatewayConfig::from_raw(RawConfig {
            upstream: Some("http://127.0.0.1:9".into()),
            store: Some("memory:".into()),
            routes: vec![RawRoute {
                prefix: Some("/v1".into()),
                ..route
            }],
            ..RawConfig::default()
        })
        .expect("a valid configuration")
    }

    #[test]
    fn the_plan_states_what_the_gateway_does() {
        let c = config(RawRoute {
            key: Some(RawKeyMode::Derive),
            key_template: Some(vec![
                "tenant".into(),
                "header:x-user-id".into(),
                "body".into(),
            ]),
            key_window: Some("10m".into()),
            pending_ttl: Some("9s".into()),
            on_store_error: Some(idemgate_layer::StoreErrorMode::FailOpen),
            ..RawRoute::default()
        });
        let p = plan(&c);
        assert_eq!(p.store, StoreKind::Memory);
        assert_eq!(p.alert_rules, AlertRules::NotConfigured);
        let r = &p.routes[0];
        assert_eq!(r.name, "/v1");
        assert_eq!(r.pending_ttl, Duration::from_secs(9));
        assert_eq!(r.heartbeat, Some(Duration::from_secs(3)));
        assert!(r.fail_open);
        assert!(!r.charges);
        assert_eq!(
            r.key,
            KeyPlan::Derive(vec![
                KeyPart::Tenant,
                KeyPart::Header("x-user-id".into()),
                KeyPart::BodyHash,
                KeyPart::Window(Duration::from_secs(600)),
            ])
        );
        assert_eq!(r.client_retry, idemgate_check::RetryPolicy::default());
    }

    #[test]
    fn a_provider_route_reading_another_tenant_header_is_flagged() {
        let anthropic = |tenant_headers: Option<Vec<String>>| {
            GatewayConfig::from_raw(RawConfig {
                store: Some("sqlite:x.db".into()),
                routes: vec![RawRoute {
                    prefix: Some("/v1".into()),
                    upstream: Some("http://api.anthropic.com".into()),
                    tenant_headers,
                    ..RawRoute::default()
                }],
                ..RawConfig::default()
            })
            .expect("a valid configuration")
        };
        let rules = |c: &GatewayConfig| -> Vec<&'static str> {
            findings(c).iter().map(|f| f.rule).collect()
        };
        let default = anthropic(None);
        assert_eq!(
            plan(&default).routes[0].tenant_headers,
            vec!["authorization", "x-api-key", "api-key", "x-goog-api-key"]
        );
        assert_eq!(plan(&default).routes[0].upstream_host, "api.anthropic.com");
        assert!(!rules(&default).contains(&"tenant-misses-credential"));
        let custom = anthropic(Some(vec!["X-Tenant-Id".into()]));
        assert!(rules(&custom).contains(&"tenant-misses-credential"));
        // Not an error: `serve` starts, and the finding is logged.
        assert!(start_refusals(&findings(&custom)).is_empty());
        let both = anthropic(Some(vec!["x-tenant-id".into(), "x-api-key".into()]));
        assert!(!rules(&both).contains(&"tenant-misses-credential"));
    }

    #[test]
    fn only_merging_keys_refuse_a_start() {
        let c = config(RawRoute {
            key: Some(RawKeyMode::Derive),
            key_template: Some(vec!["body".into()]),
            done_ttl: Some("1s".into()),
            ..RawRoute::default()
        });
        let f = findings(&c);
        let rules: Vec<&str> = f.iter().map(|f| f.rule).collect();
        assert!(rules.contains(&"done-ttl-short"), "{rules:?}");
        let refused: Vec<&str> = start_refusals(&f).iter().map(|f| f.rule).collect();
        assert_eq!(refused, vec!["content-hash-only-key"]);
    }
}
