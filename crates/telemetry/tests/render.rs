//! The exported text for a scripted workload: exact counters and readable
//! quantiles. (One test per binary: the recorder is process-wide.)

use idemgate_telemetry::{RequestOutcome, Telemetry};

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn scripted_workload_renders_exact_figures() {
    let t = Telemetry::global();
    // 10 keys x 3 sends: the first executes, the next two replay.
    for key in 0..10u64 {
        t.request(RequestOutcome::Executed, Some(key));
        t.request(RequestOutcome::Replayed, Some(key));
        t.request(RequestOutcome::Replayed, Some(key));
        t.tokens_saved(2 * 50);
    }
    // 5 concurrent duplicates in reject mode: 1 executes, 4 conflict.
    t.request(RequestOutcome::Executed, Some(100));
    for _ in 0..4 {
        t.inflight_conflict();
        t.request(RequestOutcome::Conflict, Some(100));
    }
    // The keys end (as at shutdown): one histogram observation each.
    t.finish_keys();
    let text = t.render();
    for (series, expected) in [
        ("idempotency_hit_total", 20.0),
        ("idempotency_inflight_conflict_total", 4.0),
        ("idempotency_requests_total{outcome=\"executed\"}", 11.0),
        ("idempotency_requests_total{outcome=\"replayed\"}", 20.0),
        ("idempotency_requests_total{outcome=\"conflict\"}", 4.0),
        ("idempotency_tokens_saved_total", 1000.0),
    ] {
        assert_eq!(value(&text, series), Some(expected), "{series}:\n{text}");
    }
    // 20 hits of 35 keyed requests.
    let ratio = value(&text, "idempotency_hit_ratio").unwrap();
    assert!((ratio - 20.0 / 35.0).abs() < 1e-9, "{ratio}");
    // Ten keys were sent 3 times, one key 5 times: a histogram (summable
    // across replicas), with no `quantile` label anywhere.
    let bucket = |le: &str| {
        value(
            &text,
            &format!("idempotency_requests_per_key_bucket{{le=\"{le}\"}}"),
        )
    };
    for (le, expected) in [("2", 0.0), ("3", 10.0), ("5", 11.0), ("+Inf", 11.0)] {
        assert_eq!(bucket(le), Some(expected), "le={le}:\n{text}");
    }
    assert_eq!(
        value(&text, "idempotency_requests_per_key_count"),
        Some(11.0)
    );
    assert_eq!(value(&text, "idempotency_requests_per_key_sum"), Some(35.0));
    assert!(!text.contains("quantile="), "{text}");
    // The build, as a constant 1 labelled with the version.
    assert_eq!(
        value(
            &text,
            &format!(
                "idemgate_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0),
        "{text}"
    );
    // Every family exported has its HELP text.
    let families: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
        .filter_map(|l| l.split(' ').nth(2))
        .collect();
    assert!(families.len() >= 8, "{text}");
    for family in families {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {family} ")) && l.len() > family.len() + 10),
            "no HELP for {family}:\n{text}"
        );
    }
    // No key or tenant ever appears as a label.
    assert!(!text.contains("key=\""), "{text}");
}
