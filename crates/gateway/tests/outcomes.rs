//! The upstream's budget and its unknown outcomes, through the whole stack
//! (`serve` on 127.0.0.1:0 in front of the simulated LLM, or a raw TCP
//! upstream that cuts the connection):
//!
//! - time queued behind the route's concurrency limit never eats the
//!   upstream's budget, and the queue has its own bound (`queue_timeout`:
//!   503 `upstream-busy`, nothing sent, key released);
//! - a failure after the request was sent (first-byte timeout, connection
//!   cut) is stored as a final `outcome-unknown` answer on a charging route,
//!   cleared by an operator (`DELETE /admin/keys/{key}`), and released (and
//!   counted) on any other route.

mod support;

use idemgate_testkit::http::replayed;
use support::{TestGateway, eventually, problem_type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use idemgate_gateway::config::{RawInflightMode, RawKeyMode, RawRoute, RawTimeouts};

const TOKEN: &str = "admin-secret";

/// A gateway on the memory store with an admin token, one `/v1` route
/// (key required, reject) in front of `upstream`.
async fn start(upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> TestGateway {
    TestGateway::builder(upstream)
        .store("memory:")
        .route(|r| {
            r.key = Some(RawKeyMode::Require);
            r.on_inflight = Some(RawInflightMode::Reject);
            tweak(r);
        })
        .config(|c| c.admin_token = Some(TOKEN.into()))
        .start()
        .await
}

fn post(gw: &TestGateway, key: &str, text: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(chat_body(text))
}

/// The key's timeline once it holds `entries` entries: replays are
/// gathered and written in the background, so they land a moment later.
async fn timeline(gw: &TestGateway, key: &str, entries: usize) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        let r = reqwest::Client::new()
            .get(format!("{}/admin/keys/{key}/timeline", gw.admin))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("ask for the timeline");
        assert_eq!(r.status(), 200);
        let bytes = r.bytes().await.expect("read the timeline");
        last = serde_json::from_slice(&bytes).expect("a JSON timeline");
        if last["attempts"]
            .as_array()
            .is_some_and(|a| a.len() >= entries)
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    last
}

async fn forget(gw: &TestGateway, key: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new().delete(format!("{}/admin/keys/{key}", gw.admin));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("ask to forget the key")
}

fn chat_body(text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

/// The value of the first sample of `name` whose labels contain `label`.
fn sample(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .next()
        .unwrap_or(0.0)
}

fn outcomes(timeline: &serde_json::Value) -> Vec<String> {
    timeline["attempts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["outcome"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

// --------------------------------------------------------------------------
// The queue.

/// A (2.8 s upstream) holds the only slot; B arrives while A runs and needs
/// 2 s. B's budget (total 3 s) starts when B is sent, after A frees the
/// slot, for the layer as for the proxy: B is not cut, and runs once.
#[tokio::test]
async fn time_in_the_queue_never_eats_the_upstream_budget() {
    let sim = support::sim().await;
    let gw = start(&sim.url(), |r| {
        r.concurrency_limit = Some(1);
        r.timeouts = Some(RawTimeouts {
            connect: Some("1s".into()),
            first_byte: Some("3s".into()),
            idle: Some("3s".into()),
            total: Some("3s".into()),
        });
    })
    .await;
    let a = tokio::spawn(
        post(&gw, "queue-a", "the long one")
            .header("x-sim-latency-ms", "2800")
            .send(),
    );
    eventually("A reached the upstream", || {
        sim.executions_for("queue-a") == 1
    })
    .await;
    let b = post(&gw, "queue-b", "queued behind it")
        .header("x-sim-latency-ms", "2000")
        .send()
        .await
        .expect("send B");
    assert_eq!(b.status(), 200, "B was cut for time it spent queued");
    assert_eq!(replayed(&b).as_deref(), Some("false"));
    let a = a.await.expect("join A").expect("send A");
    assert_eq!(a.status(), 200);

    // B's key is DONE: its retry is a replay, not a second execution.
    let retry = post(&gw, "queue-b", "queued behind it")
        .send()
        .await
        .expect("send B's retry");
    assert_eq!(retry.status(), 200);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    assert_eq!(sim.executions_for("queue-b"), 1);
    assert_eq!(sim.executions_for("queue-a"), 1);
    gw.stop().await.expect("stop cleanly");
}

/// With a tiny `queue_timeout`, B waits for the slot in vain: 503
/// `upstream-busy` with `Retry-After`, nothing reaches the upstream, the
/// queue timeout is counted, and B's key is free: its retry runs once.
#[tokio::test]
async fn a_queue_timeout_answers_busy_sends_nothing_and_releases_the_key() {
    let sim = support::sim().await;
    let gw = start(&sim.url(), |r| {
        r.concurrency_limit = Some(1);
        r.queue_timeout = Some("100ms".into());
    })
    .await;
    let a = tokio::spawn(
        post(&gw, "busy-a", "holds the slot")
            .header("x-sim-latency-ms", "1500")
            .send(),
    );
    eventually("A reached the upstream", || {
        sim.executions_for("busy-a") == 1
    })
    .await;
    let b = post(&gw, "busy-b", "finds no slot")
        .send()
        .await
        .expect("send B");
    assert_eq!(b.status(), 503);
    assert!(b.headers().contains_key("retry-after"));
    assert_eq!(
        b.headers()
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(
        problem_type(b).await,
        "https://idemgate.dev/problems/upstream-busy"
    );
    assert_eq!(sim.executions_for("busy-b"), 0, "nothing may be sent");
    let m = support::metrics(&gw, &reqwest::Client::new()).await;
    assert!(
        sample(&m, "idemgate_upstream_timeouts_total", "phase=\"queue\"") >= 1.0,
        "{m}"
    );

    let a = a.await.expect("join A").expect("send A");
    assert_eq!(a.status(), 200);
    let retry = post(&gw, "busy-b", "finds no slot")
        .send()
        .await
        .expect("send B's retry");
    assert_eq!(retry.status(), 200);
    assert_eq!(replayed(&retry).as_deref(), Some("false"));
    assert_eq!(sim.executions_for("busy-b"), 1);
    gw.stop().await.expect("stop cleanly");
}

// --------------------------------------------------------------------------
// Outcome unknown.

fn short_first_byte(r: &mut RawRoute) {
    r.timeouts = Some(RawTimeouts {
        connect: Some("1s".into()),
        first_byte: Some("300ms".into()),
        idle: Some("5s".into()),
        total: Some("20s".into()),
    });
}

/// Charging route, first-byte timeout after the request reached the
/// upstream: 504 `outcome-unknown`, stored; the retry gets it replayed and
/// nothing runs again; the timeline says why.
#[tokio::test]
async fn a_charging_route_keeps_a_first_byte_timeout_as_outcome_unknown() {
    let sim = support::sim().await;
    let gw = start(&sim.url(), |r| {
        r.charges = Some(true);
        short_first_byte(r);
    })
    .await;
    let first = post(&gw, "charge-hang", "charge the card")
        .header("x-sim-fail", "hang")
        .send()
        .await
        .expect("send the request");
    assert_eq!(first.status(), 504);
    assert_eq!(replayed(&first).as_deref(), Some("false"));
    assert!(!first.headers().contains_key("retry-after"));
    assert_eq!(
        problem_type(first).await,
        "https://idemgate.dev/problems/outcome-unknown"
    );

    // The retry would be answered at once if it ran: it must not run.
    let retry = post(&gw, "charge-hang", "charge the card")
        .send()
        .await
        .expect("send the retry");
    assert_eq!(retry.status(), 504);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    assert_eq!(
        problem_type(retry).await,
        "https://idemgate.dev/problems/outcome-unknown"
    );
    assert_eq!(sim.executions_for("charge-hang"), 1);

    let t = timeline(&gw, "charge-hang", 2).await;
    assert_eq!(t["state"], "done");
    assert_eq!(t["status"], 504);
    assert_eq!(outcomes(&t), ["outcome_unknown", "replayed"]);
    let m = support::metrics(&gw, &reqwest::Client::new()).await;
    assert!(
        sample(&m, "idempotency_outcome_unknown_total", "") >= 1.0,
        "{m}"
    );

    // Only an operator clears it, with the admin token.
    assert_eq!(forget(&gw, "charge-hang", None).await.status(), 401);
    assert_eq!(
        forget(&gw, "charge-hang", Some("wrong")).await.status(),
        401
    );
    assert_eq!(sim.executions_for("charge-hang"), 1);
    let forgot = forget(&gw, "charge-hang", Some(TOKEN)).await;
    assert_eq!(forgot.status(), 200);
    let again = post(&gw, "charge-hang", "charge the card")
        .send()
        .await
        .expect("send the retry after forget");
    assert_eq!(again.status(), 200);
    assert_eq!(replayed(&again).as_deref(), Some("false"));
    assert_eq!(sim.executions_for("charge-hang"), 2);
    let t = timeline(&gw, "charge-hang", 4).await;
    assert_eq!(
        outcomes(&t),
        ["outcome_unknown", "replayed", "forgotten", "executed"]
    );

    // Nothing to forget: 404, and the bad key is refused.
    let missing = forget(&gw, "never-sent", Some(TOKEN)).await;
    assert_eq!(missing.status(), 404);
    assert_eq!(
        problem_type(missing).await,
        "https://idemgate.dev/problems/key-not-found"
    );
    assert_eq!(forget(&gw, "bad%01key", Some(TOKEN)).await.status(), 400);
    gw.stop().await.expect("stop cleanly");
}

/// Any other route: the first-byte timeout releases the key (the retry
/// runs again) and is counted as an unknown outcome.
#[tokio::test]
async fn other_routes_release_an_unknown_outcome_and_count_it() {
    let sim = support::sim().await;
    let gw = start(&sim.url(), short_first_byte).await;
    let before = support::metrics(&gw, &reqwest::Client::new()).await;
    let first = post(&gw, "plain-hang", "just a chat")
        .header("x-sim-fail", "hang")
        .send()
        .await
        .expect("send the request");
    assert_eq!(first.status(), 504);
    assert_eq!(
        problem_type(first).await,
        "https://idemgate.dev/problems/upstream-timeout"
    );
    let m = support::metrics(&gw, &reqwest::Client::new()).await;
    let counted = |m: &str| sample(m, "idempotency_outcome_unknown_total", "");
    assert_eq!(counted(&m), counted(&before) + 1.0, "{m}");
    assert!(
        m.contains("# HELP idempotency_outcome_unknown_total"),
        "{m}"
    );
    let released = |m: &str| {
        sample(
            m,
            "idempotency_released_total",
            "reason=\"outcome_unknown\"",
        )
    };
    assert_eq!(released(&m), released(&before) + 1.0, "{m}");

    let retry = post(&gw, "plain-hang", "just a chat")
        .send()
        .await
        .expect("send the retry");
    assert_eq!(retry.status(), 200);
    assert_eq!(replayed(&retry).as_deref(), Some("false"));
    assert_eq!(sim.executions_for("plain-hang"), 2);
    gw.stop().await.expect("stop cleanly");
}

/// An upstream that reads the whole request, writes `reply` (nothing, or
/// the start of a response) and closes the connection (a load balancer
/// reclaiming it): it may have run. Returns its URL and how many requests
/// it has read.
async fn cutting_upstream(
    reply: &'static [u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (listener, url) = idemgate_gateway::test_util::loopback().await;
    let read = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&read);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let counter = std::sync::Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then a body of the announced length.
                loop {
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = sock.write_all(reply).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (url, read)
}

/// A connection cut after the request was read: 502 `outcome-unknown` on a
/// charging route, stored; the retry is a replay and never reaches the
/// upstream.
#[tokio::test]
async fn a_charging_route_keeps_a_cut_connection_as_outcome_unknown() {
    use std::sync::atomic::Ordering;
    let (url, read) = cutting_upstream(b"").await;
    let gw = start(&url, |r| r.charges = Some(true)).await;
    let first = post(&gw, "charge-cut", "charge the card")
        .send()
        .await
        .expect("send the request");
    assert_eq!(first.status(), 502);
    assert_eq!(
        problem_type(first).await,
        "https://idemgate.dev/problems/outcome-unknown"
    );
    let retry = post(&gw, "charge-cut", "charge the card")
        .send()
        .await
        .expect("send the retry");
    assert_eq!(retry.status(), 502);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    assert_eq!(read.load(Ordering::SeqCst), 1);
    gw.stop().await.expect("stop cleanly");
}

/// The upstream answers 200 and breaks mid-body: it ran. A charging route
/// keeps 502 `outcome-unknown` (the timeline says so, with that status);
/// the retry is a replay and never reaches the upstream.
#[tokio::test]
async fn a_charging_route_keeps_a_body_cut_as_outcome_unknown() {
    use std::sync::atomic::Ordering;
    let (url, read) = cutting_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\":",
    )
    .await;
    let gw = start(&url, |r| r.charges = Some(true)).await;
    let first = post(&gw, "charge-body-cut", "charge the card")
        .send()
        .await
        .expect("send the request");
    assert_eq!(first.status(), 502);
    assert_eq!(
        problem_type(first).await,
        "https://idemgate.dev/problems/outcome-unknown"
    );
    let retry = post(&gw, "charge-body-cut", "charge the card")
        .send()
        .await
        .expect("send the retry");
    assert_eq!(retry.status(), 502);
    assert_eq!(replayed(&retry).as_deref(), Some("true"));
    assert_eq!(read.load(Ordering::SeqCst), 1);
    let t = timeline(&gw, "charge-body-cut", 2).await;
    assert_eq!(outcomes(&t), ["outcome_unknown", "replayed"]);
    assert_eq!(t["attempts"][0]["status"], 502);
    gw.stop().await.expect("stop cleanly");
}
