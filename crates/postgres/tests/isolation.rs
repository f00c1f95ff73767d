//! `complete_in` at every isolation level charging code uses: READ
//! COMMITTED, REPEATABLE READ and SERIALIZABLE. The transaction outlives
//! several heartbeat periods and the lease's own `pending_ttl`, and a
//! second owner tries to claim the key meanwhile: the result commits with
//! the business write, exactly once, and the second owner finds it DONE.
//!
//! The last test shows why [`PostgresStore::lock_in`] exists: without it,
//! at REPEATABLE READ a heartbeat renewal committed after the
//! transaction's snapshot makes the completion fail.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use idemgate_engine::{
    Begin, Engine, Fenced, Fingerprint, LeaseGuard, Policy, ScopedKey, Store, StoreError,
};
use idemgate_postgres::PostgresStore;
use idemgate_testkit::{executed, fresh_key};
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Transaction};

const PENDING_TTL: Duration = Duration::from_millis(600);

fn engine(store: &PostgresStore) -> Engine {
    Engine::new(Arc::new(store.clone())).with_policy(Policy::default().pending_ttl(PENDING_TTL))
}

async fn owner(engine: &Engine, key: &ScopedKey) -> LeaseGuard {
    let fp = Fingerprint::of_value(&serde_json::json!({"charge": 5})).unwrap();
    match engine.begin(key, &fp).await.unwrap() {
        Begin::Owner(guard) => guard,
        other => panic!("expected to own the key, got {other:?}"),
    }
}

async fn charges_table(store: &PostgresStore) -> String {
    let table = format!("{}.iso_charges", support::run_schema());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {table} (op_key text NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    table
}

async fn charged(store: &PostgresStore, table: &str, key: &ScopedKey) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE op_key = $1"
    )))
    .bind(key.storage_id())
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// A transaction begun at isolation `level`.
async fn begin_at(store: &PostgresStore, level: &str) -> Transaction<'static, Postgres> {
    store
        .pool()
        .begin_with(AssertSqlSafe(format!("BEGIN ISOLATION LEVEL {level}")))
        .await
        .unwrap()
}

/// The business write: one charge for `key` in `table`, inside `tx`.
async fn charge(tx: &mut PgConnection, table: &str, key: &ScopedKey) {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (op_key) VALUES ($1)"
    )))
    .bind(key.storage_id())
    .execute(tx)
    .await
    .unwrap();
}

/// Completes `guard`'s lease with "charged" inside `tx`; what the store said.
async fn complete_charged(
    store: &PostgresStore,
    tx: &mut PgConnection,
    guard: &LeaseGuard,
) -> Result<Fenced, StoreError> {
    let done_ttl = Duration::from_secs(60);
    store
        .complete_in(tx, guard.lease(), "charged".into(), done_ttl, &executed())
        .await
}

async fn completes_in_one_transaction(level: &str) {
    let store = support::shared_store().await;
    let table = charges_table(&store).await;
    let engine = engine(&store);
    let key = fresh_key();
    let mut guard = owner(&engine, &key).await;
    let mut tx = begin_at(&store, level).await;
    assert_eq!(
        store.lock_in(&mut tx, &mut guard).await.unwrap(),
        Fenced::Applied
    );
    charge(&mut tx, &table, &key).await;
    // Past several heartbeat periods and the lease itself: a second owner
    // tries to take the key over meanwhile, and must wait for the commit.
    let rival = {
        let engine = crate::engine(&store);
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PENDING_TTL * 2).await;
            let fp = Fingerprint::of_value(&serde_json::json!({"charge": 5})).unwrap();
            engine.begin(&key, &fp).await
        })
    };
    tokio::time::sleep(PENDING_TTL * 3).await;
    assert!(!guard.lease_lost(), "{level}: nobody took the key over");
    let done = complete_charged(&store, &mut tx, &guard)
        .await
        .unwrap_or_else(|e| panic!("{level}: complete_in failed: {e}"));
    assert_eq!(done, Fenced::Applied, "{level}");
    tx.commit()
        .await
        .unwrap_or_else(|e| panic!("{level}: commit failed: {e}"));
    drop(guard);
    match rival.await.unwrap() {
        Ok(Begin::Done(record)) => assert_eq!(record.payload().unwrap().as_ref(), b"charged"),
        Ok(other) => panic!("{level}: the rival must find the result, got {other:?}"),
        Err(e) => panic!("{level}: the rival's claim failed: {e}"),
    }
    assert_eq!(
        charged(&store, &table, &key).await,
        1,
        "{level}: one charge"
    );
    let record = store.get(&key).await.unwrap().expect("a DONE record");
    assert!(record.is_done(), "{level}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed() {
    completes_in_one_transaction("READ COMMITTED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read() {
    completes_in_one_transaction("REPEATABLE READ").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serializable() {
    completes_in_one_transaction("SERIALIZABLE").await;
}

/// A lease taken over before the transaction begins: `lock_in` says so and
/// the caller writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_in_a_lost_lease_is_stale() {
    let store = support::shared_store().await;
    let engine = engine(&store);
    let key = fresh_key();
    let mut guard = owner(&engine, &key).await;
    guard.pause_heartbeat().await;
    tokio::time::sleep(PENDING_TTL + Duration::from_millis(200)).await;
    let _rival = owner(&engine, &key).await;
    let mut tx = begin_at(&store, "SERIALIZABLE").await;
    assert_eq!(
        store.lock_in(&mut tx, &mut guard).await.unwrap(),
        Fenced::Stale
    );
    tx.rollback().await.unwrap();
}

/// Without `lock_in`, at REPEATABLE READ: a renewal committed after the
/// transaction's snapshot makes the completion fail (the reason `lock_in`
/// exists). Nothing is charged: the transaction cannot commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_lock_in_a_renewal_breaks_repeatable_read() {
    let store = support::shared_store().await;
    let table = charges_table(&store).await;
    let engine = engine(&store);
    let key = fresh_key();
    let guard = owner(&engine, &key).await;
    let mut tx = begin_at(&store, "REPEATABLE READ").await;
    charge(&mut tx, &table, &key).await;
    // Two heartbeat periods: at least one renewal commits.
    tokio::time::sleep(PENDING_TTL).await;
    let err = complete_charged(&store, &mut tx, &guard)
        .await
        .expect_err("a concurrent update breaks the snapshot");
    assert!(err.to_string().contains("serializ"), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(charged(&store, &table, &key).await, 0);
}
