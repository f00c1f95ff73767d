//! Results this process holds in memory because the store could not take
//! them yet.
//!
//! When the completion write fails with a temporary error (Redis
//! restarting, a PostgreSQL failover, SQLite busy), the owner keeps its
//! lease and retries the write with backoff. Meanwhile the answer exists
//! only here. A retry of the same request on this replica must get that
//! answer, not a 503 because the store is still down, nor a second
//! execution: so the request path looks here before it asks the store,
//! and a duplicate waiting for the key looks here between its polls.
//!
//! An entry lives exactly as long as its owner holds it: it is removed
//! once the write lands, is fenced, or is given up, so nothing here
//! outlives the record's own truth.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use idemgate_engine::{Fingerprint, ScopedKey};

/// Held results, by key.
#[derive(Debug, Default)]
pub(crate) struct HeldResults(Mutex<HashMap<ScopedKey, Held>>);

/// One held result: the request it answers and its encoded response.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) payload: Bytes,
}

impl HeldResults {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ScopedKey, Held>> {
        // Every critical section is a single map operation: a panic cannot
        // leave the map half-changed.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `held` as `key`'s answer until [`HeldResults::drop_held`].
    pub(crate) fn hold(&self, key: &ScopedKey, held: Held) {
        self.map().insert(key.clone(), held);
    }

    /// The owner is done with `key`'s result: written, fenced or given up.
    pub(crate) fn drop_held(&self, key: &ScopedKey) {
        self.map().remove(key);
    }

    /// `key`'s held result, if this process holds one.
    pub(crate) fn get(&self, key: &ScopedKey) -> Option<Held> {
        let map = self.map();
        if map.is_empty() {
            return None;
        }
        map.get(key).cloned()
    }
}
