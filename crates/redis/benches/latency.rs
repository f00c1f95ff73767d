//! Latency of claim, complete and replay against a real Redis, as p50/p99.
//!
//! Run with: `cargo bench -p idemgate-redis --bench latency`
//! (`IDEMGATE_BENCH_REDIS_URL` overrides `redis://127.0.0.1:6379`; any
//! `redis+cluster://` URL works too). Under `cargo test` it runs a few
//! iterations only, as a smoke test. On a single node it then prints the
//! server's script time per first execution and per replay, and the
//! memory a key keeps: run it against a Redis nothing else uses for those
//! (`redis-server --port 6390 --save ''` and
//! `IDEMGATE_BENCH_REDIS_URL=redis://127.0.0.1:6390`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{Attempt, Claim, ClientKey, Fingerprint, ScopedKey, Store};
use idemgate_redis::{RedisOptions, RedisStore};
use idemgate_testkit::latency::{
    bench_attempt, bench_fingerprint, bench_keys, claim_complete_replay, report,
};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n = bench_keys();
    let url = std::env::var("IDEMGATE_BENCH_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("igbench{:08x}", rand::random::<u32>());
    let opts = RedisOptions::default()
        .prefix(prefix)
        .fence_memory(Duration::from_secs(600));
    let store = RedisStore::connect_with(&url, opts.clone()).await.unwrap();
    // The same store with timeline entries written on the request path, to
    // show what the background writer saves a replay.
    let inline = RedisStore::connect_with(&url, opts.background_timeline(false))
        .await
        .unwrap();
    let samples = claim_complete_replay(Arc::new(store.clone()), Arc::new(inline), None, n).await;
    println!("redis store at {url}, 1 KiB payload, one client task:");
    for (name, samples) in samples {
        report(name, samples);
    }
    let (fp, attempt) = (bench_fingerprint(), bench_attempt());
    if !url.starts_with("redis+cluster") && !url.starts_with("rediss") {
        server_side(&url, &store, n, &fp, &attempt).await;
    }
}

/// The server's side of a first execution and of a replay: the scripts'
/// time (`INFO commandstats`, `cmdstat_evalsha`) and the memory a key
/// keeps (`used_memory`), measured around `n` first executions with a
/// 300-byte payload (about a stored chat completion) and then `n`
/// replays of those keys, 16 at a time. Meaningful on a Redis nothing
/// else uses.
async fn server_side(url: &str, store: &RedisStore, n: usize, fp: &Fingerprint, attempt: &Attempt) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut stats = async || {
        let commands: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let memory: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .unwrap();
        (evalsha_usec(&commands), info_field(&memory, "used_memory"))
    };
    let ttl = Duration::from_secs(300);
    let payload = Bytes::from(vec![b'x'; 300]);
    let keys: Vec<ScopedKey> = (0..n)
        .map(|_| ScopedKey::new("bench", "ns", ClientKey::mint()))
        .collect();
    // 16 keys in flight at a time, as under the gateway's closed-loop
    // bench: the scripts then run back to back on a busy server.
    let (before, mem_before) = stats().await;
    for chunk in keys.chunks(16) {
        let mut tasks = tokio::task::JoinSet::new();
        for key in chunk {
            let (store, key, fp, payload, attempt) = (
                store.clone(),
                key.clone(),
                *fp,
                payload.clone(),
                attempt.clone(),
            );
            tasks.spawn(async move {
                let Claim::Acquired(lease) = store.claim(&key, &fp, ttl).await.unwrap() else {
                    panic!("fresh key held")
                };
                let _ = store
                    .complete(&lease, payload, ttl, &attempt)
                    .await
                    .unwrap();
            });
        }
        tasks.join_all().await;
    }
    let (fresh, mem_after) = stats().await;
    for chunk in keys.chunks(16) {
        let mut tasks = tokio::task::JoinSet::new();
        for key in chunk {
            let (store, key, fp) = (store.clone(), key.clone(), *fp);
            tasks.spawn(async move {
                let Claim::Existing(_) = store.claim(&key, &fp, ttl).await.unwrap() else {
                    panic!("replay claimed")
                };
            });
        }
        tasks.join_all().await;
    }
    let (replayed, _) = stats().await;
    let per = |a: u64, b: u64| (b - a) as f64 / n as f64;
    println!("server side, {n} keys, 300-byte payload:");
    println!(
        "  first execution: {:.1} us of script time (claim + complete), {:.0} B of memory per key",
        per(before, fresh),
        mem_after as f64 / n as f64 - mem_before as f64 / n as f64
    );
    println!(
        "  replay:          {:.1} us of script time",
        per(fresh, replayed)
    );
}

/// The `usec` total of `cmdstat_evalsha` in `INFO commandstats`.
fn evalsha_usec(info: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A numeric field of an `INFO` section.
fn info_field(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
