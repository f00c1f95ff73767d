//! `idemgate check` as a real process: one TOML file per case, each
//! checklist item firing (and staying quiet) through the binary, the exit
//! status, the JSON output, and the environment overrides.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// The rules file shipped with the project: a sound configuration points
/// at it, which also checks that it defines the alerts `check` wants.
fn shipped_alerts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/alerts.yml")
}

/// The sound configuration's key file line; `check_with` writes the file.
const KEYS_LINE: &str = "encryption_key_file = \"keys\"";
/// A valid key file (a fixed key: only `check` reads it).
const KEY_FILE: &str = "*k1:c2VjcmV0LWtleS1ieXRlcy10aGF0LWFyZS0zMi1sb24=\n";

/// A route that passes every rule, with `extra` lines added to it, and
/// `top` lines added at the top level.
fn config(top: &str, route: &str) -> String {
    format!(
        "upstream = \"http://127.0.0.1:9\"\n\
         store = \"sqlite:idemgate.db\"\n\
         alert_rules = {alerts:?}\n\
         {KEYS_LINE}\n\
         {top}\n\
         [[routes]]\n\
         prefix = \"/v1\"\n\
         key = \"require\"\n\
         longest_generation = \"90s\"\n\
         {route}\n",
        alerts = shipped_alerts().display().to_string(),
    )
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn rules(&self) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| {
                let start = l.find('[')?;
                let end = l[start..].find(']')?;
                Some(l[start + 1..start + end].to_owned())
            })
            .collect()
    }
}

fn check_with(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().expect("create a temp dir");
    std::fs::write(dir.path().join("gw.toml"), toml).expect("write the file");
    std::fs::write(dir.path().join("keys"), KEY_FILE).expect("write the file");
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--config", "gw.toml"])
        .args(args)
        .current_dir(dir.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the binary");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn check(toml: &str) -> Run {
    check_with(toml, &[], &[])
}

#[test]
fn a_sound_configuration_has_no_findings_and_exits_zero() {
    let r = check(&config("", ""));
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(r.rules(), Vec::<String>::new(), "{}", r.stdout);
    assert!(r.stdout.contains("no findings"), "{}", r.stdout);
    assert!(
        r.stdout.contains("store sqlite, 1 route (/v1)"),
        "{}",
        r.stdout
    );
}

#[test]
fn done_ttl_shorter_than_twice_the_retry_window_is_an_error_with_figures() {
    // 4 × 30 s + (1 + 2 + 3) s of backoff + 5 min compensation = 7m 6s;
    // doubled, 14m 12s.
    let top = "[client_retry]\n\
               attempts = 4\n\
               attempt_timeout = \"30s\"\n\
               backoff_base = \"1s\"\n\
               backoff_cap = \"3s\"\n\
               compensation_delay = \"5m\"\n";
    let with_top = |route: &str| config(top, route).replace("\"90s\"", "\"20s\"");
    let r = check(&with_top("done_ttl = \"10m\""));
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["done-ttl-short"], "{}", r.stdout);
    assert!(
        r.stdout.contains(
            "error   [done-ttl-short] route /v1: done_ttl 10m is shorter than 2 x the longest retry window 7m 6s (4 attempts x 30s timeout"
        ),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("fix: set done_ttl to at least 14m 12s"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("1 error, 0 warnings, 0 infos"),
        "{}",
        r.stdout
    );

    // The same TTL is enough once the route's own clients retry less.
    let r = check(&with_top(
        "done_ttl = \"10m\"\n[routes.client_retry]\nattempts = 2\ncompensation_delay = \"0s\"",
    ));
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    assert_eq!(r.rules(), Vec::<String>::new());

    // With the official clients' defaults (3 × 600 s + 1.5 s of backoff),
    // one hour is three seconds short.
    let r = check(&config("", "done_ttl = \"1h\""));
    assert_eq!(r.rules(), vec!["done-ttl-short"], "{}", r.stdout);
    assert!(r.stdout.contains("at least 1h 3s"), "{}", r.stdout);
}

#[test]
fn total_timeout_shorter_than_the_longest_generation_is_an_error() {
    let r = check(
        &config(
            "",
            "longest_generation = \"3m\"\nstreaming = true\n[routes.timeouts]\nfirst_byte = \"30s\"\ntotal = \"2m\"",
        )
        .replace("longest_generation = \"90s\"\n", ""),
    );
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["total-timeout-short"], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("total_timeout 2m is shorter than the longest expected generation 3m"),
        "{}",
        r.stdout
    );
}

