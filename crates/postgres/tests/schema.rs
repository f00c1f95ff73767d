//! Schema upgrades in place: a database at an older version is brought to
//! this build's by the next store that connects, and what it held before
//! reads back the same. Version 2 moved the completion's timeline entry
//! from a timeline row into the record's row; version 3 dropped the
//! records' CHECK constraints (each cost every writing statement a
//! compile of its expression).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use idemgate_engine::{AttemptOutcome, Fenced, Store};
use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::{acquired, complete_executed, fp, fresh_key};
use sqlx::AssertSqlSafe;

const LONG: std::time::Duration = std::time::Duration::from_secs(3600);

async fn connect(schema: &str) -> PostgresStore {
    let opts = PostgresOptions::default()
        .schema(schema)
        .max_connections(2)
        .purge_interval(None);
    PostgresStore::connect_with(&support::shared_url(), opts)
        .await
        .unwrap()
}

/// Version 1's CHECK constraints, as its migration named them.
fn version_1_checks(schema: &str) -> String {
    format!(
        "ALTER TABLE {schema}.records \
           ADD CONSTRAINT records_state_check CHECK (state IN ('P', 'D')), \
           ADD CONSTRAINT records_check CHECK (state = 'P' OR payload IS NOT NULL);"
    )
}

async fn check_constraints(store: &PostgresStore, schema: &str) -> Vec<String> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT conname::text FROM pg_constraint \
         WHERE conrelid = '{schema}.records'::regclass AND contype = 'c' ORDER BY conname"
    )))
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// A fresh key claimed and completed with `body`.
async fn done_key(store: &PostgresStore, body: &'static [u8]) -> idemgate_engine::ScopedKey {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        complete_executed(store, &lease, body, LONG).await,
        Fenced::Applied
    );
    key
}

/// The stored answer of `key`'s DONE record.
async fn payload(store: &PostgresStore, key: &idemgate_engine::ScopedKey) -> Option<Vec<u8>> {
    let record = store.get(key).await.unwrap().expect("the DONE record");
    record.payload().map(|p| p.to_vec())
}

async fn drop_schema(store: &PostgresStore, schema: &str) {
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(store.pool())
        .await
        .unwrap();
}

async fn outcomes(store: &PostgresStore, key: &idemgate_engine::ScopedKey) -> Vec<AttemptOutcome> {
    let timeline = store.timeline(key).await.unwrap();
    timeline.iter().map(|a| a.outcome).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_upgraded_and_keeps_its_records() {
    let schema = format!("{}_upgrade", support::run_schema());
    let _ = support::shared_store().await; // fails, not skips, without a server under CI
    let store = connect(&schema).await;
    let old = done_key(&store, b"old").await;
    // Back to version 1's layout: the completion's entry as a timeline row.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {schema}.timeline (id, entry, keep_until) \
           SELECT id, entry, expires_at FROM {schema}.records WHERE entry IS NOT NULL; \
         ALTER TABLE {schema}.records DROP COLUMN entry; \
         {checks} \
         DELETE FROM {schema}.idemgate_schema_version WHERE version >= 2;",
        checks = version_1_checks(&schema),
    )))
    .execute(store.pool())
    .await
    .unwrap();
    drop(store);

    let store = connect(&schema).await;
    let version: i32 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT max(version) FROM {schema}.idemgate_schema_version"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(version, 3);
    assert!(check_constraints(&store, &schema).await.is_empty());
    assert_eq!(payload(&store, &old).await, Some(b"old".to_vec()));
    assert_eq!(outcomes(&store, &old).await, [AttemptOutcome::Executed]);

    let new = done_key(&store, b"new").await;
    assert_eq!(outcomes(&store, &new).await, [AttemptOutcome::Executed]);
    let in_row: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.records WHERE id = $1 AND entry->>'outcome' = 'executed'"
    )))
    .bind(new.storage_id())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(in_row, 1, "the new completion's entry is in its row");
    drop_schema(&store, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_schema_loses_its_check_constraints_and_keeps_its_records() {
    let schema = format!("{}_upgrade_v2", support::run_schema());
    let _ = support::shared_store().await; // fails, not skips, without a server under CI
    let store = connect(&schema).await;
    assert!(
        check_constraints(&store, &schema).await.is_empty(),
        "a new schema is created at version 3, without CHECK constraints"
    );
    let done = done_key(&store, b"kept").await;
    let pending = fresh_key();
    let pending_lease = acquired(store.claim(&pending, &fp("b"), LONG).await.unwrap());
    // Back to version 2: the constraints again, and no version 3 row.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "{checks} DELETE FROM {schema}.idemgate_schema_version WHERE version = 3;",
        checks = version_1_checks(&schema),
    )))
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(
        check_constraints(&store, &schema).await,
        ["records_check", "records_state_check"]
    );
    drop(store);

    let store = connect(&schema).await;
    assert!(check_constraints(&store, &schema).await.is_empty());
    assert_eq!(payload(&store, &done).await, Some(b"kept".to_vec()));
    // The lease taken before the upgrade still completes after it.
    assert_eq!(
        complete_executed(&store, &pending_lease, b"after", LONG).await,
        Fenced::Applied
    );
    assert_eq!(payload(&store, &pending).await, Some(b"after".to_vec()));
    drop_schema(&store, &schema).await;
}

/// Without the constraints, a row no statement of the store would write
/// is still refused when read: a state other than P or D, or a DONE row
/// without its payload, is a corrupt record, never a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_store_would_never_write_reads_as_corrupt() {
    let schema = format!("{}_corrupt_rows", support::run_schema());
    let _ = support::shared_store().await; // fails, not skips, without a server under CI
    let store = connect(&schema).await;
    for (state, payload) in [("X", "'\\x00'::bytea"), ("D", "NULL")] {
        let key = fresh_key();
        acquired(store.claim(&key, &fp("a"), LONG).await.unwrap());
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {schema}.records SET state = '{state}', payload = {payload} WHERE id = $1"
        )))
        .bind(key.storage_id())
        .execute(store.pool())
        .await
        .unwrap();
        let err = store.get(&key).await.expect_err("a corrupt row");
        assert_eq!(
            err.kind(),
            idemgate_engine::StoreErrorKind::Corrupt,
            "state {state}: {err}"
        );
        let err = store
            .claim(&key, &fp("a"), LONG)
            .await
            .expect_err("a claim that reads a corrupt row");
        assert_eq!(err.kind(), idemgate_engine::StoreErrorKind::Corrupt);
    }
    drop_schema(&store, &schema).await;
}
