//! An acknowledged result survives a Redis Cluster failover: a private
//! cluster of 3 masters and 3 replicas (`cluster-node-timeout 1000`), two
//! gateways sharing it, a steady load of fresh keys. One replica stalls
//! (SIGSTOP) until its master drops the replication link; then the master
//! is killed (SIGKILL) and the stale replica, thawed, is promoted.
//!
//! Every key that was answered 200 is retried afterwards: each retry is a
//! replay of the same answer, and the upstream ran each of those keys
//! once. Requests during the failover window may be refused (503); those
//! were never acknowledged.
//!
//! Needs `redis-server` and `redis-cli`; under `CI=true` their absence
//! fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_gateway::GatewayConfig;
use idemgate_llm_sim::SimConfig;
use idemgate_testkit::http::replayed;
use idemgate_testkit::redis_server::{Server, create_cluster, redis_cli, wait_until};
use support::TestGateway;

fn config(store: &str, upstream: &str) -> GatewayConfig {
    support::keyed(store, upstream)
        .route(|r| r.pending_ttl = Some("20s".into()))
        .into_config()
}

/// Six cluster nodes, 3 masters each with one replica.
fn cluster(root: &std::path::Path) -> Vec<Server> {
    let nodes: Vec<Server> = (0..6)
        .map(|_| {
            Server::start_with(
                root,
                true,
                &[
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--repl-ping-replica-period",
                    "1",
                    "--repl-timeout",
                    "2",
                    "--appendonly",
                    "no",
                ],
            )
        })
        .collect();
    create_cluster(&nodes, 1, None, Duration::from_secs(30));
    nodes
}

/// (master index, its replica's index) of one shard, once replication is up.
fn a_shard(nodes: &[Server]) -> (usize, usize) {
    let mut found = None;
    wait_until(
        "a master with its replica in sync",
        Duration::from_secs(30),
        || {
            for (r, n) in nodes.iter().enumerate() {
                if n.replication("role").as_deref() == Some("slave")
                    && n.replication("master_link_status").as_deref() == Some("up")
                    && let Some(port) = n.replication("master_port")
                    && let Some(m) = nodes.iter().position(|m| m.port.to_string() == port)
                {
                    found = Some((m, r));
                    return true;
                }
            }
            false
        },
    );
    found.expect("found")
}

#[derive(Debug)]
struct Answered {
    key: String,
    body: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_results_survive_a_failover_to_a_stale_replica() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path());
    let sim = Arc::new(
        idemgate_llm_sim::spawn(SimConfig {
            latency: Duration::from_millis(50),
            ..SimConfig::default()
        })
        .await
        .unwrap(),
    );
    let prefix = format!("igfail{:08x}", rand::random::<u32>());
    // The shard that fails, and a seed outside it: a gateway that has to
    // reconnect from scratch starts from its seed (the store URL names one).
    let (m, r) = a_shard(&nodes);
    let seed = (0..nodes.len())
        .find(|i| *i != m && *i != r)
        .expect("another shard");
    let store = format!(
        "redis+cluster://127.0.0.1:{}/?prefix={prefix}",
        nodes[seed].port
    );
    let a = TestGateway::start(config(&store, &sim.url())).await;
    let b = TestGateway::start(config(&store, &sim.url())).await;
    let bases = [a.base.clone(), b.base.clone()];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // Both gateways see the whole cluster before the load starts.
    for (i, base) in bases.iter().enumerate() {
        let mut ready = false;
        for attempt in 0..100 {
            let probe = format!("{prefix}-probe-{i}-{attempt}");
            if matches!(send(&client, base, &probe).await, Some((200, _, _))) {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(ready, "gateway {i} never reached the cluster");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(Vec::<Answered>::new()));
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..12 {
        let (client, bases, stop, answered, refused) = (
            client.clone(),
            bases.clone(),
            Arc::clone(&stop),
            Arc::clone(&answered),
            Arc::clone(&refused),
        );
        let prefix = prefix.clone();
        workers.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = format!("{prefix}-{w}-{i}");
                let base = &bases[usize::try_from(i % 2).unwrap()];
                let sent = send(&client, base, &key).await;
                match sent {
                    Some((200, _, body)) => answered.lock().unwrap().push(Answered { key, body }),
                    other => {
                        if refused.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!(
                                "first refusal: {:?}",
                                other
                                    .map(|(s, _, b)| (s, String::from_utf8_lossy(&b).into_owned()))
                            );
                        }
                    }
                }
            }
        });
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "before the stall: {} answered",
        answered.lock().unwrap().len()
    );
    // The replica stalls; its master drops the link (repl-timeout 2 s) and
    // goes on alone.
    nodes[r].pause();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    // 0.8 s after the link dropped.
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The master dies; the stale replica is thawed and promoted.
    nodes[m].kill();
    nodes[r].resume();
    let replica_port = nodes[r].port;
    tokio::task::spawn_blocking(move || {
        wait_until(
            "the stale replica is promoted",
            Duration::from_secs(30),
            || redis_cli(replica_port, &["role"]).is_some_and(|o| o.starts_with("master")),
        );
    })
    .await
    .unwrap();
    // Steady again for a while, then the load stops.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}

    let answered = std::mem::take(&mut *answered.lock().unwrap());
    eprintln!(
        "load: {} answered 200, {} refused",
        answered.len(),
        refused.load(Ordering::Relaxed)
    );
    assert!(answered.len() > 100, "too little load: {}", answered.len());
    let mut ran_again = Vec::new();
    for (i, ans) in answered.iter().enumerate() {
        let base = &bases[(i + 1) % 2];
        let retry = send(&client, base, &ans.key).await;
        match retry {
            Some((200, Some(replay), body)) if replay == "true" && body == ans.body => {}
            other => ran_again.push((ans.key.clone(), other.map(|(s, r, _)| (s, r)))),
        }
        if sim.executions_for(&ans.key) != 1 {
            ran_again.push((ans.key.clone(), None));
        }
    }
    eprintln!(
        "failover: {} keys answered 200, {} requests refused during the failover, {} retries not replayed",
        answered.len(),
        refused.load(Ordering::Relaxed),
        ran_again.len()
    );
    assert!(
        ran_again.is_empty(),
        "acknowledged keys that ran again or were not replayed: {:?}",
        &ran_again[..ran_again.len().min(10)]
    );
    a.stop().await.expect("stop cleanly");
    b.stop().await.expect("stop cleanly");
    for n in &mut nodes {
        n.kill();
    }
}

/// Status, `Idempotent-Replayed` and body, or `None` if the request failed
/// at the transport.
async fn send(
    client: &reqwest::Client,
    base: &str,
    key: &str,
) -> Option<(u16, Option<String>, Vec<u8>)> {
    let body = serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": format!("about {key}")}],
    });
    let url = format!("{base}/v1/chat/completions");
    let r = support::keyed_post(client, url, "Bearer tenant-a", key, body.to_string())
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    let replay = replayed(&r);
    let body = r.bytes().await.ok()?.to_vec();
    Some((status, replay, body))
}
