//! Unit tests of the parent module.

use super::*;

fn good_route() -> RoutePlan {
    RoutePlan {
        name: "/v1".into(),
        client_retry: RetryPolicy {
            attempts: 3,
            attempt_timeout: Duration::from_secs(120),
            compensation_delay: Duration::from_secs(60),
            ..RetryPolicy::default()
        },
        done_ttl: Duration::from_secs(24 * 3600),
        pending_ttl: Duration::from_secs(30),
        heartbeat: Some(Duration::from_secs(10)),
        connect_timeout: Duration::from_secs(3),
        first_byte_timeout: Duration::from_secs(30),
        total_timeout: Duration::from_secs(300),
        longest_generation: Some(Duration::from_secs(90)),
        streaming: true,
        key: KeyPlan::Require,
        charges: true,
        fail_open: false,
        retryable_statuses: vec![408, 429, 500, 502, 503, 504],
        upstream_host: "api.anthropic.com".into(),
        tenant_headers: ["authorization", "x-api-key", "api-key", "x-goog-api-key"]
            .map(String::from)
            .to_vec(),
    }
}

fn plan(route: RoutePlan) -> Plan {
    Plan {
        store: StoreKind::Sqlite,
        encryption: Encryption::Configured,
        alert_rules: AlertRules::Deployed,
        routes: vec![route],
    }
}

fn rules(p: &Plan) -> Vec<&'static str> {
    check(p).into_iter().map(|f| f.rule).collect()
}

#[test]
fn durations_read_as_written() {
    let ms = Duration::from_millis;
    assert_eq!(secs(ms(0)), "0s");
    assert_eq!(secs(ms(500)), "0.5s");
    assert_eq!(secs(ms(30_000)), "30s");
    assert_eq!(secs(ms(421_500)), "7m 1.5s");
    assert_eq!(secs(ms(3_603_000)), "1h 3s");
    assert_eq!(secs(ms(86_400_000)), "24h");
    // Rounded up, never down.
    assert_eq!(secs(ms(1_001)), "1.1s");
}

#[test]
fn a_sound_plan_has_no_findings() {
    assert_eq!(check(&plan(good_route())), vec![]);
}

#[test]
fn done_ttl_shorter_than_twice_the_window_is_an_error() {
    let mut r = good_route();
    r.done_ttl = Duration::from_secs(60);
    let f = check(&plan(r));
    assert_eq!(f[0].rule, "done-ttl-short");
    assert_eq!(f[0].severity, Severity::Error);
    // 3 x 120 s + 0.5 s + 1 s backoff + 60 s compensation = 421.5 s; doubled 843 s.
    assert!(f[0].fix.contains("14m 3s"), "{}", f[0].fix);
    assert!(has_errors(&f));
}

#[test]
fn total_timeout_shorter_than_the_longest_generation_is_an_error() {
    let mut r = good_route();
    r.total_timeout = Duration::from_secs(60);
    r.first_byte_timeout = Duration::from_secs(20);
    assert_eq!(rules(&plan(r)), vec!["total-timeout-short"]);
}

#[test]
fn first_byte_shorter_than_the_generation_on_a_json_route_is_an_error() {
    let mut r = good_route();
    r.streaming = false;
    let f = check(&plan(r.clone()));
    assert_eq!(
        f.iter().map(|f| (f.rule, f.severity)).collect::<Vec<_>>(),
        vec![("first-byte-timeout-short", Severity::Error)]
    );
    assert!(f[0].message.contains("30s"), "{}", f[0].message);
    assert!(f[0].fix.contains("1m 30s"), "{}", f[0].fix);
    // Quiet once the first byte may wait as long as the generation.
    r.first_byte_timeout = Duration::from_secs(90);
    assert!(rules(&plan(r.clone())).is_empty());
    // Quiet without a declared generation (that has its own finding).
    r.first_byte_timeout = Duration::from_secs(30);
    r.longest_generation = None;
    assert_eq!(rules(&plan(r)), vec!["longest-generation-unknown"]);
}

