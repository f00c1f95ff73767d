//! The whole gateway over real listeners: `serve` on 127.0.0.1:0 in front of
//! the simulated LLM upstream on 127.0.0.1:0, driven by an HTTP client.

mod support;

use futures_util::StreamExt;
use idemgate_testkit::http::replayed;
use support::{TestGateway, chat_body, eventually, problem_type};

use std::sync::Arc;
use std::time::Duration;

use idemgate_engine::{Claim, ClientKey, Fingerprint, ScopedKey, Store};
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawInflightMode, RawKeyMode, RawRoute, RawTimeouts};

fn config(store: &str, upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> GatewayConfig {
    TestGateway::builder(upstream)
        .store(store)
        .route(tweak)
        .into_config()
}

fn post(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: Option<&str>,
    body: String,
) -> reqwest::RequestBuilder {
    let mut b = client
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b
}

// --------------------------------------------------------------------------
// The three places a timeout can hit (docs/design.md, "Timeouts").

/// (a) The client times out while the upstream is still generating; the
/// gateway keeps the call going; the retry gets its result. One execution.
#[tokio::test]
async fn a_client_timeout_during_generation_then_retry_replays() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |_| {})).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("build the client");
    let body = chat_body(false, "timeout position a");
    let first = post(&impatient, &gw, Some("position-a"), body.clone())
        .header("x-sim-latency-ms", "800")
        .send()
        .await;
    assert!(
        first.is_err_and(|e| e.is_timeout()),
        "the client must time out"
    );

    // The retry arrives while the generation is still running: it waits
    // for it instead of paying again.
    let client = reqwest::Client::new();
    let retry = post(&client, &gw, Some("position-a"), body.clone())
        .header("x-sim-latency-ms", "800")
        .send()
        .await
        .expect("send the request");
    assert_eq!(retry.status(), 200);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    let text = retry.text().await.expect("read the response body");
    assert!(text.contains("chat.completion"), "{text}");
    assert_eq!(sim.executions_for("position-a"), 1);
    gw.stop().await.expect("stop cleanly");
}

/// (b) The client times out; the upstream answers afterwards and the gateway
/// stores it; the retry arrives after that and is a replay. One execution.
#[tokio::test]
async fn a_client_timeout_then_upstream_answers_then_retry_replays() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |_| {})).await;
    // The client's timeout must fire after the request reached the upstream
    // (even on a loaded machine) and before the upstream answers.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(1000))
        .build()
        .expect("build the client");
    let body = chat_body(false, "timeout position b");
    let first = post(&impatient, &gw, Some("position-b"), body.clone())
        .header("x-sim-latency-ms", "2500")
        .send()
        .await;
    assert!(first.is_err_and(|e| e.is_timeout()));
    let stats = sim.stats_handle();
    eventually("the upstream finished the abandoned call", || {
        stats.snapshot().completed >= 1
    })
    .await;
    // The upstream has answered; the gateway stores what it got.
    let client = reqwest::Client::new();
    let mut last = None;
    for _ in 0..100 {
        let r = post(&client, &gw, Some("position-b"), body.clone())
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        last = replayed(&r);
        if last.as_deref() == Some("true") {
            break;
        }
    }
    assert_eq!(last.as_deref(), Some("true"));
    assert_eq!(sim.executions_for("position-b"), 1);
    gw.stop().await.expect("stop cleanly");
}

/// (c) The answer is lost on its way to the client (the client drops the
/// connection as the response arrives); the retry replays it. One execution.
#[tokio::test]
async fn an_answer_lost_to_the_client_is_replayed_on_retry() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |_| {})).await;
    let body = chat_body(false, "timeout position c");
    {
        let client = reqwest::Client::new();
        let resp = post(&client, &gw, Some("position-c"), body.clone())
            .send()
            .await
            .expect("send the request");
        assert_eq!(resp.status(), 200);
        // Headers arrived; the body is never read and the connection goes.
        drop(resp);
        drop(client);
    }
    let client = reqwest::Client::new();
    let retry = post(&client, &gw, Some("position-c"), body.clone())
        .send()
        .await
        .expect("send the request");
    assert_eq!(retry.status(), 200);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    assert_eq!(sim.executions_for("position-c"), 1);

    // The streaming form: the client leaves after the first event.
    let sbody = chat_body(true, "timeout position c, streaming");
    {
        let client = reqwest::Client::new();
        let resp = post(&client, &gw, Some("position-c-sse"), sbody.clone())
            .header("x-sim-token-interval-ms", "20")
            .send()
            .await
            .expect("send the request");
        let mut s = resp.bytes_stream();
        let _ = s.next().await;
    }
    let stats = sim.stats_handle();
    eventually("the abandoned stream finished upstream", || {
        stats.snapshot().completed >= 2
    })
    .await;
    let mut full = None;
    for _ in 0..100 {
        let r = post(&client, &gw, Some("position-c-sse"), sbody.clone())
            .send()
            .await
            .expect("send the request");
        if replayed(&r).as_deref() == Some("true") {
            full = Some(r.text().await.expect("read the response body"));
            break;
        }
    }
    let full = full.unwrap_or_else(|| panic!("no replay of the abandoned stream"));
    assert!(full.contains("data: [DONE]"), "whole stream stored: {full}");
    assert_eq!(sim.executions_for("position-c-sse"), 1);
    gw.stop().await.expect("stop cleanly");
}

