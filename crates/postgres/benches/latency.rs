//! Latency of claim, complete and replay against a real PostgreSQL, as p50/p99.
//!
//! Run with: `cargo bench -p idemgate-postgres --bench latency`
//! (`IDEMGATE_BENCH_POSTGRES_URL` overrides
//! `postgres://postgres@127.0.0.1:5432/test`; the bench uses a schema of its
//! own and drops it). Under `cargo test` it runs a few iterations only, as a
//! smoke test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Begin, Claim, ClientKey, Engine, Fingerprint, ScopedKey, Store,
};
use idemgate_postgres::{PostgresOptions, PostgresStore};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<10} n={:<6} p50={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 5000 } else { 20 };
    let url = std::env::var("IDEMGATE_BENCH_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("igbench_{:08x}", rand::random::<u32>());
    let opts = PostgresOptions::default()
        .schema(&schema)
        .max_connections(2)
        .purge_interval(None);
    let store = PostgresStore::connect_with(&url, opts.clone())
        .await
        .unwrap();
    // The same store with timeline entries written on the request path, to
    // show what the background writer saves a replay.
    let inline = PostgresStore::connect_with(&url, opts.clone().background_timeline(false))
        .await
        .unwrap();
    // The same store with claims committed without waiting for the WAL
    // flush (`claim_commit=async`).
    let unsynced = PostgresStore::connect_with(&url, opts.synchronous_claims(false))
        .await
        .unwrap();
    let mut unsynced_claim = Vec::new();
    let fp = Fingerprint::of_request("POST", "/v1/chat/completions", b"{\"m\":1}", &[]);
    let ttl = Duration::from_secs(300);
    let payload = Bytes::from(vec![b'x'; 1024]);
    let attempt = Attempt {
        at_ms: 0,
        replica: "bench".into(),
        outcome: AttemptOutcome::Executed,
        status: Some(200),
        latency_us: 0,
        repeated: None,
    };
    let engine = Engine::new(std::sync::Arc::new(store.clone()));
    let (mut claim, mut complete, mut replay) = (Vec::new(), Vec::new(), Vec::new());
    let mut engine_replay = Vec::new();
    let inline_engine = Engine::new(std::sync::Arc::new(inline));
    let mut inline_replay = Vec::new();
    // As the gateway runs it: replays of a key read less than a second
    // before answered from memory, their timeline entries gathered.
    let gathered = idemgate_engine::AggregatingStore::new(std::sync::Arc::new(store.clone()));
    let cached_engine = Engine::new(std::sync::Arc::new(idemgate_engine::CachedStore::new(
        std::sync::Arc::new(gathered),
        idemgate_engine::CachedStore::DEFAULT_BYTES,
    )));
    let mut cached_replay = Vec::new();
    for i in 0..n + n / 10 {
        let key = ScopedKey::new("bench", "ns", ClientKey::mint());
        let t = Instant::now();
        let Claim::Acquired(lease) = store.claim(&key, &fp, ttl).await.unwrap() else {
            panic!("fresh key held")
        };
        let c = t.elapsed();
        let t = Instant::now();
        let _ = store
            .complete(&lease, payload.clone(), ttl, &attempt)
            .await
            .unwrap();
        let d = t.elapsed();
        let t = Instant::now();
        let Claim::Existing(_) = store.claim(&key, &fp, ttl).await.unwrap() else {
            panic!("replay claimed")
        };
        let r = t.elapsed();
        // Through the engine a replay also appends a timeline entry.
        let t = Instant::now();
        let Begin::Done(_) = engine.begin(&key, &fp).await.unwrap() else {
            panic!("engine replay claimed")
        };
        let e = t.elapsed();
        let t = Instant::now();
        let Begin::Done(_) = inline_engine.begin(&key, &fp).await.unwrap() else {
            panic!("engine replay claimed")
        };
        let s = t.elapsed();
        // The first read fills the cache; the replay measured is the next.
        let Begin::Done(_) = cached_engine.begin(&key, &fp).await.unwrap() else {
            panic!("engine replay claimed")
        };
        let t = Instant::now();
        let Begin::Done(_) = cached_engine.begin(&key, &fp).await.unwrap() else {
            panic!("engine replay claimed")
        };
        let h = t.elapsed();
        let other = ScopedKey::new("bench", "ns", ClientKey::mint());
        let t = Instant::now();
        let Claim::Acquired(_) = unsynced.claim(&other, &fp, ttl).await.unwrap() else {
            panic!("fresh key held")
        };
        let u = t.elapsed();
        if i >= n / 10 {
            claim.push(c);
            complete.push(d);
            replay.push(r);
            engine_replay.push(e);
            inline_replay.push(s);
            cached_replay.push(h);
            unsynced_claim.push(u);
        }
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(store.pool())
        .await
        .unwrap();
    println!("postgres store at {url}, 1 KiB payload, one client task:");
    report("claim", claim);
    report("claim.async", unsynced_claim);
    report("complete", complete);
    report("replay", replay);
    report("eng.replay", engine_replay);
    report("eng.inline", inline_replay);
    report("eng.cached", cached_replay);
}
