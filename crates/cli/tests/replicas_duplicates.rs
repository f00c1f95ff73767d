//! Duplicates split between two gateway processes execute once: wait and
//! attach, JSON and SSE, many keys, on Redis and PostgreSQL; and the soak
//! (`scripts/soak.sh` runs it at full size), on those and on one SQLite
//! file shared by two processes.
//!
//! Real `idemgate serve` processes share Redis or PostgreSQL in front of
//! the simulated LLM upstream; the shared helpers are in
//! `support/replicas.rs`. The shared servers (Redis 127.0.0.1:6379 under a
//! random key prefix, PostgreSQL db `test` under a random schema) are never
//! restarted. Under `CI=true` a missing server fails the suite; it never
//! skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_llm_sim::{SimConfig, SimHandle};
use idemgate_testkit::stall::unless_host_stalled;
use support::replicas::*;
use tokio::task::JoinSet;

/// The gateways' lease (`pending_ttl`). A stall of the whole host past
/// half of it may cost an owner its lease, as a SIGSTOP would: such a run
/// is inconclusive and runs again (`unless_host_stalled`).
const LEASE: Duration = Duration::from_secs(10);

/// [`LEASE`] as the gateways' configuration spells it.
fn lease() -> String {
    format!("{}s", LEASE.as_secs())
}

/// ≥ 64 concurrent duplicates per key, alternating between two replicas,
/// for 10 keys in each of wait/attach × JSON/SSE: one execution per key,
/// every answer 200 and identical, exactly one of them fresh.
async fn split_duplicates(store: &str) {
    unless_host_stalled(LEASE, || split_duplicates_once(store)).await;
}

async fn split_duplicates_once(store: &str) {
    let sim = Arc::new(sim().await);
    let a = Gw::start(store, &sim.url(), &lease()).await;
    let b = Gw::start(store, &sim.url(), &lease()).await;
    let client = client();
    let run = tag();
    for mode in ["wait", "attach"] {
        for stream in [false, true] {
            for i in 0..10 {
                let key = format!("{run}-{mode}-{stream}-{i}");
                let mut set = JoinSet::new();
                for j in 0..64 {
                    let url = if j % 2 == 0 { a.url(mode) } else { b.url(mode) };
                    let req = request(&client, &url, "t1", &key, chat(stream, &key));
                    set.spawn(send(req));
                }
                let answers: Vec<Answer> = set.join_all().await;
                executed_once(&sim, &key, &answers);
                if stream {
                    assert!(answers[0].body.ends_with(b"data: [DONE]\n\n"), "{key}");
                }
            }
        }
    }
}

on_shared_stores!(split_duplicates:
    redis_duplicates_split_between_two_processes_execute_once,
    postgres_duplicates_split_between_two_processes_execute_once,
    pool 6);

/// The soak: `SOAK_KEYS` fresh keys (default 60), each sent as 8
/// concurrent duplicates spread over two replicas, 16 keys at a time,
/// alternating wait/attach and JSON/SSE. Every key runs upstream exactly
/// once and every answer of a key is identical. `scripts/soak.sh` runs it
/// at full size on every store and prints the figures.
async fn soak(store: &str) {
    unless_host_stalled(LEASE, || soak_once(store)).await;
}

async fn soak_once(store: &str) {
    const DUPLICATES: usize = 8;
    const KEYS_AT_ONCE: usize = 16;
    let keys: usize = std::env::var("SOAK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let sim = Arc::new(
        idemgate_llm_sim::spawn(SimConfig {
            latency: Duration::from_millis(20),
            first_token_delay: Duration::from_millis(5),
            token_interval: Duration::from_millis(1),
            completion_tokens: 12,
        })
        .await
        .unwrap(),
    );
    let a = Arc::new(Gw::start(store, &sim.url(), &lease()).await);
    let b = Arc::new(Gw::start(store, &sim.url(), &lease()).await);
    let client = client();
    let run = tag();
    let started = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(KEYS_AT_ONCE));
    let mut set = JoinSet::new();
    for i in 0..keys {
        let permit = Arc::clone(&slots).acquire_owned().await.unwrap();
        let (a, b, client) = (Arc::clone(&a), Arc::clone(&b), client.clone());
        let key = format!("{run}-{i}");
        set.spawn(async move {
            let mode = if i % 2 == 0 { "wait" } else { "attach" };
            let stream = i % 4 >= 2;
            let mut dups = JoinSet::new();
            for j in 0..DUPLICATES {
                let url = if j % 2 == 0 { a.url(mode) } else { b.url(mode) };
                let req = request(&client, &url, "soak", &key, chat(stream, &key));
                dups.spawn(send(req));
            }
            let answers = dups.join_all().await;
            drop(permit);
            (key, answers)
        });
        // Keep the finished ones from piling up.
        while let Some(done) = set.try_join_next() {
            let (key, answers) = done.unwrap();
            executed_once(&sim, &key, &answers);
        }
    }
    while let Some(done) = set.join_next().await {
        let (key, answers) = done.unwrap();
        executed_once(&sim, &key, &answers);
    }
    let secs = started.elapsed().as_secs_f64();
    let executions = sim.stats().executions;
    assert_eq!(executions, keys as u64, "one upstream execution per key");
    eprintln!(
        "soak {}: {keys} keys x {DUPLICATES} duplicates over 2 replicas: {} requests in {secs:.1} s \
         ({:.0} req/s); {executions} upstream executions; every key once, its answers identical",
        store.split(['?', ':']).next().unwrap_or(store),
        keys * DUPLICATES,
        (keys * DUPLICATES) as f64 / secs,
    );
}

/// Every answer of `key` is 200 and identical, exactly one of them fresh,
/// and the upstream ran it once.
fn executed_once(sim: &SimHandle, key: &str, answers: &[Answer]) {
    for ans in answers {
        assert_eq!(
            ans.status,
            200,
            "{key}: {}",
            String::from_utf8_lossy(&ans.body)
        );
        assert_eq!(ans.body, answers[0].body, "{key}: every answer identical");
    }
    let fresh = answers
        .iter()
        .filter(|a| a.replayed.as_deref() == Some("false"))
        .count();
    assert_eq!(fresh, 1, "{key}: exactly one answer is the execution");
    assert_eq!(sim.executions_for(key), 1, "{key}: one upstream execution");
}

on_shared_stores!(soak: soak_redis, soak_postgres, pool 8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_one_shared_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    soak(&format!(
        "sqlite:{}",
        dir.path().join("shared.db").display()
    ))
    .await;
}
