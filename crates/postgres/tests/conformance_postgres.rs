//! The store conformance suite against the shared PostgreSQL server, in a
//! schema of its own per run: with the defaults (synchronous claims,
//! claims and completions batched), with claims committed with
//! `synchronous_commit = off`, and with every claim and completion a
//! statement of its own (batching off).

mod support;

use std::sync::Arc;

use idemgate_engine::Store;
use idemgate_postgres::{PostgresOptions, PostgresStore};

async fn make() -> Arc<dyn Store> {
    Arc::new(support::shared_store().await)
}

/// The same schema (one store-wide sequence), claims not synchronised.
async fn make_unsynchronised_claims() -> Arc<dyn Store> {
    // Opening the shared store first creates the schema (and cleans up).
    let shared = support::shared_store().await;
    let opts = PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(8)
        .synchronous_claims(false);
    let store = PostgresStore::from_pool_with(shared.pool().clone(), opts)
        .await
        .expect("a store over the shared pool");
    Arc::new(store)
}

/// The same schema, every claim and completion its own statement.
async fn make_unbatched() -> Arc<dyn Store> {
    let shared = support::shared_store().await;
    let opts = PostgresOptions::default()
        .schema(support::run_schema())
        .max_connections(8)
        .batch_statements(0);
    let store = PostgresStore::from_pool_with(shared.pool().clone(), opts)
        .await
        .expect("a store over the shared pool");
    Arc::new(store)
}

idemgate_testkit::conformance_suite!(conformance_postgres, make);
idemgate_testkit::conformance_suite!(conformance_postgres_unbatched, make_unbatched);
idemgate_testkit::conformance_suite!(
    conformance_postgres_unsynchronised_claims,
    make_unsynchronised_claims
);
