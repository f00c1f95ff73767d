//! The latency benches of the networked stores (`cargo bench -p
//! idemgate-redis --bench latency`, likewise PostgreSQL): one measuring
//! loop and one report, so that the stores' figures are measured the same
//! way and can be compared line by line.
//!
//! Each key is claimed, completed and claimed again (a replay) on the
//! store itself, then replayed through an engine on the store, on the same
//! store writing its timeline inline, and through the cache the gateway
//! runs; the first tenth of the keys warms up and is not counted.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    AggregatingStore, Attempt, AttemptOutcome, Begin, CachedStore, Claim, ClientKey, Engine,
    Fingerprint, ScopedKey, Store,
};

/// The request every key of a latency bench is claimed for.
pub fn bench_fingerprint() -> Fingerprint {
    Fingerprint::of_request("POST", "/v1/chat/completions", b"{\"m\":1}", &[])
}

/// The attempt every completion of a latency bench records.
pub fn bench_attempt() -> Attempt {
    Attempt {
        at_ms: 0,
        replica: "bench".into(),
        outcome: AttemptOutcome::Executed,
        status: Some(200),
        latency_us: 0,
        repeated: None,
    }
}

/// How many keys to measure: 5000 under `cargo bench`, 20 under `cargo
/// test` (a smoke test).
pub fn bench_keys() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        5000
    } else {
        20
    }
}

/// The value at quantile `p` of `sorted`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Prints one line: `name`, the count, p50, p99 and the maximum.
pub fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<10} n={:<6} p50={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
}

/// Times `op`.
async fn timed<T>(op: impl Future<Output = T>) -> (T, Duration) {
    let t = Instant::now();
    let out = op.await;
    (out, t.elapsed())
}

/// Times a replay of `key` through `engine`.
async fn engine_replay(engine: &Engine, key: &ScopedKey, fp: &Fingerprint) -> Duration {
    let (begin, e) = timed(engine.begin(key, fp)).await;
    let Begin::Done(_) = begin.unwrap() else {
        panic!("engine replay claimed")
    };
    e
}

/// Measures `n` keys (after `n / 10` more that warm up) on `store`, with
/// `inline` the same store writing timeline entries on the request path
/// and, when given, one more fresh claim per key on `extra` (the same
/// store otherwise configured). Returns the named samples in report order.
pub async fn claim_complete_replay(
    store: Arc<dyn Store>,
    inline: Arc<dyn Store>,
    extra: Option<(&'static str, Arc<dyn Store>)>,
    n: usize,
) -> Vec<(&'static str, Vec<Duration>)> {
    let fp = bench_fingerprint();
    let attempt = bench_attempt();
    let ttl = Duration::from_secs(300);
    let payload = Bytes::from(vec![b'x'; 1024]);
    let engine = Engine::new(Arc::clone(&store));
    let inline_engine = Engine::new(inline);
    // As the gateway runs it: replays of a key read less than a second
    // before answered from memory, their timeline entries gathered.
    let gathered = AggregatingStore::new(Arc::clone(&store));
    let cached_engine = Engine::new(Arc::new(CachedStore::new(
        Arc::new(gathered),
        CachedStore::DEFAULT_BYTES,
    )));
    let names = [
        "claim",
        "complete",
        "replay",
        "eng.replay",
        "eng.inline",
        "eng.cached",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len() + 1];
    for i in 0..n + n / 10 {
        let key = ScopedKey::new("bench", "ns", ClientKey::mint());
        let (claim, c) = timed(store.claim(&key, &fp, ttl)).await;
        let Claim::Acquired(lease) = claim.unwrap() else {
            panic!("fresh key held")
        };
        let (done, d) = timed(store.complete(&lease, payload.clone(), ttl, &attempt)).await;
        let _ = done.unwrap();
        let (again, r) = timed(store.claim(&key, &fp, ttl)).await;
        let Claim::Existing(_) = again.unwrap() else {
            panic!("replay claimed")
        };
        // Through the engine a replay also appends a timeline entry.
        let e = engine_replay(&engine, &key, &fp).await;
        let s = engine_replay(&inline_engine, &key, &fp).await;
        // The first read fills the cache; the replay measured is the next.
        engine_replay(&cached_engine, &key, &fp).await;
        let h = engine_replay(&cached_engine, &key, &fp).await;
        let mut round = vec![c, d, r, e, s, h];
        if let Some((_, extra)) = &extra {
            let other = ScopedKey::new("bench", "ns", ClientKey::mint());
            let (claim, u) = timed(extra.claim(&other, &fp, ttl)).await;
            let Claim::Acquired(_) = claim.unwrap() else {
                panic!("fresh key held")
            };
            round.push(u);
        }
        if i >= n / 10 {
            for (all, one) in samples.iter_mut().zip(round) {
                all.push(one);
            }
        }
    }
    let extra_samples = samples.pop().unwrap_or_default();
    let mut out: Vec<(&'static str, Vec<Duration>)> = names.into_iter().zip(samples).collect();
    if let Some((name, _)) = extra {
        // Printed beside the claims it compares with.
        out.insert(1, (name, extra_samples));
    }
    out
}