/// The example configuration's old timeouts: a JSON answer's headers come
/// when the generation ends, so a 60 s first byte cuts every 5 min one.
#[test]
fn first_byte_shorter_than_the_longest_generation_is_an_error_unless_streaming() {
    let route = "longest_generation = \"5m\"\n{streaming}[routes.timeouts]\nfirst_byte = \"60s\"\ntotal = \"10m\"";
    let json =
        config("", &route.replace("{streaming}", "")).replace("longest_generation = \"90s\"\n", "");
    let r = check(&json);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["first-byte-timeout-short"], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("first_byte timeout 1m is shorter than the longest expected generation 5m"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("raise timeouts.first_byte above 5m"),
        "{}",
        r.stdout
    );

    // A stream's headers come before the generation: no finding.
    let streams = config("", &route.replace("{streaming}", "streaming = true\n"))
        .replace("longest_generation = \"90s\"\n", "");
    let r = check(&streams);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(r.rules(), Vec::<String>::new(), "{}", r.stdout);
}

#[test]
fn pending_ttl_without_heartbeat_shorter_than_the_operation_is_an_error() {
    let r = check(&config("", "heartbeat = false\npending_ttl = \"30s\""));
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["pending-ttl-short"], "{}", r.stdout);
    assert!(
        r.stdout.contains(
            "pending_ttl 30s without heartbeat is shorter than the operation (total_timeout 10m)"
        ),
        "{}",
        r.stdout
    );
    // Longer than the total timeout: sound without a heartbeat.
    let r = check(&config("", "heartbeat = false\npending_ttl = \"11m\""));
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    // The heartbeat (on by default) keeps a short lease alive.
    let r = check(&config("", "pending_ttl = \"30s\""));
    assert_eq!(r.rules(), Vec::<String>::new(), "{}", r.stdout);
}

#[test]
fn a_content_hash_only_template_is_a_finding_not_a_load_error() {
    for template in [r#"["body"]"#, r#"["tenant", "body"]"#] {
        let r = check(
            &config(
                "",
                &format!("key = \"derive\"\nkey_template = {template}\nkey_window = \"10m\"")
                    .replace("key = \"require\"\n", ""),
            )
            .replace("key = \"require\"\n", ""),
        );
        assert_eq!(r.code, Some(1), "{template}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.rules(), vec!["content-hash-only-key"], "{}", r.stdout);
        assert!(
            r.stdout.contains("add the user and session headers"),
            "{}",
            r.stdout
        );
    }
}

#[test]
fn a_derived_key_without_a_time_window_warns_and_exits_zero() {
    let toml = config(
        "",
        r#"key = "derive"
key_template = ["tenant", "header:x-user-id", "header:x-session-id", "body"]"#,
    )
    .replace("key = \"require\"\n", "");
    let r = check(&toml);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["key-without-window"], "{}", r.stdout);
    assert!(
        r.stdout.contains("warning [key-without-window]"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("0 errors, 1 warning, 0 infos"),
        "{}",
        r.stdout
    );
    // With a window: quiet.
    let r = check(&toml.replace("\"body\"]", "\"body\"]\nkey_window = \"10m\""));
    assert_eq!(r.rules(), Vec::<String>::new(), "{}", r.stdout);
}

#[test]
fn a_charging_route_on_the_memory_store_is_an_error() {
    let toml = config("", "charges = true").replace("sqlite:idemgate.db", "memory:");
    let r = check(&toml);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["memory-store-charges"], "{}", r.stdout);
    // The memory store is fine where nothing is charged.
    let r = check(&config("", "charges = false").replace("sqlite:idemgate.db", "memory:"));
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    assert_eq!(r.rules(), Vec::<String>::new());
}

#[test]
fn fail_open_on_a_charging_route_is_an_error() {
    let r = check(&config(
        "",
        "charges = true\non_store_error = \"fail_open\"",
    ));
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["fail-open-charges"], "{}", r.stdout);
    let r = check(&config("", "on_store_error = \"fail_open\""));
    assert_eq!(r.rules(), Vec::<String>::new(), "{}", r.stdout);
}

