//! The `Engine::execute` benches (feature `bench`): the engine's on the
//! memory store and the SQLite store's run the same cases, so their figures
//! are measured the same way. Each case executes through an engine: one
//! caller, or [`CALLERS`] concurrent callers whose wall time per operation
//! (total time divided by the operations done by all callers) is reported;
//! first executions take a fresh key each, replays a key already done.
//!
//! The bench picks what its work answers (`answer`): the result that is
//! stored and replayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use idemgate_engine::{ClientKey, Engine, Fingerprint, ScopedKey};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::runtime::Runtime;

/// How many callers the concurrent cases run.
pub const CALLERS: u64 = 64;

/// What a bench's work answers, stored and replayed.
pub trait Answer: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Answer for T {}

/// The `n`th key of a bench.
pub fn key(n: u64) -> ScopedKey {
    ScopedKey::new(
        "bench",
        "execute",
        ClientKey::parse(&format!("k{n}")).unwrap(),
    )
}

/// The key the one-caller replay cases replay.
pub fn hot_key() -> ScopedKey {
    key(u64::MAX)
}

/// The key caller `c` replays in the concurrent replay cases.
fn caller_key(c: u64) -> ScopedKey {
    key(u64::MAX - 1 - c)
}

/// The request every execution of a bench is for.
pub fn fp() -> Fingerprint {
    Fingerprint::of_request("POST", "/v1/chat/completions", b"{\"model\":\"m\"}", &[])
}

/// The runtime the benches run on: two workers.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A benchmark group named `name` whose figures are per operation.
pub fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    g
}

/// Executes `key` for `fp` on `engine`, the work answering `answer()`;
/// true if the result was replayed.
pub async fn run<T: Answer>(
    engine: &Engine,
    key: &ScopedKey,
    fp: &Fingerprint,
    answer: fn() -> T,
) -> bool {
    engine
        .execute(key, fp, || async move { Ok::<_, std::io::Error>(answer()) })
        .await
        .unwrap()
        .replayed()
}

/// Runs `iters` executions split over [`CALLERS`] tasks; returns wall time.
/// `key_of(caller, i)` picks each execution's key.
pub async fn concurrent<T: Answer>(
    engine: &Engine,
    iters: u64,
    answer: fn() -> T,
    key_of: impl Fn(u64, u64) -> ScopedKey + Send + Sync + Clone + 'static,
) -> Duration {
    let per = iters.div_ceil(CALLERS);
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (engine, key_of) = (engine.clone(), key_of.clone());
            tokio::spawn(async move {
                let fp = fp();
                for i in 0..per {
                    run(&engine, &key_of(c, i), &fp, answer).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start
        .elapsed()
        .mul_f64(iters as f64 / (per * CALLERS) as f64)
}

/// Case `name`: one caller replaying [`hot_key`] on `engine` (done first
/// if it is not yet).
pub fn replay_one<T: Answer>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    engine: &Engine,
    answer: fn() -> T,
) {
    let (hot, fp) = (hot_key(), fp());
    rt.block_on(run(engine, &hot, &fp, answer));
    g.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            assert!(run(engine, &hot, &fp, answer).await);
        });
    });
}

/// Case `name`: [`CALLERS`] callers, each replaying a key of its own on
/// `engine` (done first if they are not yet).
pub fn replay_many<T: Answer>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    engine: &Engine,
    answer: fn() -> T,
) {
    let fp = fp();
    rt.block_on(async {
        for c in 0..CALLERS {
            run(engine, &caller_key(c), &fp, answer).await;
        }
    });
    g.bench_function(name, |b| {
        b.to_async(rt)
            .iter_custom(|iters| concurrent(engine, iters, answer, |c, _| caller_key(c)));
    });
}

/// The cases every store's execute bench runs on `engine`: `replay/1`,
/// `first_execution/1`, `replay/64` and `first_execution/64`.
pub fn execute_cases<T: Answer>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    engine: &Engine,
    answer: fn() -> T,
) {
    let (next, fp) = (Arc::new(AtomicU64::new(0)), fp());
    replay_one(g, rt, "replay/1", engine, answer);
    g.bench_function("first_execution/1", |b| {
        b.to_async(rt).iter(|| async {
            let k = key(next.fetch_add(1, Ordering::Relaxed));
            assert!(!run(engine, &k, &fp, answer).await);
        });
    });
    replay_many(g, rt, "replay/64", engine, answer);
    g.bench_function("first_execution/64", |b| {
        b.to_async(rt).iter_custom(|iters| {
            let next = Arc::clone(&next);
            concurrent(engine, iters, answer, move |_, _| {
                key(next.fetch_add(1, Ordering::Relaxed))
            })
        });
    });
}
