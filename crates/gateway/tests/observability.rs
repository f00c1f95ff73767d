//! What the gateway tells its operators: `/metrics` after scripted
//! workloads, with exact figures; trace ids through to the upstream; the
//! shipped alert rules and dashboard against the exported names.
//!
//! The real gateway (`serve` on 127.0.0.1:0) runs in front of the simulated
//! LLM upstream. The metrics recorder is process-wide: every test that
//! asserts exact counters runs in its own process (cargo-nextest runs one
//! process per test).

mod support;

use support::TestGateway;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use idemgate_gateway::config::{RawInflightMode, RawRoute, RawTimeouts};
use idemgate_llm_sim::{FAIL_HEADER, LATENCY_HEADER, SimConfig, SimHandle};

/// Starts the gateway on an SQLite store in a fresh directory.
async fn start(upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> TestGateway {
    start_with(upstream, None, tweak).await
}

/// As [`start`], with an admin token.
async fn start_with(
    upstream: &str,
    admin_token: Option<&str>,
    tweak: impl FnOnce(&mut RawRoute),
) -> TestGateway {
    TestGateway::builder(upstream)
        .route(|route| {
            route.id = Some("obs".into());
            route.on_inflight = Some(RawInflightMode::Reject);
            route.timeouts = Some(RawTimeouts {
                connect: Some("2s".into()),
                first_byte: Some("20s".into()),
                idle: Some("10s".into()),
                total: Some("60s".into()),
            });
            tweak(route);
        })
        .config(|c| {
            c.shutdown_grace = Some("1s".into());
            c.admin_token = admin_token.map(str::to_owned);
        })
        .start()
        .await
}

async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process")
}

fn chat(stream: bool, text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

const CREDENTIAL: &str = "Bearer sk-observability-credential-9d2f";

fn post(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    body: String,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .header("authorization", CREDENTIAL)
        .header("idempotency-key", key)
        .body(body)
}

/// One sample of the exposition text.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some(Sample {
                name: name.to_owned(),
                labels,
                value,
            })
        })
        .collect()
}

/// The sum of every sample of `name` carrying all of `labels`.
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|s| s.value)
        .sum()
}

/// Whether any sample of `name` carries all of `labels`.
fn present(text: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    samples(text).iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    })
}