#[test]
fn missing_alert_rules_warn_whatever_the_reason() {
    let alerts_line = format!(
        "alert_rules = {:?}\n",
        shipped_alerts().display().to_string()
    );
    // Not configured.
    let r = check(&config("", "").replace(&alerts_line, ""));
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["alert-rules-missing"], "{}", r.stdout);
    assert!(
        r.stdout.contains("`alert_rules` is not set"),
        "{}",
        r.stdout
    );
    // Configured, but no such file (relative to the configuration file).
    let r = check(&config("", "").replace(&alerts_line, "alert_rules = \"rules/absent.yml\"\n"));
    assert_eq!(r.rules(), vec!["alert-rules-missing"], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("absent.yml cannot be read (no such file)"),
        "{}",
        r.stdout
    );
    // A rules file without the hit-ratio alert.
    let (_dir, rules) = support::temp_file(
        "other.yml",
        "groups:\n  - name: other\n    rules:\n      - alert: IdempotencyInflightConflictSurge\n        expr: vector(1)\n",
    );
    let r = check(&config("", "").replace(
        &alerts_line,
        &format!("alert_rules = {:?}\n", rules.display().to_string()),
    ));
    assert_eq!(r.rules(), vec!["alert-rules-missing"], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("does not define IdempotencyHitRatioSurge"),
        "{}",
        r.stdout
    );
}

#[test]
fn json_output_has_every_field_and_the_same_verdict() {
    let r = check_with(
        &config(
            "",
            "charges = true\non_store_error = \"fail_open\"\ndone_ttl = \"1m\"",
        ),
        &["--format", "json"],
        &[],
    );
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!(v["passed"], false);
    assert_eq!(v["store"], "sqlite");
    assert_eq!(v["routes"], serde_json::json!(["/v1"]));
    assert_eq!(v["summary"]["errors"], 2);
    let findings = v["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings array"));
    let rules: Vec<&str> = findings.iter().filter_map(|f| f["rule"].as_str()).collect();
    assert_eq!(rules, vec!["done-ttl-short", "fail-open-charges"]);
    for f in findings {
        assert_eq!(f["severity"], "error");
        assert_eq!(f["route"], "/v1");
        assert!(f["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(f["fix"].as_str().is_some_and(|m| !m.is_empty()));
    }

    let r = check_with(&config("", ""), &["--format", "json"], &[]);
    assert_eq!(r.code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("valid JSON");
    assert_eq!(v["passed"], true);
    assert_eq!(v["findings"], serde_json::json!([]));
}

#[test]
fn an_invalid_or_unreadable_configuration_exits_two() {
    let r = check(&config("", "done_ttl = \"tomorrow\""));
    assert_eq!(r.code, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("routes[0].done_ttl"), "{}", r.stderr);
    let r = check("upstream = \"http://h\"\n[[routes\n");
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let dir = tempfile::tempdir().expect("create a temp dir");
    let out = Command::new(BIN)
        .args(["check", "--config", "absent.toml", "--format", "json"])
        .current_dir(dir.path())
        .output()
        .expect("run the binary");
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("absent.toml")),
        "{v}"
    );
}

#[test]
fn the_environment_and_flags_override_the_file_as_for_serve() {
    let r = check_with(&config("", ""), &[], &[("IDEMGATE_DONE_TTL", "1m")]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["done-ttl-short"], "{}", r.stdout);
    let r = check_with(
        &config("", ""),
        &[],
        &[("IDEMGATE_CLIENT_RETRY__ATTEMPT_TIMEOUT", "24h")],
    );
    assert_eq!(r.rules(), vec!["done-ttl-short"], "{}", r.stdout);
    let r = check_with(&config("", "charges = true"), &["--store", "memory:"], &[]);
    assert_eq!(r.rules(), vec!["memory-store-charges"], "{}", r.stdout);
}

#[test]
fn a_client_timeout_shorter_than_the_longest_generation_warns() {
    let r = check(&config("[client_retry]\nattempt_timeout = \"30s\"", ""));
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    assert_eq!(r.rules(), vec!["client-timeout-short"], "{}", r.stdout);
    assert!(
        r.stdout
            .contains("the client's timeout 30s is shorter than the longest generation 1m 30s"),
        "{}",
        r.stdout
    );
}