// --------------------------------------------------------------------------
// Concurrent duplicates.

async fn duplicates(mode: RawInflightMode, stream: bool, n: usize, iterations: usize) {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.on_inflight = Some(mode);
    }))
    .await;
    let client = reqwest::Client::new();
    for it in 0..iterations {
        let key = format!("dup-{mode:?}-{stream}-{it}");
        let body = chat_body(stream, &format!("duplicate question {it}"));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let req = post(&client, &gw, Some(&key), body.clone())
                .header("x-sim-latency-ms", "300")
                .header("x-sim-first-token-ms", "100")
                .header("x-sim-token-interval-ms", "10");
            tasks.push(tokio::spawn(async move {
                let r = req.send().await.expect("send the request");
                let status = r.status().as_u16();
                let rep = replayed(&r);
                let text = r.text().await.expect("read the response body");
                (status, rep, text)
            }));
        }
        let mut fresh = 0;
        let mut ok_bodies = Vec::new();
        for t in tasks {
            let (status, rep, text) = t.await.expect("it succeeds");
            match status {
                200 => {
                    if rep.as_deref() == Some("false") {
                        fresh += 1;
                    }
                    ok_bodies.push(text);
                }
                409 if mode == RawInflightMode::Reject => {
                    assert!(text.contains("in-flight"), "{text}");
                }
                other => panic!("{mode:?}: unexpected status {other}: {text}"),
            }
        }
        assert_eq!(fresh, 1, "{mode:?}: exactly one fresh response");
        if mode != RawInflightMode::Reject {
            assert_eq!(
                ok_bodies.len(),
                n,
                "{mode:?}: every duplicate got the result"
            );
        }
        let first = &ok_bodies[0];
        if stream {
            // Each got the whole stream, ids included.
            for b in &ok_bodies {
                assert!(b.contains("data: [DONE]"), "{mode:?}: {b}");
                assert_eq!(b, first, "{mode:?}: identical streams");
            }
        } else {
            for b in &ok_bodies {
                assert_eq!(b, first, "{mode:?}: identical answers");
            }
        }
        assert_eq!(
            sim.executions_for(&key),
            1,
            "{mode:?}: one upstream execution"
        );
    }
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_reject_execute_once() {
    duplicates(RawInflightMode::Reject, false, 32, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_wait_execute_once() {
    duplicates(RawInflightMode::Wait, false, 32, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_attach_execute_once() {
    duplicates(RawInflightMode::Attach, false, 32, 2).await;
    duplicates(RawInflightMode::Attach, true, 32, 2).await;
}

// --------------------------------------------------------------------------
// Streams, failures, scoping, refusals.

/// Splits an SSE transcript into events (blank-line separated).
fn events(text: &str) -> Vec<String> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// The number of an event (its id is `RUN-N`).
fn event_id(event: &str) -> Option<u64> {
    event_run_id(event).map(|(_, n)| n)
}

/// The run and number of an event.
fn event_run_id(event: &str) -> Option<(String, u64)> {
    let id = event.lines().find_map(|l| l.strip_prefix("id:"))?.trim();
    let (run, n) = id.split_once('-')?;
    Some((run.to_owned(), n.parse().ok()?))
}

#[tokio::test]
async fn a_dropped_stream_resumes_after_last_event_id() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.on_inflight = Some(RawInflightMode::Attach);
    }))
    .await;
    let body = chat_body(true, "a stream that breaks on the client side");
    let k = 3u64;
    // Read k events, then go away.
    let mut seen = String::new();
    {
        let client = reqwest::Client::new();
        let resp = post(&client, &gw, Some("sse-resume"), body.clone())
            .header("x-sim-token-interval-ms", "30")
            .header("x-sim-tokens", "12")
            .send()
            .await
            .expect("send the request");
        assert_eq!(resp.status(), 200);
        let mut s = resp.bytes_stream();
        while events(&seen).len() < k as usize || !seen.replace("\r\n", "\n").ends_with("\n\n") {
            match s.next().await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                other => panic!("stream ended early: {other:?}"),
            }
        }
    }
    let got = events(&seen);
    let last_id = got.iter().filter_map(|e| event_id(e)).max().unwrap_or(0);
    assert!(last_id >= k, "ids are sequential from 1: {got:?}");
    let (run, _) = got
        .iter()
        .find_map(|e| event_run_id(e))
        .expect("events name their run");

    // The retry resumes after the last event seen: live or replayed, it
    // never sends the first part again.
    let client = reqwest::Client::new();
    let rest = post(&client, &gw, Some("sse-resume"), body.clone())
        .header("last-event-id", format!("{run}-{last_id}"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(rest.status(), 200);
    let rest = events(&rest.text().await.expect("read the response body"));
    let rest_ids: Vec<u64> = rest.iter().filter_map(|e| event_id(e)).collect();
    assert_eq!(rest_ids.first(), Some(&(last_id + 1)), "{rest:?}");
    assert!(rest.iter().any(|e| e.contains("[DONE]")));

    // Seen part + resumed part = the whole stored stream.
    let whole = post(&client, &gw, Some("sse-resume"), body.clone())
        .send()
        .await
        .expect("send the request");
    assert_eq!(replayed(&whole).as_deref(), Some("true"));
    let whole = events(&whole.text().await.expect("read the response body"));
    let mut joined: Vec<String> = got
        .iter()
        .filter(|e| event_id(e).is_some_and(|i| i <= last_id))
        .cloned()
        .collect();
    joined.extend(rest);
    assert_eq!(joined, whole);
    assert_eq!(sim.executions_for("sse-resume"), 1);
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn a_5xx_releases_the_key_and_the_retry_executes_again() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |_| {})).await;
    let client = reqwest::Client::new();
    let body = chat_body(false, "fails once");
    let r = post(&client, &gw, Some("five-hundred"), body.clone())
        .header("x-sim-fail", "500")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 500);
    let r = post(&client, &gw, Some("five-hundred"), body.clone())
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    assert_eq!(replayed(&r).as_deref(), Some("false"));
    assert_eq!(sim.executions_for("five-hundred"), 2, "the retry ran again");
    let r = post(&client, &gw, Some("five-hundred"), body)
        .send()
        .await
        .expect("send the request");
    assert_eq!(replayed(&r).as_deref(), Some("true"));
    assert_eq!(sim.executions_for("five-hundred"), 2);

    // A non-retryable 4xx is final: stored and replayed.
    let body = chat_body(false, "invalid once");
    for attempt in 0..2 {
        let r = post(&client, &gw, Some("four-hundred"), body.clone())
            .header("x-sim-fail", "400")
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 400);
        assert_eq!(
            replayed(&r).as_deref(),
            Some(if attempt == 0 { "false" } else { "true" })
        );
    }
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn upstream_unreachable_and_first_byte_timeout_release_the_key() {
    let (closed, dead) = idemgate_gateway::test_util::loopback().await;
    drop(closed);
    let gw = TestGateway::start(config("memory:", &dead, |r| {
        r.on_inflight = Some(RawInflightMode::Reject);
    }))
    .await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let r = post(&client, &gw, Some("unreachable"), chat_body(false, "x"))
            .send()
            .await
            .expect("send the request");
        // Never a 409 or a replay: the failed attempt gave the key back.
        assert_eq!(r.status(), 502);
        assert_eq!(
            problem_type(r).await,
            "https://idemgate.dev/problems/upstream-unavailable"
        );
    }
    gw.stop().await.expect("stop cleanly");

    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.on_inflight = Some(RawInflightMode::Reject);
        r.retryable_statuses = Some(vec![]);
        r.timeouts = Some(RawTimeouts {
            first_byte: Some("300ms".into()),
            ..RawTimeouts::default()
        });
    }))
    .await;
    let body = chat_body(false, "hangs once");
    let r = post(&client, &gw, Some("hang-then-ok"), body.clone())
        .header("x-sim-fail", "hang")
        .send()
        .await
        .expect("send the request");
    // Released by the marker even though no status is configured retryable.
    assert_eq!(r.status(), 504);
    let r = post(&client, &gw, Some("hang-then-ok"), body)
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    assert_eq!(replayed(&r).as_deref(), Some("false"));
    assert_eq!(sim.executions_for("hang-then-ok"), 2);
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn tenants_never_share_records() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |_| {})).await;
    let client = reqwest::Client::new();
    let body = chat_body(false, "same key, two tenants");
    let mut texts = Vec::new();
    for tenant in ["Bearer sk-alice", "Bearer sk-bob"] {
        let r = post(&client, &gw, Some("shared-key"), body.clone())
            .header("authorization", tenant)
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        assert_eq!(replayed(&r).as_deref(), Some("false"), "{tenant}");
        texts.push(r.text().await.expect("read the response body"));
    }
    assert_ne!(texts[0], texts[1], "two executions, two ids");
    assert_eq!(sim.executions_for("shared-key"), 2);
    let r = post(&client, &gw, Some("shared-key"), body)
        .header("authorization", "Bearer sk-alice")
        .send()
        .await
        .expect("send the request");
    assert_eq!(replayed(&r).as_deref(), Some("true"));
    assert_eq!(r.text().await.expect("read the response body"), texts[0]);
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn malformed_and_missing_keys_are_refused_before_the_upstream() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.key = Some(RawKeyMode::Require);
    }))
    .await;
    let client = reqwest::Client::new();
    let long = "k".repeat(256);
    let bad: [&[u8]; 5] = [
        b"",
        long.as_bytes(),
        b"tab\there",
        b"\"unterminated",
        b"caf\xc3\xa9",
    ];
    for key in bad {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(key).expect("a valid value"),
            )
            .body(chat_body(false, "x"))
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 400, "key {:?}", String::from_utf8_lossy(key));
        assert_eq!(
            problem_type(r).await,
            "https://idemgate.dev/problems/malformed-key"
        );
    }
    let r = post(&client, &gw, None, chat_body(false, "x"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 400);
    assert_eq!(
        problem_type(r).await,
        "https://idemgate.dev/problems/missing-key"
    );
    // A key in quoted sf-string form is the same key as the bare token.
    let body = chat_body(false, "quoted and bare");
    let r = post(&client, &gw, Some("\"same-key\""), body.clone())
        .send()
        .await
        .expect("send the request");
    assert_eq!(replayed(&r).as_deref(), Some("false"));
    let r = post(&client, &gw, Some("same-key"), body)
        .send()
        .await
        .expect("send the request");
    assert_eq!(replayed(&r).as_deref(), Some("true"));
    assert_eq!(
        sim.stats().requests,
        1,
        "only the valid request was forwarded"
    );
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn an_oversized_body_is_413_and_no_route_is_404() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.body_limit = Some(idemgate_gateway::config::RawSize::Text("1KiB".into()));
    }))
    .await;
    let client = reqwest::Client::new();
    let r = post(
        &client,
        &gw,
        Some("big"),
        chat_body(false, &"word ".repeat(400)),
    )
    .send()
    .await
    .expect("send the request");
    assert_eq!(r.status(), 413);
    assert_eq!(
        problem_type(r).await,
        "https://idemgate.dev/problems/body-too-large"
    );
    let r = client
        .post(format!("{}/elsewhere", gw.base))
        .body("{}")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 404);
    assert_eq!(
        problem_type(r).await,
        "https://idemgate.dev/problems/no-route"
    );
    assert_eq!(sim.stats().requests, 0);
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn admin_endpoints_report_health_readiness_and_metrics() {
    idemgate_gateway::telemetry::install_prometheus().expect("install the recorder");
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.id = Some("metrics-route".into());
    }))
    .await;
    let client = reqwest::Client::new();
    let r = post(&client, &gw, Some("metered"), chat_body(false, "count me"))
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let text = client
        .get(format!("{}/metrics", gw.admin))
        .send()
        .await
        .expect("send the request")
        .text()
        .await
        .expect("read the response body");
    for (name, phase) in [
        ("idemgate_upstream_queue_seconds_bucket", ""),
        (
            "idemgate_upstream_phase_seconds_bucket",
            "phase=\"first_byte\"",
        ),
        ("idemgate_upstream_phase_seconds_bucket", "phase=\"total\""),
        (
            "idemgate_upstream_phase_seconds_bucket",
            "phase=\"connect\"",
        ),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)
                && l.contains("route=\"metrics-route\"")
                && l.contains(phase)),
            "{name} {phase} missing:\n{text}"
        );
    }
    assert!(!text.contains("metered"), "no key in labels");
    for path in ["/healthz", "/readyz"] {
        let r = client
            .get(format!("{}{path}", gw.admin))
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200, "{path}");
    }
    gw.stop().await.expect("stop cleanly");
}

