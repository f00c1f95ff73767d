//! `Engine::execute` on the SQLite store (a temp file, WAL; results
//! fsynced, claims not): replays and first executions, one caller and 64
//! concurrent callers; replays again through the wrappers the gateway puts
//! in front of every store (`CachedStore`, `AggregatingStore`), and the
//! disk's cost of a commit with and without its fsync.
//!
//! Run with: `cargo bench -p idemgate-sqlite --bench execute -- --warm-up-time 1 --measurement-time 3`
//!
//! The 64-caller cases report wall time per execution (total time divided by
//! the executions done by all callers) and executions per second.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idemgate_engine::{
    AggregatingStore, CachedStore, ClientKey, Engine, Fingerprint, ScopedKey, Store,
};
use idemgate_sqlite::SqliteStore;

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

/// A result of a typical chat completion's size (about 1 KiB of JSON).
fn answer() -> String {
    "The answer is 42. ".repeat(56)
}

async fn run(engine: &Engine, key: &ScopedKey, fp: &Fingerprint) -> bool {
    engine
        .execute(key, fp, || async { Ok::<_, std::io::Error>(answer()) })
        .await
        .unwrap()
        .replayed()
}

/// Runs `iters` executions split over [`CALLERS`] tasks; returns wall time.
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

/// The disk's own limit: one single-row commit per iteration, on a plain
/// connection in WAL mode, fsynced (`synchronous=FULL`, as a result is
/// committed) and not (`NORMAL`, as a claim is). Executions per second at
/// 64 callers can be at most 64 times the fsynced rate (one fsynced commit
/// per execution, 64 callers sharing each commit).
fn raw_commit(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("raw.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        .unwrap();
    let mut g = c.benchmark_group("sqlite");
    g.throughput(Throughput::Elements(1));
    for (name, level) in [
        ("raw_commit/1", "FULL"),
        ("raw_commit_unsynced/1", "NORMAL"),
    ] {
        conn.pragma_update(None, "synchronous", level).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| {
                conn.execute("INSERT INTO t(v) VALUES (zeroblob(100))", [])
                    .unwrap();
            });
        });
    }
    // The disk's share of one fresh key: a claim commit and a result
    // commit, both fsynced (as before claims were relaxed) or the claim
    // not (as now).
    for (name, claim) in [
        ("raw_claim_and_result_synced/1", "FULL"),
        ("raw_claim_and_result/1", "NORMAL"),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                conn.pragma_update(None, "synchronous", claim).unwrap();
                conn.execute("INSERT INTO t(v) VALUES (zeroblob(100))", [])
                    .unwrap();
                conn.pragma_update(None, "synchronous", "FULL").unwrap();
                conn.execute("INSERT INTO t(v) VALUES (zeroblob(1000))", [])
                    .unwrap();
            });
        });
    }
    g.finish();
}

fn sqlite(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("bench.db")).unwrap();
    let engine = Engine::new(Arc::new(store.clone()) as Arc<dyn Store>);
    let fp = fp();
    let next = Arc::new(AtomicU64::new(0));

    let mut g = c.benchmark_group("sqlite");
    g.throughput(Throughput::Elements(1));

    let hot = key(u64::MAX);
    rt.block_on(run(&engine, &hot, &fp));
    g.bench_function("replay/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(run(&engine, &hot, &fp).await);
        });
    });

    g.bench_function("get_done/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(store.get(&hot).await.unwrap().is_some());
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
        b.to_async(&rt).iter_custom(|iters| {
            let next = Arc::clone(&next);
            concurrent(&engine, iters, move |_, _| {
                key(next.fetch_add(1, Ordering::Relaxed))
            })
        });
    });

    // The gateway's stack: replays of a hot key answered from memory, and
    // the timeline entries of the rest gathered per key and flush.
    let gathered = Arc::new(AggregatingStore::new(Arc::new(store.clone())));
    let wrapped = Engine::new(Arc::new(CachedStore::new(
        gathered.clone(),
        CachedStore::DEFAULT_BYTES,
    )));
    // Only the gathering (the cache off): every replay still reads the store.
    let gathered_only = Engine::new(gathered.clone() as Arc<dyn Store>);
    g.bench_function("replay_cached/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(run(&wrapped, &hot, &fp).await);
        });
    });
    g.bench_function("replay_cached/64", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&wrapped, iters, |c, _| key(u64::MAX - 1 - c)));
    });
    g.bench_function("replay_gathered/64", |b| {
        b.to_async(&rt)
            .iter_custom(|iters| concurrent(&gathered_only, iters, |c, _| key(u64::MAX - 1 - c)));
    });
    g.finish();
    rt.block_on(gathered.flush());
    drop((engine, wrapped, gathered_only, gathered));
    store.close();
}

criterion_group!(benches, raw_commit, sqlite);
criterion_main!(benches);