#[test]
fn unencrypted_responses_are_an_error_on_charging_routes_and_a_warning_elsewhere() {
    let plain = config("", "").replace(KEYS_LINE, "");
    let r = check(&plain);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(r.rules(), vec!["responses-unencrypted"], "{}", r.stdout);
    assert!(
        r.stdout.contains("warning [responses-unencrypted]"),
        "{}",
        r.stdout
    );

    let charging = config("", "charges = true").replace(KEYS_LINE, "");
    let r = check(&charging);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("error   [responses-unencrypted]"),
        "{}",
        r.stdout
    );

    // The environment sets the file as well as the configuration does.
    let r = check_with(&charging, &[], &[("IDEMGATE_ENCRYPTION_KEY_FILE", "keys")]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
}

#[test]
fn an_unusable_key_file_is_an_error_that_never_shows_the_key() {
    let broken = config("", "").replace(KEYS_LINE, "encryption_key_file = \"broken\"");
    let dir = tempfile::tempdir().expect("create a temp dir");
    std::fs::write(dir.path().join("gw.toml"), &broken).expect("write the file");
    // Two lines, neither active: refused, and the key text stays unsaid.
    std::fs::write(
        dir.path().join("broken"),
        "k1:c2VjcmV0LWtleS1ieXRlcy10aGF0LWFyZS0zMi1sb24=\nk2:YW5vdGhlci1zZWNyZXQta2V5LWJ5dGVzLTMyLWxvbmc=\n",
    )
    .expect("write the file");
    let out = Command::new(BIN)
        .args(["check", "--config", "gw.toml"])
        .current_dir(dir.path())
        .output()
        .expect("run the binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("[encryption-key-file-unreadable]"),
        "{stdout}"
    );
    assert!(!stdout.contains("c2VjcmV0"), "{stdout}");
    assert!(!stdout.contains("YW5vdGhl"), "{stdout}");
    let missing = config("", "").replace(KEYS_LINE, "encryption_key_file = \"absent\"");
    let r = check(&missing);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(r.stdout.contains("absent"), "{}", r.stdout);
}

/// A charging route on PostgreSQL: `check` asks the server whether a
/// committed DONE survives a failover. The shared test server has no
/// synchronous standby, so it warns; a non-charging route asks only
/// whether autovacuum runs (it warns when the server says `off`, as this
/// machine's does); a server that cannot be reached is said so for the
/// charging route, without its password.
#[test]
fn a_charging_route_on_postgres_without_a_synchronous_standby_warns() {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let autovacuum = std::process::Command::new("psql")
        .args(["-XAtc", "SHOW autovacuum", &url])
        .output()
        .expect("psql runs");
    let autovacuum = String::from_utf8_lossy(&autovacuum.stdout)
        .trim()
        .to_owned();
    assert!(
        autovacuum == "on" || autovacuum == "off",
        "SHOW autovacuum said {autovacuum:?}"
    );
    let vacuum_rule: Vec<&str> = if autovacuum == "off" {
        vec!["postgres-autovacuum-off"]
    } else {
        vec![]
    };
    let on = |store: &str, route: &str| config("", route).replace("sqlite:idemgate.db", store);
    let r = check(&on(&url, "charges = true"));
    let mut expected = vec!["postgres-async-replication"];
    expected.extend(&vacuum_rule);
    assert_eq!(r.rules(), expected, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("synchronous_standby_names"),
        "{}",
        r.stdout
    );
    assert_eq!(r.code, Some(0), "a warning does not fail the check");

    let r = check(&on(&url, "charges = false"));
    assert_eq!(r.rules(), vacuum_rule, "{}", r.stdout);

    let closed = "postgres://idemgate:s3cr3t-pw@127.0.0.1:1/test";
    let r = check(&on(closed, "charges = true"));
    assert_eq!(
        r.rules(),
        vec!["postgres-async-replication"],
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("could not ask"), "{}", r.stdout);
    assert!(!r.stdout.contains("s3cr3t-pw") && !r.stderr.contains("s3cr3t-pw"));
}
