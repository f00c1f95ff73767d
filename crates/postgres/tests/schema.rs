//! Schema upgrades in place: a database at version 1 (the completion's
//! timeline entry as a timeline row) is brought to version 2 (the entry in
//! the record's row) by the next store that connects, and what it held
//! before reads back the same.

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

async fn outcomes(store: &PostgresStore, key: &idemgate_engine::ScopedKey) -> Vec<AttemptOutcome> {
    let timeline = store.timeline(key).await.unwrap();
    timeline.iter().map(|a| a.outcome).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_upgraded_and_keeps_its_records() {
    let schema = format!("{}_upgrade", support::run_schema());
    let _ = support::shared_store().await; // fails, not skips, without a server under CI
    let store = connect(&schema).await;
    let old = fresh_key();
    let lease = acquired(store.claim(&old, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        complete_executed(&store, &lease, b"old", LONG).await,
        Fenced::Applied
    );
    // Back to version 1's layout: the completion's entry as a timeline row.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {schema}.timeline (id, entry, keep_until) \
           SELECT id, entry, expires_at FROM {schema}.records WHERE entry IS NOT NULL; \
         ALTER TABLE {schema}.records DROP COLUMN entry; \
         DELETE FROM {schema}.idemgate_schema_version WHERE version = 2;"
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
    assert_eq!(version, 2);
    let record = store.get(&old).await.unwrap().expect("the DONE record");
    assert_eq!(record.payload().map(|p| p.to_vec()), Some(b"old".to_vec()));
    assert_eq!(outcomes(&store, &old).await, [AttemptOutcome::Executed]);

    let new = fresh_key();
    let lease = acquired(store.claim(&new, &fp("a"), LONG).await.unwrap());
    assert_eq!(
        complete_executed(&store, &lease, b"new", LONG).await,
        Fenced::Applied
    );
    assert_eq!(outcomes(&store, &new).await, [AttemptOutcome::Executed]);
    let in_row: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.records WHERE id = $1 AND entry->>'outcome' = 'executed'"
    )))
    .bind(new.storage_id())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(in_row, 1, "the new completion's entry is in its row");
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(store.pool())
        .await
        .unwrap();
}
