//! The shipped operations files against the exported names: every metric
//! the alert rules and the Grafana dashboard refer to is exported after a
//! workload, and is one of idemgate-telemetry's names.
//!
//! The real gateway (`serve` on 127.0.0.1:0) runs in front of the simulated
//! LLM upstream; the shared helpers are in `support/observability.rs`.

mod support;

use std::collections::BTreeSet;

use idemgate_llm_sim::FAIL_HEADER;
use support::observability::*;

/// The metric names the shipped rules and dashboard refer to: identifiers
/// starting with `idempotency_` or `idemgate_` in their expressions, with
/// histogram suffixes stripped (recording rules, `idemgate:*`, are not
/// identifiers of this form).
fn referenced_names() -> BTreeSet<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ops");
    let mut exprs = Vec::new();
    // alerts.yml: `expr:` values, inline or as an indented block.
    let alerts = std::fs::read_to_string(format!("{root}/alerts.yml")).expect("read the file");
    let lines: Vec<&str> = alerts.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            let rest = rest.trim();
            if rest == "|" || rest == ">" || rest.starts_with("|-") || rest.starts_with(">-") {
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    let ind = l.len() - l.trim_start().len();
                    if !l.trim().is_empty() && ind <= indent {
                        break;
                    }
                    exprs.push(l.to_owned());
                    i += 1;
                }
                continue;
            }
            exprs.push(rest.to_owned());
        }
        i += 1;
    }
    // grafana-dashboard.json: every "expr" string, at any depth.
    let dashboard =
        std::fs::read_to_string(format!("{root}/grafana-dashboard.json")).expect("read the file");
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("valid JSON");
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&json, &mut exprs);
    assert!(exprs.len() >= 10, "expressions found: {exprs:?}");

    let mut names = BTreeSet::new();
    for expr in &exprs {
        let bytes = expr.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
            let begins = start == 0 || !ident(bytes[start - 1]);
            let rest = &expr[start..];
            if begins && (rest.starts_with("idempotency_") || rest.starts_with("idemgate_")) {
                let len = rest.bytes().take_while(|b| ident(*b)).count();
                let name = &rest[..len];
                if !name.contains(':') {
                    let base = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|s| name.strip_suffix(s))
                        .unwrap_or(name);
                    names.insert(base.to_owned());
                }
                start += len;
            } else {
                start += 1;
            }
        }
    }
    names
}

/// Every metric the alert rules and the Grafana dashboard refer to is
/// exported after a workload, and is one of idemgate-telemetry's names: the
/// shipped operations files never refer to a metric that does not exist.
#[tokio::test]
async fn alerts_and_dashboard_refer_only_to_exported_metrics() {
    let names = referenced_names();
    for expected in [
        "idempotency_hit_total",
        "idempotency_requests_total",
        "idempotency_inflight_conflict_total",
        "idemgate_upstream_phase_seconds",
        "idemgate_store_operation_seconds",
    ] {
        assert!(
            names.contains(expected),
            "{expected} not found in {names:?}"
        );
    }
    for n in &names {
        assert!(
            idemgate_telemetry::names::ALL.contains(&n.as_str()),
            "{n} is referenced but is not one of idemgate_telemetry::names"
        );
    }

    let (_sim, gw, client) = sim_and_tight_gateway().await;
    for _ in 0..2 {
        exchange(&client, &gw, "names-1", chat(false, "names"), 200).await;
    }
    let hang = post(&client, &gw, "names-2", chat(false, "hang")).header(FAIL_HEADER, "hang");
    expect_status(hang, 504).await;
    let text = support::metrics(&gw, &client).await;
    let exported: BTreeSet<String> = samples(&text)
        .into_iter()
        .map(|s| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| s.name.strip_suffix(suffix))
                .map_or(s.name.clone(), str::to_owned)
        })
        .collect();
    let missing: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "not in /metrics: {missing:?}\n{text}");
    gw.stop().await.expect("stop cleanly");
}
