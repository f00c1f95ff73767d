//! What `/metrics` says after scripted workloads, with exact figures:
//! executions, replays and billed tokens per key, conflicts of concurrent
//! duplicates, upstream phase histograms, timeouts by phase, and events
//! lost from a broken stream.
//!
//! The real gateway (`serve` on 127.0.0.1:0) runs in front of the simulated
//! LLM upstream; the shared helpers are in `support/observability.rs`. The
//! metrics recorder is process-wide: every test that asserts exact counters
//! runs in its own process (cargo-nextest runs one process per test).

mod support;

use futures_util::StreamExt;
use std::time::Duration;

use idemgate_gateway::config::RawInflightMode;
use idemgate_llm_sim::{FAIL_HEADER, LATENCY_HEADER};
use support::observability::*;

/// 10 keys × 3 sends, sequentially: each key executes once and replays
/// twice, and every figure is exact.
#[tokio::test]
async fn ten_keys_three_sends_give_exact_figures() {
    let (sim, gw, client) = sim_and_gateway(None, |_| {}).await;
    let mut saved = 0u64;
    let mut keys = Vec::new();
    for k in 0..10 {
        let key = format!("obs-key-{k}-7f3a");
        // Different prompts: different usage per key.
        let body = chat(false, &"word ".repeat(k + 1));
        let mut usage_of_first = None;
        for send in 0..3 {
            let r = expect_status(post(&client, &gw, &key, body.clone()), 200).await;
            let replayed = r.headers()["idempotent-replayed"] == "true";
            assert_eq!(replayed, send > 0);
            let bytes = r.bytes().await.expect("read the response body");
            match usage_of_first {
                None => usage_of_first = Some(total_tokens(&bytes)),
                Some(u) => saved += u,
            }
        }
        keys.push(key);
    }
    assert_eq!(sim.stats().executions, 10);
    assert!(saved > 0);

    let text = support::metrics(&gw, &client).await;
    assert_eq!(sum(&text, "idempotency_hit_total", &[]), 20.0, "{text}");
    assert_eq!(
        sum(
            &text,
            "idempotency_requests_total",
            &[("outcome", "executed")]
        ),
        10.0
    );
    assert_eq!(
        sum(
            &text,
            "idempotency_requests_total",
            &[("outcome", "replayed")]
        ),
        20.0
    );
    assert_eq!(sum(&text, "idempotency_requests_total", &[]), 30.0);
    assert_eq!(sum(&text, "idempotency_inflight_conflict_total", &[]), 0.0);
    assert_eq!(
        sum(&text, "idempotency_tokens_saved_total", &[]),
        saved as f64,
        "tokens saved = the usage of every replayed response"
    );
    let ratio = sum(&text, "idempotency_hit_ratio", &[]);
    assert!((ratio - 20.0 / 30.0).abs() < 1e-9, "{ratio}");
    // Requests per key is a histogram, observed as keys go quiet: no
    // summary-style `quantile` label.
    assert!(!text.contains("quantile="), "{text}");
    // The route label is the route id, on every idempotency series.
    assert!(present(&text, "idempotency_hit_total", &[("route", "obs")]));

    // Store latency by backend and op: one claim per request that is not
    // answered from the replay cache, one completion per execution.
    let op = |op: &str| {
        sum(
            &text,
            "idemgate_store_operation_seconds_count",
            &[("backend", "sqlite"), ("op", op)],
        )
    };
    let cached = sum(&text, "idemgate_replay_cache_hits_total", &[]);
    assert_eq!(op("claim") + cached, 30.0, "{text}");
    assert_eq!(op("complete"), 10.0);
    assert!(present(
        &text,
        "idemgate_store_operation_seconds_bucket",
        &[("backend", "sqlite"), ("op", "claim"), ("le", "+Inf")]
    ));
    assert_eq!(
        sum(
            &text,
            "idemgate_store_errors_total",
            &[("backend", "sqlite")]
        ),
        0.0
    );

    // No key, credential or tenant anywhere.
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    for secret in keys.iter().map(String::as_str).chain([
        "obs-key",
        CREDENTIAL,
        "sk-observability",
        tenant.as_str(),
    ]) {
        assert!(!text.contains(secret), "`{secret}` in /metrics:\n{text}");
    }
    gw.stop().await.expect("stop cleanly");
}

