//! [`AggregatingStore`]: a [`Store`] wrapper that writes the timeline
//! entries of replays as one entry per key, replica and flush, with a count.
//!
//! Every replay adds a timeline entry ([`Engine::begin`](crate::Engine::begin)
//! notes it). Written one by one, a hot key's replays cost the store one
//! row each: under load that was most of the SQLite writer's work, and a
//! script call or a row per replay on Redis and PostgreSQL. The entries
//! say nothing new beyond "replayed again, at this time, here", so the
//! wrapper gathers the replays of each (key, replica, status) in memory and
//! writes them every [`FLUSH_EVERY`] as one [`Attempt`] whose
//! [`Repeated`] holds how many there were and when the last one started.
//! The timeline still accounts for every replay: `keys show`, the admin
//! timeline and the dashboard add the counts up.
//!
//! Why in front of the store rather than in each store's background
//! writer: one implementation serves every store, and gathered entries
//! never reach the store's queue at all (for SQLite, not even the writer
//! thread's channel). Every other entry (executions, conflicts,
//! mismatches, …) passes straight through, after the key's gathered
//! replays if it has any (a forget too): entries of one key reach the
//! store in the order they happened, which decides the order of entries
//! stamped with the same millisecond.
//!
//! The `Store` contract allows the delay: timeline appends are best effort
//! and may be acknowledged before they are durable. Gathered entries are
//! lost if the process dies before their flush; [`AggregatingStore::flush`]
//! writes them at once (the gateway calls it at shutdown), and dropping the
//! wrapper flushes too. Memory is bounded: past [`MAX_PENDING`] gathered
//! keys, further replays are written through one by one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::{Attempt, AttemptOutcome, BoxFuture, Repeated, ScopedKey, Store, StoreError};

/// How often gathered replays are written.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// Most keys gathered between two flushes.
pub(crate) const MAX_PENDING: usize = 65_536;

/// The replays of one (key, replica, status) since the last flush.
#[derive(Debug)]
struct Gathered {
    replica: String,
    status: Option<u16>,
    first_ms: u64,
    last_ms: u64,
    count: u64,
    latency_us: u64,
    ttl: Duration,
}

impl Gathered {
    fn new(a: &Attempt, ttl: Duration) -> Self {
        Self {
            replica: a.replica.clone(),
            status: a.status,
            first_ms: a.at_ms,
            last_ms: a.last_at_ms(),
            count: a.count(),
            latency_us: a.latency_us,
            ttl,
        }
    }

    fn add(&mut self, a: &Attempt, ttl: Duration) {
        self.first_ms = self.first_ms.min(a.at_ms);
        self.last_ms = self.last_ms.max(a.last_at_ms());
        self.count = self.count.saturating_add(a.count());
        self.latency_us = self.latency_us.max(a.latency_us);
        self.ttl = self.ttl.max(ttl);
    }

    fn attempt(&self) -> Attempt {
        Attempt {
            at_ms: self.first_ms,
            replica: self.replica.clone(),
            outcome: AttemptOutcome::Replayed,
            status: self.status,
            latency_us: self.latency_us,
            repeated: (self.count > 1).then_some(Repeated {
                count: self.count,
                last_at_ms: self.last_ms,
            }),
        }
    }
}

/// The gathered groups and the flush task's signals.
#[derive(Debug, Default)]
struct Pending {
    /// By key, then one entry per (replica, status): almost always one.
    groups: Mutex<Groups>,
    /// Set when the wrapper is dropped: the task flushes once more and ends.
    closing: std::sync::atomic::AtomicBool,
    wake: Notify,
}

