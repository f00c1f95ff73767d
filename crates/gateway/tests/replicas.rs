//! Two gateway replicas (two `serve` instances with separate layers and live
//! registries) sharing one store: the shared Redis on 127.0.0.1:6379 under a
//! random key prefix, and the shared PostgreSQL (db `test`) under a random
//! schema. A duplicate of a streaming request sent to the replica that does
//! not run it follows the live stream through Redis Streams, or — with
//! PostgreSQL — waits for DONE and replays it.
//!
//! Under `CI=true` a missing server fails the suite; it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Private Redis servers (the Redis store's test helpers): a 3-primary
/// cluster for the cluster case.
#[path = "../../redis/tests/support/mod.rs"]
mod redis_support;
mod support;

use futures_util::StreamExt;
use support::TestGateway;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::RawInflightMode;
use idemgate_llm_sim::SimHandle;
use idemgate_testkit::http::replayed;
use idemgate_testkit::postgres_server;
use idemgate_testkit::postgres_server::drop_schema;

const REDIS: &str = "redis://127.0.0.1:6379";
const ADMIN_TOKEN: &str = "replica-admin";

fn tag() -> String {
    format!("igrep{:08x}", rand::random::<u32>())
}

/// Starts a replica on `store` (see [`support::replica_on`]).
async fn replica(store: &str, upstream: &str) -> TestGateway {
    support::replica_on(store, config(store, upstream)).await
}

fn config(store: &str, upstream: &str) -> GatewayConfig {
    support::keyed(store, upstream)
        .on_inflight(RawInflightMode::Attach)
        .route(|r| r.inflight_wait = Some("30s".into()))
        .total_timeout("30s")
        .config(|c| c.admin_token = Some(ADMIN_TOKEN.into()))
        .into_config()
}

fn stream_request(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
) -> reqwest::RequestBuilder {
    let body = serde_json::json!({
        "model": "sim-1",
        "stream": true,
        "messages": [{"role": "user", "content": format!("tell me about {key}")}],
    });
    client
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        // ~2 s of generation: 40 tokens, 50 ms apart.
        .header("x-sim-tokens", "40")
        .header("x-sim-token-interval-ms", "50")
        .body(body.to_string())
}

/// The events of an SSE body after the first `n`.
fn after_events(body: &[u8], n: usize) -> Vec<u8> {
    let mut at = 0;
    for _ in 0..n {
        let rest = &body[at..];
        let end = rest
            .windows(2)
            .position(|w| w == b"\n\n")
            .expect("fewer events than expected");
        at += end + 2;
    }
    body[at..].to_vec()
}

