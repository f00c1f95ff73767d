//! Unit tests of the parent module.

use super::*;

#[test]
fn the_dashboard_is_self_contained() {
    let page = DASHBOARD.as_str();
    assert!(!page.contains("/*STYLE*/") && !page.contains("/*SCRIPT*/"));
    assert!(page.contains("setInterval(poll"));
    assert!(page.contains("id=\"recent\""));
    assert!(page.contains(".spark polyline"));
    // No external resources: the only URLs are the SVG namespace.
    for (i, _) in page.match_indices("http") {
        assert!(
            page[i..].starts_with("http://www.w3.org/2000/svg"),
            "external URL at {i}: {}",
            &page[i..(i + 60).min(page.len())]
        );
    }
    for tag in ["<link", "src=", "@import"] {
        assert!(!page.contains(tag), "{tag}");
    }
}

fn snapshot(ratio: f64, baseline: Option<f64>, keyed_5m: u64) -> Snapshot {
    Snapshot {
        requests: Vec::new(),
        requests_total: keyed_5m,
        hits: 0,
        hit_ratio: ratio,
        keyed_requests_5m: keyed_5m,
        hit_ratio_baseline: baseline,
        minutes_to_baseline: if baseline.is_some() { 0 } else { 15 },
        inflight_conflicts: 0,
        tokens_saved: 0,
        stream_events_lost: 0,
        requests_per_key_p50: 0.0,
        requests_per_key_p99: 0.0,
        routes: Vec::new(),
    }
}

#[test]
fn the_ratio_is_judged_against_the_rules_threshold() {
    let rule = HitRatioRule::shipped();
    let v = hit_ratio_alert(&rule, &snapshot(0.3, None, 100));
    assert_eq!(v["state"], "no_baseline");
    assert!(v["threshold"].is_null());
    assert_eq!(v["minutes_to_baseline"], 15);
    assert_eq!(v["alert"], "IdempotencyHitRatioSurge");

    // Baseline 10%: the alert fires above 20%, with more than 0.1 req/s
    // (30 keyed requests in five minutes).
    let v = hit_ratio_alert(&rule, &snapshot(0.3, Some(0.1), 100));
    assert_eq!(v["threshold"], 0.2);
    assert_eq!(v["state"], "above");
    let v = hit_ratio_alert(&rule, &snapshot(0.3, Some(0.1), 30));
    assert_eq!(v["state"], "above_low_traffic");
    let v = hit_ratio_alert(&rule, &snapshot(0.15, Some(0.1), 100));
    assert_eq!(v["state"], "below");
    // A baseline under the floor counts as the floor (1%): 2% fires.
    let v = hit_ratio_alert(&rule, &snapshot(0.03, Some(0.0), 100));
    assert_eq!(v["threshold"], 0.02);
    assert_eq!(v["state"], "above");
}
