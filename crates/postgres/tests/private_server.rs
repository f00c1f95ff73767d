//! Tests that need a PostgreSQL of their own: statements counted with
//! `pg_stat_statements`, and a crash-restart of the server under load.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{Claim, Engine, Fenced, ScopedKey, Store, StoreErrorKind};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::postgres_server::Server as Private;
use idemgate_testkit::round_trips::{
    assert_replays_in_order, claim_and_complete, claim_done, record_replays, run, timeline_reaches,
    warm_up, warm_up_timeline,
};
use idemgate_testkit::{executed, fp, fresh_key};

const LONG: Duration = Duration::from_secs(300);

/// Keys whose DONE write was acknowledged, with the payload written.
type Acked = Arc<Mutex<Vec<(ScopedKey, Vec<u8>)>>>;

async fn private() -> Private {
    tokio::task::spawn_blocking(Private::start).await.unwrap()
}

/// Statements executed by the store, from `pg_stat_statements` (the
/// counting queries themselves excluded). With a one-connection pool whose
/// statements are already prepared, each statement is one round trip
/// (Bind/Execute/Sync sent together).
async fn statements(admin: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
         WHERE query NOT ILIKE '%pg_stat_statements%'",
    )
    .fetch_one(admin)
    .await
    .unwrap()
}

