//! The exported text for a scripted workload: exact counters and readable
//! quantiles. (One test per binary: the recorder is process-wide.)

use idemgate_telemetry::{Outcome, Telemetry};

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
        t.request(Outcome::Executed, Some(key));
        t.request(Outcome::Replayed, Some(key));
        t.request(Outcome::Replayed, Some(key));
        t.tokens_saved(2 * 50);
    }
    // 5 concurrent duplicates in reject mode: 1 executes, 4 conflict.
    t.request(Outcome::Executed, Some(100));
    for _ in 0..4 {
        t.inflight_conflict();
        t.request(Outcome::Conflict, Some(100));
    }
    let text = t.render();
    assert_eq!(value(&text, "idempotency_hit_total"), Some(20.0), "{text}");
    assert_eq!(
        value(&text, "idempotency_inflight_conflict_total"),
        Some(4.0)
    );
    assert_eq!(
        value(&text, "idempotency_requests_total{outcome=\"executed\"}"),
        Some(11.0)
    );
    assert_eq!(
        value(&text, "idempotency_requests_total{outcome=\"replayed\"}"),
        Some(20.0)
    );
    assert_eq!(
        value(&text, "idempotency_requests_total{outcome=\"conflict\"}"),
        Some(4.0)
    );
    assert_eq!(value(&text, "idempotency_tokens_saved_total"), Some(1000.0));
    // 20 hits of 35 keyed requests.
    let ratio = value(&text, "idempotency_hit_ratio").unwrap();
    assert!((ratio - 20.0 / 35.0).abs() < 1e-9, "{ratio}");
    // Ten keys were sent 3 times, one key 5 times: P50 = 3, P99 = 5.
    assert_eq!(
        value(&text, "idempotency_requests_per_key{quantile=\"0.5\"}"),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "idempotency_requests_per_key{quantile=\"0.99\"}"),
        Some(5.0)
    );
    // No key or tenant ever appears as a label.
    assert!(!text.contains("key=\""), "{text}");
}