#[test]
fn undeclared_generation_length_is_informational() {
    let mut r = good_route();
    r.longest_generation = None;
    let f = check(&plan(r));
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].rule, f[0].severity),
        ("longest-generation-unknown", Severity::Info)
    );
    assert!(!has_errors(&f));
}

#[test]
fn client_timeout_shorter_than_generation_warns() {
    let mut r = good_route();
    r.client_retry.attempt_timeout = Duration::from_secs(30);
    assert_eq!(rules(&plan(r)), vec!["client-timeout-short"]);
}

#[test]
fn pending_ttl_without_heartbeat_shorter_than_the_operation_is_an_error() {
    let mut r = good_route();
    r.heartbeat = None;
    assert_eq!(rules(&plan(r.clone())), vec!["pending-ttl-short"]);
    r.pending_ttl = Duration::from_secs(400);
    assert_eq!(rules(&plan(r)), Vec::<&str>::new());
}

#[test]
fn slow_heartbeat_warns() {
    let mut r = good_route();
    r.heartbeat = Some(Duration::from_secs(20));
    assert_eq!(rules(&plan(r)), vec!["heartbeat-slow"]);
}

#[test]
fn unlayered_timeouts_warn() {
    let mut r = good_route();
    r.connect_timeout = Duration::from_secs(60);
    assert_eq!(rules(&plan(r)), vec!["timeouts-not-layered"]);
}

#[test]
fn content_hash_only_template_is_an_error_and_missing_window_warns() {
    let mut r = good_route();
    r.key = KeyPlan::Derive(vec![KeyPart::Tenant, KeyPart::BodyHash]);
    assert_eq!(
        rules(&plan(r.clone())),
        vec!["content-hash-only-key", "key-without-window"]
    );
    r.key = KeyPlan::Derive(vec![
        KeyPart::Header("x-user-id".into()),
        KeyPart::Header("x-session-id".into()),
        KeyPart::BodyHash,
        KeyPart::Window(Duration::from_secs(600)),
    ]);
    assert_eq!(rules(&plan(r.clone())), Vec::<&str>::new());
    r.key = KeyPlan::Derive(vec![
        KeyPart::Tenant,
        KeyPart::Window(Duration::from_secs(600)),
    ]);
    assert_eq!(rules(&plan(r)), vec!["key-too-coarse"]);
}

#[test]
fn memory_store_or_fail_open_on_a_charging_route_is_an_error() {
    let mut p = plan(good_route());
    p.store = StoreKind::Memory;
    assert_eq!(rules(&p), vec!["memory-store-charges"]);
    p.routes[0].charges = false;
    assert_eq!(rules(&p), Vec::<&str>::new());
    let mut p = plan(good_route());
    p.routes[0].fail_open = true;
    assert_eq!(rules(&p), vec!["fail-open-charges"]);
}

#[test]
fn a_charging_route_with_an_optional_key_warns() {
    let mut r = good_route();
    r.key = KeyPlan::Optional;
    let f = check(&plan(r.clone()));
    assert_eq!(rules(&plan(r.clone())), vec!["charging-route-key-optional"]);
    assert_eq!(f[0].severity, Severity::Warning);
    r.charges = false;
    assert_eq!(rules(&plan(r)), Vec::<&str>::new());
}

#[test]
fn final_statuses_marked_retryable_warn() {
    let mut r = good_route();
    r.retryable_statuses = vec![200, 400, 408, 429, 503];
    let f = check(&plan(r));
    assert_eq!(f[0].rule, "retryable-final-status");
    assert!(f[0].message.contains("[200, 400]"));
}

#[test]
fn a_known_provider_whose_credential_is_not_a_tenant_source_warns() {
    for (host, header) in [
        ("api.openai.com", "authorization"),
        ("api.anthropic.com", "x-api-key"),
        ("my-res.openai.azure.com", "api-key"),
        ("generativelanguage.googleapis.com", "x-goog-api-key"),
    ] {
        let mut r = good_route();
        r.upstream_host = host.into();
        // The default sources hold every provider's header: quiet.
        assert_eq!(rules(&plan(r.clone())), Vec::<&str>::new(), "{host}");
        // A custom list holding it: quiet, whatever its case or place.
        r.tenant_headers = vec!["x-tenant-id".into(), header.to_ascii_uppercase()];
        assert_eq!(rules(&plan(r.clone())), Vec::<&str>::new(), "{host}");
        // A custom list without it: a warning naming the header.
        r.tenant_headers = vec!["x-tenant-id".into()];
        let f = check(&plan(r));
        assert_eq!(f.len(), 1, "{host}");
        assert_eq!(
            (f[0].rule, f[0].severity),
            ("tenant-misses-credential", Severity::Warning)
        );
        assert!(f[0].message.contains(header), "{}", f[0].message);
        assert!(f[0].fix.contains(header), "{}", f[0].fix);
    }
}

