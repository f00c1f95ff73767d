//! The store conformance suite against the in-memory store, bare and
//! wrapped the way the gateway wraps every store.

use std::sync::Arc;

use idemgate_engine::{AggregatingStore, CachedStore, MemoryStore, Store};

async fn make() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// Replays answered from memory while trusted, their timeline entries
/// gathered: the wrappers keep every answer of the store they wrap.
async fn make_wrapped() -> Arc<dyn Store> {
    let gathered = Arc::new(AggregatingStore::new(Arc::new(MemoryStore::new())));
    Arc::new(CachedStore::new(gathered, CachedStore::DEFAULT_BYTES))
}

idemgate_testkit::conformance_suite!(conformance_memory, make);
idemgate_testkit::conformance_suite!(conformance_memory_wrapped, make_wrapped);