fn total_tokens(body: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
    let usage = &v["usage"];
    let p = usage["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    let c = usage["completion_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    p + c
}

/// 10 keys × 3 sends, sequentially: each key executes once and replays
/// twice, and every figure is exact.
#[tokio::test]
async fn ten_keys_three_sends_give_exact_figures() {
    let sim = sim().await;
    let gw = start(&sim.url(), |_| {}).await;
    let client = reqwest::Client::new();
    let mut saved = 0u64;
    let mut keys = Vec::new();
    for k in 0..10 {
        let key = format!("obs-key-{k}-7f3a");
        // Different prompts: different usage per key.
        let body = chat(false, &"word ".repeat(k + 1));
        let mut usage_of_first = None;
        for send in 0..3 {
            let r = post(&client, &gw, &key, body.clone())
                .send()
                .await
                .expect("send the request");
            assert_eq!(r.status(), 200);
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

    let text = gw.metrics(&client).await;
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
    let sim = sim().await;
    let gw = start(&sim.url(), |r| {
        r.on_inflight = Some(RawInflightMode::Reject);
        r.timeouts = Some(RawTimeouts {
            connect: Some("2s".into()),
            first_byte: Some("120s".into()),
            idle: Some("120s".into()),
            total: Some("120s".into()),
        });
    })
    .await;
    let client = reqwest::Client::new();
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
    let text = gw.metrics(&client).await;
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
    let sim = sim().await;
    let gw = start(&sim.url(), |r| {
        r.timeouts = Some(RawTimeouts {
            connect: Some("2s".into()),
            first_byte: Some("1s".into()),
            idle: Some("1s".into()),
            total: Some("30s".into()),
        });
    })
    .await;
    let client = reqwest::Client::new();
    for k in 0..3 {
        let r = post(&client, &gw, &format!("phase-{k}"), chat(false, "phases"))
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    // First-byte timeout: the upstream never answers.
    let r = post(&client, &gw, "phase-hang", chat(false, "hang"))
        .header(FAIL_HEADER, "hang")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 504);
    // Idle timeout mid-stream: three tokens, then silence.
    let r = post(&client, &gw, "phase-stall", chat(true, "stall"))
        .header(FAIL_HEADER, "stall-after:3")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
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

    let text = gw.metrics(&client).await;
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

    let sim = sim().await;
    let gw = start(&sim.url(), |r| {
        r.timeouts = Some(RawTimeouts {
            connect: Some("2s".into()),
            first_byte: Some("1s".into()),
            idle: Some("1s".into()),
            total: Some("30s".into()),
        });
    })
    .await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let r = post(&client, &gw, "names-1", chat(false, "names"))
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    let r = post(&client, &gw, "names-2", chat(false, "hang"))
        .header(FAIL_HEADER, "hang")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 504);
    let text = gw.metrics(&client).await;
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

/// An upstream that records the `traceparent` of each request it gets.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let log = Arc::clone(&log);
        async move {
            let tp = headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            log.lock().expect("lock not poisoned").push(tp);
            (
                [("content-type", "application/json")],
                r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .expect("a bound listener has an address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn trace_id_of(traceparent: &str) -> &str {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1].len(), 32);
    assert!(
        parts[1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(parts[1], "0".repeat(32));
    assert_eq!(parts[2].len(), 16);
    traceparent.split('-').nth(1).unwrap_or_default()
}

/// A client's valid `traceparent` reaches the upstream unchanged; without
/// one (or with an invalid one) the gateway starts a trace and sends a
/// fresh `traceparent` upstream, a new trace id per request.
#[tokio::test]
async fn traceparent_is_propagated_or_started() {
    let (upstream, seen) = recording_upstream().await;
    let gw = start(&upstream, |_| {}).await;
    let client = reqwest::Client::new();
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let send = |key: &'static str, tp: Option<&'static str>| {
        let mut b = post(&client, &gw, key, chat(false, "trace"));
        if let Some(tp) = tp {
            b = b.header("traceparent", tp);
        }
        b.send()
    };
    let r = send("trace-1", Some(given))
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-2", None).await.expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-3", None).await.expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-4", Some("00-NOT-A-TRACE-01"))
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let seen = seen.lock().expect("lock not poisoned").clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[0].as_deref(), Some(given));
    let fresh: Vec<String> = seen[1..]
        .iter()
        .map(|tp| {
            let tp = tp
                .as_deref()
                .unwrap_or_else(|| panic!("no traceparent upstream"));
            trace_id_of(tp).to_owned()
        })
        .collect();
    let distinct: BTreeSet<&String> = fresh.iter().collect();
    assert_eq!(distinct.len(), 3, "{fresh:?}");
    assert!(!fresh.contains(&"0af7651916cd43dd8448eb211c80319c".to_owned()));
    gw.stop().await.expect("stop cleanly");
}

/// A `MakeWriter` collecting every log line in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("lock not poisoned")
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Every line logged about a keyed request (its detached execution, the
/// proxy's upstream failures) carries the client's key and the trace id;
/// no prompt or completion text is ever logged.
#[tokio::test]
async fn keyed_log_lines_carry_key_and_trace_id_and_no_content() {
    let captured = Captured::default();
    assert!(idemgate_telemetry::logging::init_json_with(
        captured.clone()
    ));
    let sim = sim().await;
    let gw = start(&sim.url(), |r| {
        r.timeouts = Some(RawTimeouts {
            connect: Some("2s".into()),
            first_byte: Some("1s".into()),
            idle: Some("1s".into()),
            total: Some("30s".into()),
        });
    })
    .await;
    let client = reqwest::Client::new();
    let given = "00-5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a-1a2b3c4d5e6f7081-01";
    let prompt = "SECRET-PROMPT-7731 what is the capital of nowhere";
    let mut completion = String::new();
    for _ in 0..2 {
        let r = post(&client, &gw, "log-key-1", chat(false, prompt))
            .header("traceparent", given)
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        let v: serde_json::Value =
            serde_json::from_slice(&r.bytes().await.expect("read the response body"))
                .expect("valid JSON");
        completion = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    }
    // A mismatch and a first-byte timeout log warnings about their keys.
    let r = post(
        &client,
        &gw,
        "log-key-1",
        chat(false, "another SECRET-PROMPT-7731"),
    )
    .header("traceparent", given)
    .send()
    .await
    .expect("send the request");
    assert_eq!(r.status(), 422);
    let r = post(&client, &gw, "log-key-2", chat(false, prompt))
        .header(FAIL_HEADER, "hang")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 504);
    gw.stop().await.expect("stop cleanly");

    let text =
        String::from_utf8(captured.0.lock().expect("lock not poisoned").clone()).expect("UTF-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let about = |key: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["span"]["idempotency_key"] == key)
            .collect()
    };
    let one = about("log-key-1");
    let two = about("log-key-2");
    // executed (stored), mismatch; upstream timeout and the release.
    assert!(one.len() >= 2, "{text}");
    assert!(two.len() >= 2, "{text}");
    for l in &one {
        assert_eq!(
            l["span"]["trace_id"], "5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a",
            "{l}"
        );
    }
    for l in &two {
        let id = l["span"]["trace_id"].as_str().unwrap_or_default();
        assert_eq!(id.len(), 32, "{l}");
        assert_ne!(id, "5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a");
    }
    // The proxy's timeout warning is logged inside the request's span.
    assert!(
        two.iter()
            .any(|l| l["fields"]["message"] == "upstream timeout"),
        "{text}"
    );
    assert!(!completion.is_empty());
    assert!(!text.contains("SECRET-PROMPT-7731"), "{text}");
    assert!(!text.contains(&completion), "{text}");
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    assert!(!text.contains(&tenant));
    assert!(!text.contains("sk-observability"));
}

const ADMIN_TOKEN: &str = "admin-token-for-tests-3b9e";

async fn timeline(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    query: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    timeline_as(client, gw, key, query, token, None).await
}

/// [`timeline`] with a raw credential in `X-Idemgate-Credential`.
async fn timeline_as(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    query: &str,
    token: Option<&str>,
    credential: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut b = client.get(format!("{}/admin/keys/{key}/timeline?{query}", gw.admin));
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    if let Some(c) = credential {
        b = b.header("x-idemgate-credential", c);
    }
    let r = b.send().await.expect("send the request");
    let status = r.status().as_u16();
    let bytes = r.bytes().await.expect("read the response body");
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

fn outcomes(v: &serde_json::Value) -> Vec<String> {
    v["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Without a configured admin token the timeline is off: 403 with a
/// problem saying how to turn it on, whatever the request sends.
#[tokio::test]
async fn timeline_is_disabled_without_an_admin_token() {
    let sim = sim().await;
    let gw = start(&sim.url(), |_| {}).await;
    let client = reqwest::Client::new();
    for token in [None, Some(ADMIN_TOKEN), Some("")] {
        let (status, v) = timeline(&client, &gw, "any-key", "", token).await;
        assert_eq!(status, 403);
        assert_eq!(v["type"], "https://idemgate.dev/problems/admin-disabled");
        assert!(
            v["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("admin_token"),
            "{v}"
        );
    }
    gw.stop().await.expect("stop cleanly");
}

/// With a token configured: 401 without it, with a wrong one, or with
/// another scheme; nothing about the key is revealed.
#[tokio::test]
async fn timeline_refuses_missing_and_wrong_tokens() {
    let sim = sim().await;
    let gw = start_with(&sim.url(), Some(ADMIN_TOKEN), |_| {}).await;
    let client = reqwest::Client::new();
    let r = post(&client, &gw, "tl-secret", chat(false, "hidden"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let wrong = format!("{ADMIN_TOKEN}x");
    for token in [None, Some(wrong.as_str()), Some("admin"), Some("")] {
        let (status, v) = timeline(&client, &gw, "tl-secret", "", token).await;
        assert_eq!(status, 401, "{token:?}");
        assert_eq!(v["type"], "https://idemgate.dev/problems/unauthorized");
        assert!(v.get("attempts").is_none());
    }
    let r = client
        .get(format!("{}/admin/keys/tl-secret/timeline", gw.admin))
        .header("authorization", format!("Basic {ADMIN_TOKEN}"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    gw.stop().await.expect("stop cleanly");
}

/// Execute, replay, mismatch: the timeline lists the three attempts in
/// order with replica, status and latency; the record is DONE with the
/// upstream's status. The tenant is given as an id or as the credential;
/// another tenant sees nothing.
#[tokio::test]
async fn timeline_lists_execute_replay_and_mismatch() {
    let sim = sim().await;
    let gw = start_with(&sim.url(), Some(ADMIN_TOKEN), |_| {}).await;
    let client = reqwest::Client::new();
    let key = "tl-key-1";
    for (body, expected) in [
        (chat(false, "timeline"), 200),
        (chat(false, "timeline"), 200),
        (chat(false, "a different payload"), 422),
    ] {
        let r = post(&client, &gw, key, body)
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), expected);
        let _ = r.bytes().await;
    }
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    // A store may record replays and mismatches in the background (best
    // effort, batched): wait until the third attempt is visible.
    let first = format!("tenant={tenant}&namespace=obs");
    for _ in 0..200 {
        let (_, v) = timeline(&client, &gw, key, &first, Some(ADMIN_TOKEN)).await;
        if outcomes(&v).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for (query, credential) in [
        (first.clone(), None),
        (format!("tenant={tenant}"), None),
        ("namespace=%2Fv1".to_owned(), Some(CREDENTIAL)),
    ] {
        let (status, v) =
            timeline_as(&client, &gw, key, &query, Some(ADMIN_TOKEN), credential).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["key"], key);
        assert_eq!(v["tenant"], tenant.as_str());
        assert_eq!(v["namespace"], "obs");
        assert_eq!(v["state"], "done");
        assert_eq!(v["status"], 200);
        assert_eq!(outcomes(&v), ["executed", "replayed", "mismatch"], "{v}");
        let attempts = v["attempts"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(attempts[0]["status"], 200);
        for a in attempts {
            assert!(!a["replica"].as_str().unwrap_or_default().is_empty(), "{a}");
            assert!(a["latency_us"].is_u64(), "{a}");
            assert!(a["at"].as_str().unwrap_or_default().ends_with('Z'), "{a}");
        }
        // The credential is never echoed.
        assert!(!v.to_string().contains("sk-observability"));
    }
    // Another tenant (here: no credential) has no such key.
    let (status, v) = timeline(&client, &gw, key, "", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
    assert_eq!(v["tenant"], "anonymous");
    assert_eq!(v["state"], "absent");
    assert_eq!(outcomes(&v), Vec::<String>::new());
    // Bad requests: unknown namespace, both tenant forms, a malformed key.
    let (status, v) = timeline(
        &client,
        &gw,
        key,
        &format!("tenant={tenant}&namespace=nope"),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    let (status, _) = timeline_as(
        &client,
        &gw,
        key,
        &format!("tenant={tenant}"),
        Some(ADMIN_TOKEN),
        Some("x"),
    )
    .await;
    assert_eq!(status, 400);
    // A credential in the URL is refused, with the header named.
    let query = format!("credential={}", url_encode(CREDENTIAL));
    let (status, v) = timeline(&client, &gw, key, &query, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("X-Idemgate-Credential"),
        "{v}"
    );
    assert!(!v.to_string().contains("sk-observability"), "{v}");
    let long = "k".repeat(300);
    let (status, _) = timeline(&client, &gw, &long, "", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 400);
    gw.stop().await.expect("stop cleanly");
}

/// A key whose execution is running shows as PENDING.
#[tokio::test]
async fn timeline_shows_a_running_key_as_pending() {
    let sim = sim().await;
    let gw = start_with(&sim.url(), Some(ADMIN_TOKEN), |r| {
        r.timeouts = Some(RawTimeouts {
            connect: Some("2s".into()),
            first_byte: Some("120s".into()),
            idle: Some("120s".into()),
            total: Some("120s".into()),
        });
    })
    .await;
    let client = reqwest::Client::new();
    let slow = tokio::spawn(
        post(&client, &gw, "tl-pending", chat(false, "slow"))
            .header(LATENCY_HEADER, "60000")
            .send(),
    );
    while sim.stats().requests == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, v) = timeline_as(
        &client,
        &gw,
        "tl-pending",
        "",
        Some(ADMIN_TOKEN),
        Some(CREDENTIAL),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["state"], "pending", "{v}");
    assert!(v["lease_expires_at_ms"].is_u64());
    gw.stop().await.expect("stop cleanly");
    let _ = slow.await;
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Only the probes and the scrape endpoint are open; the dashboard page is
/// static (no data), and its data endpoints need the token like every
/// `/admin/` endpoint.
#[tokio::test]
async fn admin_data_endpoints_need_the_token_probes_and_metrics_do_not() {
    let sim = sim().await;
    let client = reqwest::Client::new();
    let gw = start_with(&sim.url(), Some(ADMIN_TOKEN), |_| {}).await;
    for open in ["/healthz", "/readyz", "/metrics", "/"] {
        let r = client
            .get(format!("{}{open}", gw.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{open}");
    }
    let page = client.get(format!("{}/", gw.admin)).send().await.unwrap();
    assert!(!page.text().await.unwrap().contains("requests_total\":"));
    for data in ["/admin/stats", "/admin/recent"] {
        let url = format!("{}{data}", gw.admin);
        let r = client.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 401, "{data}");
        let r = client.get(&url).bearer_auth("wrong").send().await.unwrap();
        assert_eq!(r.status(), 401, "{data}");
        let r = client
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{data}");
        let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        if data == "/admin/stats" {
            assert!(v["requests_total"].is_u64(), "{v}");
            // The alert it mirrors: the shipped rule without `alert_rules`.
            let alert = &v["hit_ratio_alert"];
            assert_eq!(alert["alert"], "IdempotencyHitRatioSurge", "{v}");
            assert_eq!(alert["factor"], 2.0, "{v}");
            assert_eq!(alert["floor"], 0.01, "{v}");
            assert_eq!(alert["source"], "shipped", "{v}");
        } else {
            assert!(
                v["in_flight"].is_array() && v["most_retried"].is_array(),
                "{v}"
            );
            assert_eq!(v["capacity"], 500, "{v}");
        }
    }
    gw.stop().await.expect("stop cleanly");

    // Without a configured token the data endpoints are off, never open.
    let gw = start_with(&sim.url(), None, |_| {}).await;
    for data in ["/admin/stats", "/admin/recent"] {
        let r = client
            .get(format!("{}{data}", gw.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{data}");
    }
    gw.stop().await.expect("stop cleanly");
}