/// Five concurrent duplicates of a slow request in reject mode: one claims
/// the key and runs (for a minute), the four others meet it in flight and
/// are refused. Exactly four conflicts per round, over several rounds.
#[tokio::test]
async fn concurrent_duplicates_in_reject_mode_count_four_conflicts() {
    let (sim, gw, client) = sim_and_gateway(None, |r| {
        r.on_inflight = Some(RawInflightMode::Reject);
        r.timeouts = Some(patient_timeouts());
    })
    .await;
    let rounds = 5;
    let mut owners = Vec::new();
    for round in 0..rounds {
        let key = format!("dup-key-51c2-{round}");
        let body = chat(false, &format!("a slow question {round}"));
        let mut sends: futures_util::stream::FuturesUnordered<_> = (0..5)
            .map(|_| {
                tokio::spawn(
                    post(&client, &gw, &key, body.clone())
                        .header(LATENCY_HEADER, "60000")
                        .send(),
                )
            })
            .collect();
        // The owner's upstream call takes a minute: the first four answers
        // are the refusals.
        for _ in 0..4 {
            let r = sends
                .next()
                .await
                .unwrap_or_else(|| panic!("five sends"))
                .expect("the task did not panic")
                .expect("the send succeeded");
            assert_eq!(r.status(), 409);
        }
        owners.push(sends);
    }
    while sim.stats().requests < rounds {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let text = support::metrics(&gw, &client).await;
    assert_eq!(
        sum(&text, "idempotency_inflight_conflict_total", &[]),
        4.0 * rounds as f64,
        "{text}"
    );
    assert_eq!(
        sum(
            &text,
            "idempotency_requests_total",
            &[("outcome", "conflict")]
        ),
        4.0 * rounds as f64
    );
    assert_eq!(sum(&text, "idempotency_hit_total", &[]), 0.0);
    assert_eq!(sim.stats().requests, rounds);
    // Shutting down cancels the slow executions and releases their keys.
    gw.stop().await.expect("stop cleanly");
    for mut owner in owners {
        let _ = owner.next().await;
    }
}

/// Upstream phase histograms count each completed request once per phase;
/// timeouts are counted under their phase; a broken stream's relayed
/// events are counted as lost.
#[tokio::test]
async fn upstream_phases_timeouts_and_lost_events() {
    let (_sim, gw, client) = sim_and_tight_gateway().await;
    for k in 0..3 {
        exchange(
            &client,
            &gw,
            &format!("phase-{k}"),
            chat(false, "phases"),
            200,
        )
        .await;
    }
    // First-byte timeout: the upstream never answers.
    let hang = post(&client, &gw, "phase-hang", chat(false, "hang")).header(FAIL_HEADER, "hang");
    expect_status(hang, 504).await;
    // Idle timeout mid-stream: three tokens, then silence.
    let stall =
        post(&client, &gw, "phase-stall", chat(true, "stall")).header(FAIL_HEADER, "stall-after:3");
    let r = expect_status(stall, 200).await;
    let mut body = r.bytes_stream();
    let mut received = Vec::new();
    let mut broke = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(b) => received.extend_from_slice(&b),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(broke, "the stream must end with an error");
    let events = String::from_utf8_lossy(&received)
        .lines()
        .filter(|l| l.starts_with("id: "))
        .count();
    assert!(events >= 3, "{events}");

    let text = support::metrics(&gw, &client).await;
    let phase_count = |phase: &str| {
        sum(
            &text,
            "idemgate_upstream_phase_seconds_count",
            &[("route", "obs"), ("phase", phase)],
        )
    };
    // Three complete answers plus the stream's headers reached first byte;
    // only the three complete answers reached the end of their body.
    assert_eq!(phase_count("first_byte"), 4.0, "{text}");
    assert_eq!(phase_count("total"), 3.0);
    assert!(phase_count("connect") >= 1.0);
    assert_eq!(
        sum(
            &text,
            "idemgate_upstream_queue_seconds_count",
            &[("route", "obs")]
        ),
        5.0
    );
    let timeouts = |phase: &str| {
        sum(
            &text,
            "idemgate_upstream_timeouts_total",
            &[("route", "obs"), ("phase", phase)],
        )
    };
    assert_eq!(timeouts("first_byte"), 1.0);
    assert_eq!(timeouts("idle"), 1.0);
    assert_eq!(timeouts("total"), 0.0);
    assert_eq!(
        sum(&text, "idempotency_stream_events_lost_total", &[]),
        events as f64
    );
    assert_eq!(
        sum(
            &text,
            "idempotency_requests_total",
            &[("outcome", "failed")]
        ),
        2.0
    );
    gw.stop().await.expect("stop cleanly");
}
