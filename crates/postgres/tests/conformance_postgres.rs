//! The store conformance suite against the shared PostgreSQL server, in a
//! schema of its own per run.

mod support;

use std::sync::Arc;

use idemgate_engine::Store;

async fn make() -> Arc<dyn Store> {
    Arc::new(support::shared_store().await)
}

idemgate_testkit::conformance_suite!(conformance_postgres, make);