/// A private server with `pg_stat_statements`, a one-connection pool on
/// it to count with, and a store with a one-connection pool (no purges).
async fn counted() -> (Private, sqlx::PgPool, PostgresStore) {
    let pg = private().await;
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg.url())
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .unwrap();
    let opts = PostgresOptions::default()
        .max_connections(1)
        .purge_interval(None);
    let store = PostgresStore::connect_with(&pg.url(), opts).await.unwrap();
    (pg, admin, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_operation() {
    let (_pg, admin, store) = counted().await;
    // Warm up: prepare every statement on the pool's one connection.
    warm_up(&store).await;

    let k = fresh_key();
    let before = statements(&admin).await;
    assert_eq!(claim_and_complete(&store, &k, b"r").await, Fenced::Applied);
    assert_eq!(statements(&admin).await - before, 2, "first execution");

    let before = statements(&admin).await;
    claim_done(&store, &k).await;
    assert_eq!(statements(&admin).await - before, 1, "replay");

    let before = statements(&admin).await;
    store.get(&k).await.unwrap();
    store.timeline(&k).await.unwrap();
    assert_eq!(statements(&admin).await - before, 2, "get + timeline");

    let engine = Engine::new(Arc::new(store.clone()));
    let k = fresh_key();
    let before = statements(&admin).await;
    assert!(!run(&engine, &k, 1).await.replayed());
    assert_eq!(
        statements(&admin).await - before,
        2,
        "engine first execution"
    );
    // A replay is the claim; the timeline entry the engine adds for it is
    // written by the background writer, off the request path (one more
    // statement, counted once it has landed; the polls are subtracted).
    let before = statements(&admin).await;
    assert!(run(&engine, &k, 2).await.replayed());
    let polls = landed(&store, &k, 2).await;
    assert_eq!(
        statements(&admin).await - before - polls,
        2,
        "engine replay: claim + background timeline entry"
    );
}

/// Waits until `key`'s timeline holds `n` entries; returns how many
/// timeline reads (statements) that took.
async fn landed(store: &PostgresStore, key: &ScopedKey, n: usize) -> i64 {
    i64::try_from(timeline_reaches(store, key, n).await).unwrap()
}

/// Timeline entries of replays are batched: 64 entries queued without the
/// caller yielding (one thread) are written with one statement, and all of
/// them land, in order.
#[tokio::test]
async fn background_timeline_entries_are_batched() {
    let (_pg, admin, store) = counted().await;
    warm_up_timeline(&store).await;

    let k = fresh_key();
    let before = statements(&admin).await;
    record_replays(&store, &k, 64).await;
    let polls = landed(&store, &k, 64).await;
    assert_eq!(
        statements(&admin).await - before - polls,
        1,
        "64 entries, one statement"
    );
    assert_replays_in_order(&store, &k, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_restart_under_load_keeps_every_acknowledged_done() {
    let pg = Arc::new(private().await);
    let opts = PostgresOptions::default()
        .max_connections(8)
        .operation_timeout(Duration::from_secs(3));
    let store = PostgresStore::connect_with(&pg.url(), opts).await.unwrap();

    let acknowledged: Acked = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (store, acknowledged, errors, stop) = (
            store.clone(),
            Arc::clone(&acknowledged),
            Arc::clone(&errors),
            Arc::clone(&stop),
        );
        workers.push(tokio::spawn(async move {
            let bound = Duration::from_secs(30); // a hang detector, not a timing claim
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let k = fresh_key();
                let claim = tokio::time::timeout(bound, store.claim(&k, &fp("{}"), LONG))
                    .await
                    .expect("claim hung");
                let lease = match claim {
                    Ok(Claim::Acquired(l)) => l,
                    Ok(Claim::Existing(r)) => panic!("fresh key already held: {r:?}"),
                    Err(e) => {
                        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let body = format!("worker {w} op {n}").into_bytes();
                let done = tokio::time::timeout(
                    bound,
                    store.complete(&lease, Bytes::from(body.clone()), LONG, &executed()),
                )
                .await
                .expect("complete hung");
                match done {
                    Ok(Fenced::Applied) => acknowledged.lock().unwrap().push((k, body)),
                    Ok(Fenced::Stale) => panic!("nobody else can hold this lease"),
                    Err(e) => {
                        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }

    let acked = |a: &Acked| a.lock().unwrap().len();
    while acked(&acknowledged) < 50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Crash: no shutdown checkpoint, recovery replays the WAL.
    let p = Arc::clone(&pg);
    tokio::task::spawn_blocking(move || p.stop("immediate"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = Arc::clone(&pg);
    tokio::task::spawn_blocking(move || p.restart())
        .await
        .unwrap();
    let after_restart = acked(&acknowledged);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked(&acknowledged) < after_restart + 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert!(
        errors.load(Ordering::Relaxed) > 0,
        "a crash under load produced no errors at all"
    );

    let all = acknowledged.lock().unwrap().clone();
    println!(
        "acknowledged {} DONE records, {} operations failed with Unavailable",
        all.len(),
        errors.load(Ordering::Relaxed)
    );
    for (k, body) in &all {
        let rec = store
            .get(k)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged DONE lost: {k:?}"));
        assert_eq!(rec.payload().map(|p| p.to_vec()), Some(body.clone()));
    }
}

/// A private server whose WAL writer sleeps 10 s: a commit that does not
/// flush its own WAL is not flushed by anyone else before the crash the
/// test causes.
async fn private_with_a_lazy_wal_writer() -> Private {
    tokio::task::spawn_blocking(|| Private::start_with("-c wal_writer_delay=10000"))
        .await
        .unwrap()
}

/// Crashes the server (no checkpoint, no WAL write) and starts it again.
fn crash(pg: &Private) {
    tokio::task::block_in_place(|| {
        pg.stop("immediate");
        pg.restart();
    });
}

async fn claim_then_crash(synchronous_claims: bool) -> (Option<idemgate_engine::Record>, u64, u64) {
    let pg = private_with_a_lazy_wal_writer().await;
    let opts = PostgresOptions::default()
        .max_connections(2)
        .purge_interval(None)
        .synchronous_claims(synchronous_claims);
    let store = PostgresStore::connect_with(&pg.url(), opts.clone())
        .await
        .unwrap();
    let k = fresh_key();
    let Claim::Acquired(lease) = store.claim(&k, &fp("{}"), LONG).await.unwrap() else {
        panic!("a fresh key is free");
    };
    store.pool().close().await;
    crash(&pg);
    let store = PostgresStore::connect_with(&pg.url(), opts).await.unwrap();
    let found = store.get(&k).await.unwrap();
    let Claim::Acquired(next) = store.claim(&fresh_key(), &fp("{}"), LONG).await.unwrap() else {
        panic!("a fresh key is free");
    };
    (found, lease.fence, next.fence)
}

/// The default: an acknowledged claim survives a database crash, so a
/// retry finds the key in flight rather than running it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_claim_survives_a_database_crash() {
    let (found, before, after) = claim_then_crash(true).await;
    assert!(
        found.is_some_and(|r| !r.is_done()),
        "the PENDING record is still there"
    );
    assert!(after > before);
}

/// `synchronous_claims(false)`: the claim's commit did not wait for its
/// WAL, so the crash takes it (this is the trade the option documents),
/// and the fences handed out after the restart are still above the one
/// its owner holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsynchronised_claim_can_be_lost_in_a_crash_but_its_fence_is_not_reused() {
    let (found, before, after) = claim_then_crash(false).await;
    assert_eq!(found, None, "the claim was lost with the crash");
    assert!(
        after > before,
        "fence {after} after the crash, {before} before"
    );
}

/// Every statement is prepared once per connection and then only bound and
/// executed: ten claims on a one-connection pool use one prepared claim
/// statement ten times (PostgreSQL counts each execution of a prepared
/// statement as a generic or a custom plan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_prepared_once_and_reused() {
    let pg = private().await;
    for synchronous_claims in [true, false] {
        let schema = if synchronous_claims {
            "prep_sync"
        } else {
            "prep_async"
        };
        let opts = PostgresOptions::default()
            .schema(schema)
            .max_connections(1)
            .purge_interval(None)
            .synchronous_claims(synchronous_claims);
        let store = PostgresStore::connect_with(&pg.url(), opts).await.unwrap();
        for _ in 0..10 {
            let done = claim_and_complete(&store, &fresh_key(), b"r").await;
            assert_eq!(done, Fenced::Applied);
        }
        // The store's one connection: the one that ran the claims.
        let uses: Vec<i64> = store
            .on_own_connection(async |c: &mut sqlx::PgConnection| {
                sqlx::query_scalar(
                    "SELECT generic_plans + custom_plans FROM pg_prepared_statements \
                     WHERE (statement LIKE '%nextval(%' OR statement LIKE '%SET state = ''D''%') \
                       AND statement NOT LIKE '%pg_prepared_statements%' \
                     ORDER BY statement",
                )
                .fetch_all(c)
                .await
            })
            .await
            .unwrap();
        assert_eq!(uses, [10, 10], "claim and complete, each prepared once");
    }
}