/// Shutdown with calls still running: after the grace period they are
/// cancelled and their keys released, so a new process on the same store
/// can claim them at once (the lease here is an hour long: only a release
/// frees the key).
#[tokio::test]
async fn graceful_shutdown_leaves_no_pending_record() {
    let sim = support::sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    let db = dir.path().join("gw.db");
    let mut cfg = config(&format!("sqlite:{}", db.display()), &sim.url(), |r| {
        r.pending_ttl = Some("1h".into());
        r.timeouts = Some(RawTimeouts {
            first_byte: Some("60s".into()),
            idle: Some("60s".into()),
            total: Some("120s".into()),
            ..RawTimeouts::default()
        });
    });
    cfg.shutdown_grace = Duration::from_millis(300);
    let route_id = cfg.routes[0].id.clone();
    let gw = TestGateway::start(cfg).await;
    let client = reqwest::Client::new();
    let keys = ["sd-json", "sd-stream"];
    let mut inflight = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let req = post(&client, &gw, Some(key), chat_body(i == 1, "never finishes"))
            .header("x-sim-latency-ms", "60000")
            .header("x-sim-first-token-ms", "10")
            .header("x-sim-token-interval-ms", "1000")
            .header("x-sim-tokens", "60");
        inflight.push(tokio::spawn(async move {
            if let Ok(r) = req.send().await {
                let _ = r.bytes().await;
            }
        }));
    }
    let stats = sim.stats_handle();
    eventually("both calls reached the upstream", || {
        stats.snapshot().executions >= 2
    })
    .await;
    gw.stop().await.expect("stop cleanly");
    for t in inflight {
        let _ = t.await;
    }

    let store: Arc<dyn Store> =
        Arc::new(idemgate_sqlite::SqliteStore::open(&db).expect("open the store"));
    for key in keys {
        let scoped = ScopedKey::new(
            "anonymous",
            route_id.clone(),
            ClientKey::parse(key).expect("a valid literal"),
        );
        assert!(
            store.get(&scoped).await.expect("GET").is_none(),
            "{key}: no record left behind"
        );
        let claim = store
            .claim(
                &scoped,
                &Fingerprint::of_request("POST", "/x", b"{}", &[]),
                Duration::from_secs(30),
            )
            .await
            .expect("claim");
        assert!(matches!(claim, Claim::Acquired(_)), "{key}: {claim:?}");
    }
}

