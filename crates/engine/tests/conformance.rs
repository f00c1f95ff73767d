//! The store conformance suite against the in-memory store.

use std::sync::Arc;

use idemgate_engine::{MemoryStore, Store};

async fn make() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

idemgate_testkit::conformance_suite!(conformance_memory, make);
