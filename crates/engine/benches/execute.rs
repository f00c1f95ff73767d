//! `Engine::execute` on the in-memory store: first executions and replays,
//! one caller and 64 concurrent callers; replays again through the replay
//! cache (`CachedStore`) and the timeline gatherer (`AggregatingStore`).
//!
//! Run with: `cargo bench -p idemgate-engine --bench execute -- --warm-up-time 1 --measurement-time 3`
//!
//! The 64-caller cases report wall time per operation (total time divided by
//! the operations done by all callers), i.e. the inverse of throughput.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idemgate_engine::{
    AggregatingStore, CachedStore, ClientKey, Engine, Fingerprint, MemoryStore, ScopedKey, Store,
};

const CALLERS: u64 = 64;

fn key(n: u64) -> ScopedKey {
    ScopedKey::new(
        "bench",
        "execute",
        ClientKey::parse(&format!("k{n}")).unwrap(),
    )
}

fn fp() -> Fingerprint {
    Fingerprint::of_request("POST", "/v1/chat/completions", b"{\"model\":\"m\"}", &[])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn run(engine: &Engine, key: &ScopedKey, fp: &Fingerprint) -> bool {
    engine
        .execute(key, fp, || async { Ok::<_, std::io::Error>(42u64) })
        .await
        .unwrap()
        .replayed()
}

/// Runs `iters` executions split over [`CALLERS`] tasks; returns wall time.
/// `key_of(caller, i)` picks each execution's key.
async fn concurrent(
    engine: &Engine,
    iters: u64,
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
                    run(&engine, &key_of(c, i), &fp).await;
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

fn memory(c: &mut Criterion) {
    let rt = runtime();
    let engine = rt.block_on(async { Engine::new(Arc::new(MemoryStore::new())) });
    let fp = fp();
    let next = Arc::new(AtomicU64::new(0));

    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Elements(1));

    let hot = key(u64::MAX);
    rt.block_on(run(&engine, &hot, &fp));
    g.bench_function("replay/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(run(&engine, &hot, &fp).await);
        });
    });

    g.bench_function("first_execution/1", |b| {
        b.to_async(&rt).iter(|| async {
            let k = key(next.fetch_add(1, Ordering::Relaxed));
            assert!(!run(&engine, &k, &fp).await);
        });
    });

    rt.block_on(async {
        for c in 0..CALLERS {
            run(&engine, &key(u64::MAX - 1 - c), &fp).await;
        }
    });
    g.bench_function("replay/64", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&engine, iters, |c, _| key(u64::MAX - 1 - c)));
    });

    g.bench_function("first_execution/64", |b| {
        let next = Arc::clone(&next);
        b.to_async(&rt).iter_custom(|iters| {
            let next = Arc::clone(&next);
            concurrent(&engine, iters, move |_, _| {
                key(next.fetch_add(1, Ordering::Relaxed))
            })
        });
    });

    let gathered: Arc<dyn Store> =
        Arc::new(rt.block_on(async { AggregatingStore::new(Arc::new(MemoryStore::new())) }));
    let gathering = Engine::new(Arc::clone(&gathered));
    let cached = Engine::new(Arc::new(CachedStore::new(
        gathered,
        CachedStore::DEFAULT_BYTES,
    )));
    rt.block_on(run(&cached, &hot, &fp));
    g.bench_function("replay_gathered/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(run(&gathering, &hot, &fp).await);
        });
    });
    g.bench_function("replay_cached/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(run(&cached, &hot, &fp).await);
        });
    });
    g.finish();
}

criterion_group!(benches, memory);
criterion_main!(benches);
