//! Per-key wake-ups for tasks waiting on a PENDING record.
//!
//! Waiters register interest in one key; a store calls [`KeyedNotify::notify`]
//! when that key's record changes. No polling and no thundering herd: only
//! the waiters of the changed key wake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// A map from storage id to the waiters of that key.
#[derive(Debug, Default)]
pub struct KeyedNotify {
    /// Held only to look up or insert an entry, never across an `.await`.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
}

impl KeyedNotify {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until `id` is notified or `max` passes.
    pub async fn wait(&self, id: &str, max: Duration) {
        let notify = {
            let mut map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(map.entry(id.to_owned()).or_default())
        };
        let _ = tokio::time::timeout(max, notify.notified()).await;
        // Drop the entry once nobody else holds it (the map's own Arc + ours).
        let mut map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get(id)
            && Arc::strong_count(n) <= 2
        {
            map.remove(id);
        }
    }

    /// Wakes every task waiting on `id`.
    pub fn notify(&self, id: &str) {
        let map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get(id) {
            n.notify_waiters();
        }
    }

    /// Whether anyone waits at all (lets stores skip the lookup).
    pub fn is_empty(&self) -> bool {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}