#[test]
fn unknown_hosts_and_look_alikes_are_not_providers() {
    assert_eq!(
        provider_credential_header("API.Anthropic.com."),
        Some("x-api-key")
    );
    for host in [
        "127.0.0.1",
        "llm.internal",
        "openai.azure.com",
        "evil-openai.azure.com",
        "api.openai.com.evil.net",
        "anthropic.com",
    ] {
        assert_eq!(provider_credential_header(host), None, "{host}");
    }
    let mut r = good_route();
    r.upstream_host = "llm.internal".into();
    r.tenant_headers = vec!["x-tenant-id".into()];
    assert_eq!(rules(&plan(r)), Vec::<&str>::new());
}

#[test]
fn missing_alert_rules_warn() {
    let mut p = plan(good_route());
    p.alert_rules = AlertRules::NotConfigured;
    assert_eq!(rules(&p), vec!["alert-rules-missing"]);
    p.alert_rules = AlertRules::Unreadable {
        path: "/etc/prometheus/idemgate.yml".into(),
        reason: "not found".into(),
    };
    let f = check(&p);
    assert_eq!(f[0].rule, "alert-rules-missing");
    assert!(f[0].message.contains("/etc/prometheus/idemgate.yml"));
}

#[test]
fn rules_files_are_judged_by_the_alerts_they_define() {
    let full = "groups:\n  - name: x\n    rules:\n      - alert: IdempotencyHitRatioSurge\n        expr: up\n      - alert: \"IdempotencyInflightConflictSurge\" # quoted\n";
    assert_eq!(
        AlertRules::from_rules_text("a.yml", full),
        AlertRules::Deployed
    );
    let partial = "      - alert: IdempotencyInflightConflictSurge\n# alert: IdempotencyHitRatioSurge\n      - record: IdempotencyHitRatioSurge\n";
    assert_eq!(
        AlertRules::from_rules_text("b.yml", partial),
        AlertRules::Incomplete {
            path: "b.yml".into(),
            missing: vec!["IdempotencyHitRatioSurge"],
        }
    );
    let shipped = include_str!("../../../ops/alerts.yml");
    assert_eq!(
        AlertRules::from_rules_text("ops/alerts.yml", shipped),
        AlertRules::Deployed
    );
}

#[test]
fn unencrypted_responses_are_an_error_on_charging_routes_and_a_warning_elsewhere() {
    let mut p = plan(good_route());
    p.encryption = Encryption::NotConfigured;
    let f = check(&p);
    assert_eq!(
        (f[0].rule, f[0].severity),
        ("responses-unencrypted", Severity::Error)
    );
    p.routes[0].charges = false;
    let f = check(&p);
    assert_eq!(
        (f[0].rule, f[0].severity),
        ("responses-unencrypted", Severity::Warning)
    );
    p.encryption = Encryption::Unreadable {
        path: "/etc/idemgate/keys".into(),
        reason: "no such file".into(),
    };
    let f = check(&p);
    assert_eq!(
        (f[0].rule, f[0].severity),
        ("encryption-key-file-unreadable", Severity::Error)
    );
    assert!(f[0].message.contains("/etc/idemgate/keys"));
}

#[test]
fn errors_sort_before_warnings() {
    let mut r = good_route();
    r.done_ttl = Duration::from_secs(1);
    r.connect_timeout = Duration::from_secs(60);
    let f = check(&plan(r));
    assert_eq!(f[0].severity, Severity::Error);
    assert_eq!(f[1].severity, Severity::Warning);
    assert!(f[0].to_string().contains("fix:"));
}