#[tokio::test]
async fn derived_keys_merge_retries_of_one_user_and_session_only() {
    let sim = support::sim().await;
    let gw = TestGateway::start(config("memory:", &sim.url(), |r| {
        r.key = Some(RawKeyMode::Derive);
        r.key_template = Some(vec![
            "tenant".into(),
            "header:x-user-id".into(),
            "header:x-session-id".into(),
            "body".into(),
        ]);
        r.key_window = Some("10m".into());
    }))
    .await;
    let client = reqwest::Client::new();
    let body = chat_body(false, "no key sent, one derived");
    let send = |user: &str| {
        post(&client, &gw, None, body.clone())
            .header("x-user-id", user)
            .header("x-session-id", "s-1")
            .send()
    };
    let a = send("u-1").await.expect("send the request");
    assert_eq!(replayed(&a).as_deref(), Some("false"));
    let b = send("u-1").await.expect("send the request");
    assert_eq!(
        replayed(&b).as_deref(),
        Some("true"),
        "same user, session, body"
    );
    let c = send("u-2").await.expect("send the request");
    assert_eq!(
        replayed(&c).as_deref(),
        Some("false"),
        "another user: another key"
    );
    assert_eq!(sim.stats().executions, 2);
    // A missing dimension is refused, not guessed.
    let r = post(&client, &gw, None, body.clone())
        .header("x-user-id", "u-1")
        .send()
        .await
        .expect("send the request");
    assert_eq!(r.status(), 400);
    assert_eq!(sim.stats().requests, 2);
    gw.stop().await.expect("stop cleanly");
}
