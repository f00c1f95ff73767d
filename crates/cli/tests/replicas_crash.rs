//! A replica that dies or stops: one killed with SIGKILL mid-generation
//! leaves its key claimable after `pending_ttl`, and the retry on the other
//! process runs the work once more (the documented at-least-once window
//! after a crash), a follower of its live stream sees the stream break;
//! one paused with SIGSTOP past its lease is taken over, and, resumed, is
//! fenced and cannot overwrite; its client is told `lease-lost`.
//!
//! Real `idemgate serve` processes share Redis or PostgreSQL in front of
//! the simulated LLM upstream; the shared helpers are in
//! `support/replicas.rs`. The shared servers (Redis 127.0.0.1:6379 under a
//! random key prefix, PostgreSQL db `test` under a random schema) are never
//! restarted. Under `CI=true` a missing server fails the suite; it never
//! skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use idemgate_llm_sim::SimHandle;
use support::replicas::*;

/// Waits until the simulator has started `n` executions of `key`.
async fn executions_reach(sim: &SimHandle, key: &str, n: u64) {
    for _ in 0..200 {
        if sim.executions_for(key) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{key} never reached {n} executions");
}

/// Two replicas on one store in front of a fresh simulator, a client, and
/// the test's key with its JSON body.
struct Interrupted {
    sim: SimHandle,
    a: Gw,
    b: Gw,
    client: reqwest::Client,
    key: String,
    body: String,
}

impl Interrupted {
    /// The test's request (tenant `t1`, the key and its body) to `gw`'s
    /// `route`.
    fn to(&self, gw: &Gw, route: &str) -> reqwest::RequestBuilder {
        request(
            &self.client,
            &gw.url(route),
            "t1",
            &self.key,
            self.body.clone(),
        )
    }

    /// Sends the request to `b`'s `route` and asserts `b` ran the key
    /// anew: 200, not a replay, the upstream's second execution.
    async fn runs_again_on_b(&self, route: &str) -> Answer {
        let answer = send(self.to(&self.b, route)).await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(answer.replayed.as_deref(), Some("false"));
        assert_eq!(
            self.sim.executions_for(&self.key),
            2,
            "at-least-once after a crash: the work ran again"
        );
        answer
    }
}

/// Starts two replicas on `store` (`pending_ttl` `ttl`) and sends a JSON
/// request for `key` to `a`'s `route`, the upstream taking `latency_ms` to
/// answer; once the upstream has started it, sends `a` the `signal`.
/// Returns the replicas and that first request.
async fn interrupted(
    store: &str,
    ttl: &str,
    key: String,
    route: &str,
    latency_ms: &str,
    signal: &str,
) -> (
    Interrupted,
    tokio::task::JoinHandle<Result<Answer, reqwest::Error>>,
) {
    let sim = sim().await;
    let a = Gw::start(store, &sim.url(), ttl).await;
    let b = Gw::start(store, &sim.url(), ttl).await;
    let client = client();
    let body = chat(false, &key);
    let req = request(&client, &a.url(route), "t1", &key, body.clone());
    let first = tokio::spawn(send_result(req.header("x-sim-latency-ms", latency_ms)));
    executions_reach(&sim, &key, 1).await;
    a.signal(signal).await;
    let s = Interrupted {
        sim,
        a,
        b,
        client,
        key,
        body,
    };
    (s, first)
}

/// A replica killed mid-generation: the retry on the other replica waits
/// for the dead owner's lease to lapse, then runs the work once more.
async fn killed_mid_generation(store: &str) {
    let key = format!("{}-killed", tag());
    let (s, first) = interrupted(store, "2s", key, "attach", "5000", "KILL").await;
    assert!(
        first.await.unwrap().is_err(),
        "the killed replica's client gets no answer"
    );
    // Sent at once: the key is PENDING under the dead owner's lease; the
    // duplicate waits (attach = wait for a JSON response), sees the lease
    // lapse and claims the key.
    let retry = s.runs_again_on_b("attach").await;
    let replay = send(s.to(&s.b, "attach")).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(s.sim.executions_for(&s.key), 2);
}

async fn send_result(req: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let r = req.send().await?;
    let status = r.status().as_u16();
    let body = r.bytes().await?.to_vec();
    Ok(Answer {
        status,
        replayed: None,
        body,
    })
}

on_shared_stores!(killed_mid_generation:
    redis_a_killed_replicas_key_is_claimable_after_pending_ttl,
    postgres_a_killed_replicas_key_is_claimable_after_pending_ttl,
    pool 4);

/// SSE with Redis: a duplicate on the other replica follows the live
/// stream; when the owner is killed the follower's stream ends with an
/// error (never a clean end), and the client's retry after `pending_ttl`
/// runs the work again and gets a whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_follower_of_a_killed_owners_stream_sees_it_break_and_the_retry_runs_again() {
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let sim = sim().await;
    let a = Gw::start(&store, &sim.url(), "2s").await;
    let b = Gw::start(&store, &sim.url(), "2s").await;
    let client = client();
    let key = format!("{prefix}-sse-killed");
    let body = chat(true, &key);
    let slow = |r: reqwest::RequestBuilder| {
        r.header("x-sim-tokens", "200")
            .header("x-sim-token-interval-ms", "50")
    };
    let mut owner = slow(request(&client, &a.url("attach"), "t1", &key, body.clone()))
        .send()
        .await
        .unwrap();
    assert!(owner.chunk().await.unwrap().is_some());
    let mut follower = slow(request(&client, &b.url("attach"), "t1", &key, body.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(follower.status(), 200);
    assert_eq!(
        follower
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let first = follower.chunk().await.unwrap().unwrap();
    // The first event, numbered 1 in the run that produced it.
    let head = String::from_utf8_lossy(&first);
    let id = head.lines().next().and_then(|l| l.strip_prefix("id: "));
    assert!(id.is_some_and(|id| id.ends_with("-1")), "{first:?}");
    a.signal("KILL").await;
    let ended = loop {
        match follower.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(
        ended.is_err(),
        "a stream whose owner died must not end cleanly"
    );
    let retry =
        send(request(&client, &b.url("attach"), "t1", &key, body).header("x-sim-tokens", "10"))
            .await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert!(retry.body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(sim.executions_for(&key), 2);
    drop(owner);
    drop_prefix(REDIS, &prefix).await;
}

/// A replica paused past its lease: the other takes the key over and
/// stores its result; the paused one, resumed, is fenced: its late result
/// does not overwrite, its client gets 503 `lease-lost` rather than a
/// second answer, and its `/metrics` counts it.
async fn paused_past_the_lease(store: &str) {
    let key = format!("{}-paused", tag());
    let (s, first) = interrupted(store, "1s", key, "wait", "3000", "STOP").await;
    // Well past the 1 s lease: no heartbeat can run in a stopped process.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // b takes the key over.
    let taken = s.runs_again_on_b("wait").await;
    s.a.signal("CONT").await;
    let late = first.await.unwrap().expect("the resumed replica answers");
    // Its result is not the key's answer: its client is told so (a
    // retryable refusal), never handed a second, different answer.
    assert_eq!(late.status, 503, "{}", String::from_utf8_lossy(&late.body));
    assert!(
        String::from_utf8_lossy(&late.body).contains("/problems/lease-lost"),
        "{}",
        String::from_utf8_lossy(&late.body)
    );
    for gw in [&s.a, &s.b] {
        let replay = send(s.to(gw, "wait")).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.replayed.as_deref(), Some("true"));
        assert_eq!(
            replay.body, taken.body,
            "the stored result is the new owner's, not the fenced one's"
        );
    }
    assert!(
        s.a.counter("idempotency_fenced_total", "").await >= 1,
        "the paused replica counted its fenced completion"
    );
    assert_eq!(s.b.counter("idempotency_fenced_total", "").await, 0);
}

on_shared_stores!(paused_past_the_lease:
    redis_a_paused_replica_is_fenced_after_a_takeover,
    postgres_a_paused_replica_is_fenced_after_a_takeover,
    pool 4);
