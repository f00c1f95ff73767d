//! The instrumented decorator must not change store semantics: it runs the
//! conformance suite over the in-memory store.

use std::sync::Arc;

use idemgate_engine::{MemoryStore, Store};
use idemgate_telemetry::InstrumentedStore;

async fn make() -> Arc<dyn Store> {
    Arc::new(InstrumentedStore::new(Arc::new(MemoryStore::new())))
}

idemgate_testkit::conformance_suite!(conformance_instrumented_memory, make);
