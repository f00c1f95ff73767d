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

use criterion::{Criterion, criterion_group, criterion_main};
use idemgate_engine::{AggregatingStore, CachedStore, Engine, Store};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::execute_bench::{
    execute_cases, group, hot_key, replay_many, replay_one, runtime,
};

/// A result of a typical chat completion's size (about 1 KiB of JSON).
fn answer() -> String {
    "The answer is 42. ".repeat(56)
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
    let mut g = group(c, "sqlite");
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
    let mut g = group(c, "sqlite");
    execute_cases(&mut g, &rt, &engine, answer);

    let hot = hot_key();
    g.bench_function("get_done/1", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(store.get(&hot).await.unwrap().is_some());
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
    replay_one(&mut g, &rt, "replay_cached/1", &wrapped, answer);
    replay_many(&mut g, &rt, "replay_cached/64", &wrapped, answer);
    replay_many(&mut g, &rt, "replay_gathered/64", &gathered_only, answer);
    g.finish();
    rt.block_on(gathered.flush());
    drop((engine, wrapped, gathered_only, gathered));
    store.close();
}

criterion_group!(benches, raw_commit, sqlite);
criterion_main!(benches);