impl Pending {
    fn take(&self) -> Groups {
        std::mem::take(&mut *self.groups.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

type Groups = HashMap<ScopedKey, Vec<Gathered>>;

/// Writes what was gathered; each group is one `record_attempt`, all of
/// them in flight together.
async fn write(inner: &dyn Store, groups: Groups) {
    if groups.is_empty() {
        return;
    }
    let writes = groups
        .iter()
        .flat_map(|(key, gs)| gs.iter().map(move |g| (key, g)));
    let writes = writes.map(|(key, g)| async move {
        let a = g.attempt();
        if let Err(e) = inner.record_attempt(key, &a, g.ttl).await {
            tracing::warn!(error = %e, replays = g.count, "gathered replay entries not recorded");
        }
    });
    futures_util::future::join_all(writes).await;
}

/// A store whose replay timeline entries are gathered and written once per
/// key, replica and flush (see the module documentation).
pub struct AggregatingStore {
    inner: Arc<dyn Store>,
    pending: Arc<Pending>,
    /// Whether a flush task runs (a runtime was there at construction).
    background: bool,
}

impl std::fmt::Debug for AggregatingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatingStore")
            .field("inner", &self.inner)
            .field("background", &self.background)
            .finish_non_exhaustive()
    }
}

impl AggregatingStore {
    /// Wraps `inner`, flushing every 200 ms.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self::with_interval(inner, FLUSH_EVERY)
    }

    /// Wraps `inner`, flushing every `every`. Outside a tokio runtime
    /// nothing is gathered: every entry is written through.
    pub fn with_interval(inner: Arc<dyn Store>, every: Duration) -> Self {
        let pending = Arc::new(Pending::default());
        let background = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(flush_loop(
                    Arc::clone(&inner),
                    Arc::clone(&pending),
                    every.max(Duration::from_millis(1)),
                ));
                true
            }
            Err(_) => false,
        };
        Self {
            inner,
            pending,
            background,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// Writes every gathered entry now, and returns once the store took
    /// them (as `record_attempt` does: a store with a background writer
    /// queues them).
    pub async fn flush(&self) {
        write(&*self.inner, self.pending.take()).await;
    }

    /// Gathers `attempt` if it is a replay and there is room; `false`
    /// when it must be written through.
    fn gather(&self, key: &ScopedKey, attempt: &Attempt, ttl: Duration) -> bool {
        if !self.background || attempt.outcome != AttemptOutcome::Replayed {
            return false;
        }
        let mut groups = self
            .pending
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(gs) = groups.get_mut(key) {
            if let Some(g) = gs
                .iter_mut()
                .find(|g| g.replica == attempt.replica && g.status == attempt.status)
            {
                g.add(attempt, ttl);
            } else {
                gs.push(Gathered::new(attempt, ttl));
            }
            return true;
        }
        if groups.len() >= MAX_PENDING {
            return false;
        }
        groups.insert(key.clone(), vec![Gathered::new(attempt, ttl)]);
        true
    }
}

impl AggregatingStore {
    /// Takes `key`'s gathered replays out, so they are written before an
    /// entry of the same key that comes after them: a store keeps the
    /// order in which entries of the same millisecond arrive.
    fn take_key(&self, key: &ScopedKey) -> Option<Groups> {
        if !self.background {
            return None;
        }
        let mut groups = self
            .pending
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if groups.is_empty() {
            return None;
        }
        let gathered = groups.remove_entry(key)?;
        Some(HashMap::from([gathered]))
    }
}

impl Drop for AggregatingStore {
    fn drop(&mut self) {
        self.pending
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
        self.pending.wake.notify_one();
    }
}

async fn flush_loop(inner: Arc<dyn Store>, pending: Arc<Pending>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = pending.wake.notified() => {}
        }
        let closing = pending.closing.load(std::sync::atomic::Ordering::Acquire);
        write(&*inner, pending.take()).await;
        if closing {
            return;
        }
    }
}

impl crate::LayeredStore for AggregatingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        match self.take_key(key) {
            None => self.inner.forget(key, attempt, timeline_ttl),
            Some(earlier) => Box::pin(async move {
                write(&*self.inner, earlier).await;
                self.inner.forget(key, attempt, timeline_ttl).await
            }),
        }
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if self.gather(key, attempt, ttl) {
            return Box::pin(std::future::ready(Ok(())));
        }
        match self.take_key(key) {
            None => self.inner.record_attempt(key, attempt, ttl),
            Some(earlier) => Box::pin(async move {
                write(&*self.inner, earlier).await;
                self.inner.record_attempt(key, attempt, ttl).await
            }),
        }
    }
}