/// Runs a streaming request on replica `a`, and while it generates, sends
/// the same request to replica `b` (whole stream) and again with
/// `Last-Event-ID: 3`. Returns whether b's duplicates got their first
/// bytes while a's stream was still running (live), and checks the bytes.
async fn duplicate_on_the_other_replica(
    sim: &SimHandle,
    a: &TestGateway,
    b: &TestGateway,
    key: &str,
) -> bool {
    let client = reqwest::Client::new();
    let first = stream_request(&client, a, key).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(replayed(&first).as_deref(), Some("false"));
    let mut a_stream = first.bytes_stream();
    let mut a_body = a_stream.next().await.unwrap().unwrap().to_vec();
    // The run a's events name (`id: RUN-1` opens the first one).
    let run = String::from_utf8_lossy(&a_body)
        .lines()
        .find_map(|l| Some(l.strip_prefix("id: ")?.split_once('-')?.0.to_owned()))
        .expect("the first event names its run");
    let a_done = Arc::new(AtomicBool::new(false));
    let a_reader = {
        let a_done = Arc::clone(&a_done);
        tokio::spawn(async move {
            while let Some(chunk) = a_stream.next().await {
                a_body.extend_from_slice(&chunk.unwrap());
            }
            a_done.store(true, Ordering::SeqCst);
            a_body
        })
    };

    let read_dup = |req: reqwest::RequestBuilder| {
        let a_done = Arc::clone(&a_done);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(replayed(&r).as_deref(), Some("true"));
            let mut s = r.bytes_stream();
            let mut body = Vec::new();
            let mut live = None;
            while let Some(chunk) = s.next().await {
                let chunk = chunk.unwrap();
                if live.is_none() && !chunk.is_empty() {
                    live = Some(!a_done.load(Ordering::SeqCst));
                }
                body.extend_from_slice(&chunk);
            }
            (body, live.unwrap_or(false))
        }
    };
    let whole = read_dup(stream_request(&client, b, key));
    let resumed =
        read_dup(stream_request(&client, b, key).header("last-event-id", format!("{run}-3")));
    let ((b_body, b_live), (c_body, c_live)) = tokio::join!(whole, resumed);
    let a_body = a_reader.await.unwrap();

    assert!(a_body.ends_with(b"data: [DONE]\n\n"), "a's stream is whole");
    assert_eq!(
        String::from_utf8_lossy(&b_body),
        String::from_utf8_lossy(&a_body),
        "the duplicate on the other replica got exactly the owner's stream"
    );
    assert_eq!(
        String::from_utf8_lossy(&c_body),
        String::from_utf8_lossy(&after_events(&a_body, 3)),
        "Last-Event-ID: 3 gets the events after 3"
    );
    assert_eq!(sim.executions_for(key), 1, "one upstream execution");
    b_live && c_live
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_follow_a_live_stream_run_by_the_other() {
    let sim = support::sim().await;
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    for i in 0..3 {
        let live = duplicate_on_the_other_replica(&sim, &a, &b, &format!("{prefix}-sse-{i}")).await;
        assert!(
            live,
            "the duplicates on the other replica received events before the owner's stream ended"
        );
    }
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
    drop_prefix(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_replicas_follow_a_live_stream_run_by_the_other() {
    let cluster = tokio::task::spawn_blocking(redis_support::cluster_url)
        .await
        .unwrap();
    // The configuration takes one seed node; the client discovers the rest.
    let seed = cluster
        .trim_start_matches("redis+cluster://")
        .split(',')
        .next()
        .unwrap();
    let sim = support::sim().await;
    let prefix = tag();
    let store = format!("redis+cluster://{seed}/?prefix={prefix}");
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    for i in 0..3 {
        let live = duplicate_on_the_other_replica(&sim, &a, &b, &format!("{prefix}-sse-{i}")).await;
        assert!(live, "followed live through the cluster");
    }
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_wait_for_done_and_replay_the_stream() {
    let sim = support::sim().await;
    let schema = tag();
    let store = format!("{}?schema={schema}&pool=4", postgres_server::shared_url());
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    for i in 0..2 {
        // No shared live feed with PostgreSQL: the duplicate gets the
        // stored stream once DONE. Whether its bytes arrive "live" is not
        // asserted; that they are the owner's stream is.
        duplicate_on_the_other_replica(&sim, &a, &b, &format!("{schema}-sse-{i}")).await;
    }
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
    drop_schema(&postgres_server::shared_url(), &schema).await;
}

/// A JSON request for `key` on `gw`: whether it was replayed.
async fn json_request(client: &reqwest::Client, gw: &TestGateway, key: &str) -> String {
    let r = client
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .expect("the gateway answers");
    assert!(r.status().is_success(), "{}", r.status());
    replayed(&r).expect("Idempotent-Replayed is set")
}

/// Replica `b` answers a key's replays (from memory, once it has read the
/// record); an operator forgets the key on replica `a`; once the forget has
/// returned, the next request on `b` runs again instead of replaying.
async fn forget_on_one_replica_holds_on_the_other(
    sim: &SimHandle,
    a: &TestGateway,
    b: &TestGateway,
    key: &str,
) {
    let client = reqwest::Client::new();
    assert_eq!(json_request(&client, a, key).await, "false");
    for _ in 0..3 {
        assert_eq!(json_request(&client, b, key).await, "true");
    }
    let forgot = client
        .delete(format!("{}/admin/keys/{key}", a.admin))
        .bearer_auth(ADMIN_TOKEN)
        .header("x-idemgate-credential", "Bearer tenant-a")
        .send()
        .await
        .expect("the admin listener answers");
    assert_eq!(forgot.status(), 200, "{:?}", forgot.text().await);
    assert_eq!(
        json_request(&client, b, key).await,
        "false",
        "after the forget returned, the other replica ran the key again"
    );
    assert_eq!(sim.executions_for(key), 2);
    assert_eq!(json_request(&client, a, key).await, "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_holds_on_every_replica_with_redis() {
    let sim = support::sim().await;
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    forget_on_one_replica_holds_on_the_other(&sim, &a, &b, &format!("{prefix}-forget")).await;
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
    drop_prefix(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_holds_on_every_replica_with_postgres() {
    let sim = support::sim().await;
    let schema = tag();
    let store = format!("{}?schema={schema}&pool=4", postgres_server::shared_url());
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    forget_on_one_replica_holds_on_the_other(&sim, &a, &b, &format!("{schema}-forget")).await;
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
    drop_schema(&postgres_server::shared_url(), &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forget_holds_on_every_replica_with_sqlite() {
    let sim = support::sim().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("sqlite:{}", dir.path().join("shared.db").display());
    let a = replica(&store, &sim.url()).await;
    let b = replica(&store, &sim.url()).await;
    forget_on_one_replica_holds_on_the_other(&sim, &a, &b, "sqlite-forget").await;
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    sim.shutdown().await;
}

/// Removes this test's Redis keys.
async fn drop_prefix(prefix: &str) {
    let _ = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "redis-cli -h 127.0.0.1 -p 6379 --scan --pattern '{prefix}:*' | xargs -r redis-cli -h 127.0.0.1 -p 6379 del"
        ))
        .output()
        .await;
}
