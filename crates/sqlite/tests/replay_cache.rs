//! Replays answered from memory ([`CachedStore`]) and their timeline
//! entries gathered ([`AggregatingStore`]), over a real SQLite file: what
//! reaches the store is counted by a [`CountingStore`] between the wrapper
//! and the store.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idemgate_engine::{
    AggregatingStore, AttemptOutcome, Begin, BeginError, CachedStore, Engine, Policy, ScopedKey,
    Store,
};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::{Calls, CountingStore, fp, key};
use support::{temp_db, temp_store};
use tempfile::TempDir;

/// One replica: its engine over a cache over a counted store.
struct Replica {
    engine: Engine,
    cached: Arc<CachedStore>,
    calls: Arc<Calls>,
}

fn replica(store: &SqliteStore, max_bytes: usize, done_ttl: Duration) -> Replica {
    let counted = CountingStore::new(Arc::new(store.clone()));
    let calls = counted.calls();
    let cached = Arc::new(CachedStore::new(Arc::new(counted), max_bytes));
    let engine = Engine::new(cached.clone()).with_policy(Policy::default().done_ttl(done_ttl));
    Replica {
        engine,
        cached,
        calls,
    }
}

/// A replica over a store on a new file in a temporary directory, and that
/// directory.
fn fresh_replica(max_bytes: usize, done_ttl: Duration) -> (TempDir, Replica) {
    let (dir, store) = temp_store("s.db");
    (dir, replica(&store, max_bytes, done_ttl))
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Runs the work for `k` (it must be fresh) and stores `value`.
async fn execute(engine: &Engine, k: &ScopedKey, value: &str) {
    let done = engine
        .execute(k, &fp("q"), || async {
            Ok::<_, std::io::Error>(value.to_owned())
        })
        .await
        .expect("the work runs");
    assert!(!done.replayed(), "the key was fresh");
}

async fn replayed(engine: &Engine, k: &ScopedKey) -> Option<String> {
    let got = engine
        .execute(k, &fp("q"), || async {
            Ok::<_, std::io::Error>("ran again".to_owned())
        })
        .await
        .expect("a replay or a run");
    got.replayed().then_some(got.value)
}

/// Runs the work for the fresh key `name` on `r`, answering "answer", and
/// checks that the next request replays it; the key.
async fn answered(r: &Replica, name: &str) -> ScopedKey {
    let k = key(name);
    execute(&r.engine, &k, "answer").await;
    assert_eq!(replayed(&r.engine, &k).await.as_deref(), Some("answer"));
    k
}

#[tokio::test]
async fn a_replay_from_the_cache_makes_no_store_call() {
    let (_dir, r) = fresh_replica(1 << 20, DAY);
    let k = answered(&r, "hot").await;
    let reads = r.calls.record_reads();
    for _ in 0..20 {
        assert_eq!(replayed(&r.engine, &k).await.as_deref(), Some("answer"));
    }
    assert_eq!(
        r.calls.record_reads(),
        reads,
        "replays within the window never reach the store"
    );
    assert_eq!(r.cached.stats().hits.load(Ordering::Relaxed), 20);
}

#[tokio::test]
async fn a_record_close_to_its_expiry_is_read_from_the_store_and_expires() {
    // Shorter than the margin: never trusted from memory.
    let ttl = Duration::from_secs(2);
    assert!(ttl < CachedStore::EXPIRY_MARGIN);
    let (_dir, r) = fresh_replica(1 << 20, ttl);
    let k = key("short-lived");
    execute(&r.engine, &k, "answer").await;
    let reads = r.calls.record_reads();
    assert_eq!(replayed(&r.engine, &k).await.as_deref(), Some("answer"));
    assert_eq!(replayed(&r.engine, &k).await.as_deref(), Some("answer"));
    assert_eq!(
        r.calls.record_reads(),
        reads + 2,
        "each replay asked the store"
    );
    assert!(r.cached.is_empty());
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert_eq!(
        replayed(&r.engine, &k).await,
        None,
        "past its expiry the key runs again"
    );
}

#[tokio::test]
async fn a_forget_on_another_replica_holds_everywhere_once_it_returns() {
    let (_dir, path) = temp_db("shared.db");
    // Two processes' worth: each its own handle on the file, and its cache.
    let store_a = SqliteStore::open(&path).expect("open a");
    let store_b = SqliteStore::open(&path).expect("open b");
    let a = replica(&store_a, 1 << 20, DAY);
    let b = replica(&store_b, 1 << 20, DAY);
    let k = key("to-forget");
    execute(&a.engine, &k, "first").await;
    assert_eq!(replayed(&b.engine, &k).await.as_deref(), Some("first"));
    assert_eq!(replayed(&b.engine, &k).await.as_deref(), Some("first"));
    assert_eq!(
        b.cached.stats().hits.load(Ordering::Relaxed),
        1,
        "b holds a copy"
    );

    let note = idemgate_engine::Attempt {
        at_ms: idemgate_engine::backend::now_ms(),
        replica: "operator".into(),
        outcome: AttemptOutcome::Forgotten,
        status: None,
        latency_us: 0,
        repeated: None,
    };
    assert!(a.cached.forget(&k, &note, DAY).await.expect("forget"));

    // Once the forget has returned, no replica answers from the old record:
    // of many concurrent requests on both replicas, one runs the work and
    // the others find it running.
    let mut racers = tokio::task::JoinSet::new();
    for n in 0..16 {
        let engine = if n % 2 == 0 { &a.engine } else { &b.engine }.clone();
        let k = k.clone();
        racers.spawn(async move { engine.begin(&k, &fp("q")).await.expect("begin") });
    }
    let (mut owners, mut inflight) = (Vec::new(), 0);
    while let Some(begun) = racers.join_next().await {
        match begun.expect("racer") {
            Begin::Owner(guard) => owners.push(guard),
            Begin::Inflight(_) => inflight += 1,
            Begin::Done(r) => panic!("answered from the forgotten record: {r:?}"),
        }
    }
    assert_eq!((owners.len(), inflight), (1, 15));
    for guard in owners {
        guard.release(None).await.map(|_| ()).expect("release");
    }
    execute(&b.engine, &k, "second").await;
    assert_eq!(replayed(&a.engine, &k).await.as_deref(), Some("second"));
}

#[tokio::test]
async fn a_mismatch_from_the_cache_is_the_stores_answer() {
    let (_dir, store) = temp_store("s.db");
    let r = replica(&store, 1 << 20, DAY);
    let bare = Engine::new(Arc::new(store.clone()));
    let k = answered(&r, "reused").await;
    let reads = r.calls.record_reads();
    assert!(matches!(
        r.engine.begin(&k, &fp("another request")).await,
        Err(BeginError::Mismatch)
    ));
    assert_eq!(r.calls.record_reads(), reads, "decided from the copy");
    assert!(matches!(
        bare.begin(&k, &fp("another request")).await,
        Err(BeginError::Mismatch)
    ));
    // Another tenant with the same client key has a key of its own.
    let other = ScopedKey::new("tenant-b", k.namespace.clone(), k.key.clone());
    assert_eq!(replayed(&r.engine, &other).await, None, "runs for tenant b");
}

#[tokio::test]
async fn the_byte_bound_evicts_the_oldest_copies() {
    let big = "x".repeat(10_000);
    // Room for about three copies.
    let (_dir, r) = fresh_replica(35_000, DAY);
    let keys: Vec<ScopedKey> = (0..6).map(|n| key(&format!("k{n}"))).collect();
    for k in &keys {
        execute(&r.engine, k, &big).await;
        assert!(replayed(&r.engine, k).await.is_some());
    }
    assert!(r.cached.bytes() <= 35_000, "{} bytes", r.cached.bytes());
    assert_eq!(r.cached.len(), 3);
    let reads = r.calls.record_reads();
    assert!(replayed(&r.engine, &keys[5]).await.is_some());
    assert_eq!(r.calls.record_reads(), reads, "the newest is held");
    assert!(replayed(&r.engine, &keys[0]).await.is_some());
    assert_eq!(r.calls.record_reads(), reads + 1, "the oldest was evicted");
}

#[tokio::test]
async fn a_trusted_copy_is_checked_again_after_the_window() {
    let (_dir, r) = fresh_replica(1 << 20, DAY);
    let k = answered(&r, "checked").await;
    let reads = r.calls.record_reads();
    tokio::time::sleep(CachedStore::TRUST + Duration::from_millis(100)).await;
    assert!(replayed(&r.engine, &k).await.is_some());
    assert_eq!(r.calls.record_reads(), reads + 1);
}

#[tokio::test]
async fn gathered_replays_account_for_every_replay_in_fewer_entries() {
    let (_dir, store) = temp_store("s.db");
    let counted = CountingStore::new(Arc::new(store.clone()));
    let calls = counted.calls();
    // A flush interval longer than the test: only the explicit flush writes.
    let gathered = Arc::new(AggregatingStore::with_interval(
        Arc::new(counted),
        Duration::from_secs(3600),
    ));
    let engine = Engine::new(gathered.clone()).with_replica("replica-a");
    let k = key("replayed-often");
    execute(&engine, &k, "answer").await;
    for _ in 0..50 {
        assert!(replayed(&engine, &k).await.is_some());
    }
    assert_eq!(calls.attempts(), 0, "nothing written before the flush");
    gathered.flush().await;
    assert_eq!(calls.attempts(), 1, "one entry for the 50 replays");
    let timeline = loop {
        let t = store.timeline(&k).await.expect("timeline");
        if t.len() >= 2 {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let outcomes: Vec<_> = timeline.iter().map(|a| (a.outcome, a.count())).collect();
    assert_eq!(
        outcomes,
        [
            (AttemptOutcome::Executed, 1),
            (AttemptOutcome::Replayed, 50)
        ]
    );
    let r = timeline[1].repeated.expect("a gathered entry");
    assert!(r.last_at_ms >= timeline[1].at_ms);
    assert_eq!(timeline[1].replica, "replica-a");

    // A mismatch goes straight through, after the replays gathered before it.
    assert!(replayed(&engine, &k).await.is_some());
    assert!(matches!(
        engine.begin(&k, &fp("other")).await,
        Err(BeginError::Mismatch)
    ));
    assert_eq!(calls.attempts(), 3);
}
