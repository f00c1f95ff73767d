//! Latency of claim, complete and replay against a real PostgreSQL, as p50/p99.
//!
//! Run with: `cargo bench -p idemgate-postgres --bench latency`
//! (`IDEMGATE_BENCH_POSTGRES_URL` overrides
//! `postgres://postgres@127.0.0.1:5432/test`; the bench uses a schema of its
//! own and drops it). Under `cargo test` it runs a few iterations only, as a
//! smoke test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use idemgate_postgres::{PostgresOptions, PostgresStore};
use idemgate_testkit::latency::{bench_keys, claim_complete_replay, report};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::var("IDEMGATE_BENCH_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("igbench_{:08x}", rand::random::<u32>());
    let opts = PostgresOptions::default()
        .schema(&schema)
        .max_connections(2)
        .purge_interval(None);
    let connect =
        async |opts: PostgresOptions| PostgresStore::connect_with(&url, opts).await.unwrap();
    let store = connect(opts.clone()).await;
    // The same store with timeline entries written on the request path, to
    // show what the background writer saves a replay.
    let inline = connect(opts.clone().background_timeline(false)).await;
    // The same store with claims committed without waiting for the WAL
    // flush (`claim_commit=async`).
    let unsynced = connect(opts.synchronous_claims(false)).await;
    let samples = claim_complete_replay(
        Arc::new(store.clone()),
        Arc::new(inline),
        Some(("claim.async", Arc::new(unsynced))),
        bench_keys(),
    )
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(store.pool())
        .await
        .unwrap();
    println!("postgres store at {url}, 1 KiB payload, one client task:");
    for (name, samples) in samples {
        report(name, samples);
    }
}
