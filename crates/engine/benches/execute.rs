//! `Engine::execute` on the in-memory store: first executions and replays,
//! one caller and 64 concurrent callers; replays again through the replay
//! cache (`CachedStore`) and the timeline gatherer (`AggregatingStore`).
//! The cases are testkit's `execute_bench`, shared with the SQLite store's
//! bench.
//!
//! Run with: `cargo bench -p idemgate-engine --bench execute -- --warm-up-time 1 --measurement-time 3`
//!
//! The 64-caller cases report wall time per operation (total time divided by
//! the operations done by all callers), i.e. the inverse of throughput.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use idemgate_engine::{AggregatingStore, CachedStore, Engine, MemoryStore, Store};
use idemgate_testkit::execute_bench::{execute_cases, group, replay_one, runtime};

/// What each execution answers: a small number.
fn answer() -> u64 {
    42
}

fn memory(c: &mut Criterion) {
    let rt = runtime();
    let engine = rt.block_on(async { Engine::new(Arc::new(MemoryStore::new())) });
    let mut g = group(c, "memory");
    execute_cases(&mut g, &rt, &engine, answer);

    let gathered: Arc<dyn Store> =
        Arc::new(rt.block_on(async { AggregatingStore::new(Arc::new(MemoryStore::new())) }));
    let gathering = Engine::new(Arc::clone(&gathered));
    let cached = Engine::new(Arc::new(CachedStore::new(
        gathered,
        CachedStore::DEFAULT_BYTES,
    )));
    replay_one(&mut g, &rt, "replay_cached/1", &cached, answer);
    replay_one(&mut g, &rt, "replay_gathered/1", &gathering, answer);
    g.finish();
}

criterion_group!(benches, memory);
criterion_main!(benches);
