//! [`CachedStore`]: a [`Store`] wrapper that answers replays of hot keys
//! from memory, for at most [`TRUST`] after the store last confirmed them.
//!
//! A replay is a claim that finds DONE: one store round trip (a Lua script
//! on Redis, a statement on PostgreSQL, a read on SQLite, and opening the
//! sealed payload with a key ring) to fetch a record that cannot change.
//! A DONE record is never rewritten: `complete` applies only to PENDING,
//! and a claim returns DONE untouched. It goes away in exactly two ways:
//! its `done_ttl` runs out, or an operator forgets it. So a copy read from
//! the store stays the answer the store would give until one of those two
//! happens, and the cache only has to bound how long it may miss them:
//!
//! - **Forget, on any replica.** An entry is trusted for [`TRUST`] from
//!   the moment the read that brought it was *sent* (so a read that raced
//!   a forget is trusted no longer than [`TRUST`] past the forget). A
//!   forget through this wrapper drops the local copy at once, and, when
//!   it deleted a record, returns only after [`TRUST`] has passed: by
//!   then every replica's copy of the record has lapsed, so the record is
//!   served nowhere after the forget returns. `idemgate keys forget`,
//!   which runs in its own process without a cache, waits [`TRUST`] the
//!   same way.
//! - **Expiry.** A record is cached only while it has more than
//!   [`EXPIRY_MARGIN`] + [`TRUST`] to live by this process's clock, so a
//!   trusted copy never outlives the record unless this process's clock
//!   lags the store's (a server's, for Redis and PostgreSQL) by more than
//!   [`EXPIRY_MARGIN`].
//! - **Tenant and route** are part of the scoped key the cache is keyed
//!   by, so a cached answer reaches exactly the requests the store would
//!   have answered with it.
//! - **Fingerprint.** The cached record keeps its fingerprint; a claim
//!   answered from the cache returns the record as the store would, and
//!   the engine refuses a different fingerprint the same way.
//!
//! The cache is bounded by the bytes it holds (payload and key), oldest
//! entry dropped first; entries past their trust are dropped as newer ones
//! come in. Only DONE records are kept: PENDING changes with every
//! heartbeat, and a claim that acquires the key drops any copy.
//!
//! With a key ring the wrapper sits in front of the sealing store, so the
//! copy is the opened payload: it saves the open as well, and plaintext
//! answers stay in memory for about [`TRUST`], as they do while a request
//! is served.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, atomic::AtomicU64, atomic::Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::record::{monotonic_ms, ms, now_ms};
use crate::{
    Attempt, BoxFuture, Claim, Fingerprint, Record, RecordState, ScopedKey, Store, StoreError,
};

/// How long a copy is trusted after the read that brought it was sent;
/// also how long a forget waits before it reports success.
pub(crate) const TRUST: Duration = Duration::from_secs(1);

/// A record with less than this (plus [`TRUST`]) to live is not cached: it
/// absorbs clock differences between this process and the store.
pub(crate) const EXPIRY_MARGIN: Duration = Duration::from_secs(10);

/// Default bound of the bytes held.
pub(crate) const DEFAULT_BYTES: usize = 64 * 1024 * 1024;

/// Bytes counted per entry on top of its payload and key.
const ENTRY_OVERHEAD: usize = 160;

/// One cached DONE record.
#[derive(Debug)]
struct Entry {
    record: Record,
    trusted_until: Instant,
    /// Matches the entry's place in `Cache::order`.
    generation: u64,
    weight: usize,
}

/// The map, and the order entries were inserted in (oldest first).
#[derive(Debug, Default)]
struct Cache {
    map: HashMap<ScopedKey, Entry>,
    /// Keys by insertion, with the generation they were inserted under;
    /// an item whose generation no longer matches the map is skipped.
    order: VecDeque<(ScopedKey, u64)>,
    bytes: usize,
    next_generation: u64,
}

impl Cache {
    fn remove(&mut self, key: &ScopedKey) {
        if let Some(e) = self.map.remove(key) {
            self.bytes -= e.weight;
        }
    }

    /// Drops the oldest entries while over `max_bytes` or past their trust.
    fn trim(&mut self, max_bytes: usize, now: Instant) {
        while let Some((key, generation)) = self.order.front() {
            let current = self.map.get(key).filter(|e| e.generation == *generation);
            let keep = match current {
                // Inserted again later: this item is a leftover.
                None => false,
                Some(e) => self.bytes <= max_bytes && e.trusted_until > now,
            };
            if keep {
                break;
            }
            if let Some((key, generation)) = self.order.pop_front()
                && self
                    .map
                    .get(&key)
                    .is_some_and(|e| e.generation == generation)
            {
                self.remove(&key);
            }
        }
        // Leftovers of keys inserted again pile up behind a live front
        // entry: compact once they outnumber the live ones.
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(k, g)| map.get(k).is_some_and(|e| e.generation == *g));
        }
    }
}

/// Hits and misses since the wrapper was made.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Claims and reads answered from the cache.
    pub hits: AtomicU64,
    /// Claims and reads that went to the store.
    pub misses: AtomicU64,
}

/// A store whose DONE records are answered from memory while trusted (see
/// the module documentation for why that keeps the store's answers).
pub struct CachedStore {
    inner: Arc<dyn Store>,
    cache: Mutex<Cache>,
    max_bytes: usize,
    stats: CacheStats,
    on_hit: Option<HitHook>,
}

/// Called on every call answered from the cache (for a metric).
pub type HitHook = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for CachedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedStore")
            .field("inner", &self.inner)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl CachedStore {
    /// The default bound of the bytes held: 64 MiB.
    pub const DEFAULT_BYTES: usize = DEFAULT_BYTES;
    /// How long a copy is trusted after the read that brought it was
    /// sent; also how long a forget waits before it reports success.
    pub const TRUST: Duration = TRUST;
    /// A record with less than this (plus [`Self::TRUST`]) to live is not
    /// cached: it absorbs clock differences between processes and store.
    pub const EXPIRY_MARGIN: Duration = EXPIRY_MARGIN;

    /// Caches `inner`'s DONE records, holding at most `max_bytes` (0: cache
    /// nothing, every call goes to `inner`).
    pub fn new(inner: Arc<dyn Store>, max_bytes: usize) -> Self {
        Self {
            inner,
            cache: Mutex::new(Cache::default()),
            max_bytes,
            stats: CacheStats::default(),
            on_hit: None,
        }
    }

    /// Calls `hook` on every call answered from the cache.
    pub fn on_hit(mut self, hook: HitHook) -> Self {
        self.on_hit = Some(hook);
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// Hits and misses so far.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Entries held now (trusted or not yet dropped).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Every critical section leaves the map and the byte count
        // consistent before anything can panic.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trusted copy of `key`'s DONE record, if there is one.
    fn lookup(&self, key: &ScopedKey) -> Option<Record> {
        if self.max_bytes == 0 {
            return None;
        }
        let now = Instant::now();
        let mut cache = self.lock();
        let hit = match cache.map.get(key) {
            Some(e) if e.trusted_until > now => Some(e.record.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        };
        drop(cache);
        if hit.is_some() {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            if let Some(hook) = &self.on_hit {
                hook();
            }
        } else {
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Keeps `record` (if DONE and with life enough left), read by a call
    /// sent at `sent`.
    fn keep(&self, key: &ScopedKey, record: &Record, sent: Instant) {
        let RecordState::Done {
            payload,
            expires_at_ms,
        } = &record.state
        else {
            return;
        };
        let weight = payload.len() + key_bytes(key) + ENTRY_OVERHEAD;
        if self.max_bytes == 0 || weight > self.max_bytes {
            return;
        }
        // The later of the two clocks: the record's expiry is on the
        // store's (wall-anchored) clock, and seen sooner is safer.
        let now = now_ms().max(monotonic_ms());
        if expires_at_ms.saturating_sub(now) <= ms(EXPIRY_MARGIN + TRUST) {
            return;
        }
        let trusted_until = sent + TRUST;
        let mut cache = self.lock();
        cache.remove(key);
        let generation = cache.next_generation;
        cache.next_generation += 1;
        cache.map.insert(
            key.clone(),
            Entry {
                record: record.clone(),
                trusted_until,
                generation,
                weight,
            },
        );
        cache.bytes += weight;
        cache.order.push_back((key.clone(), generation));
        cache.trim(self.max_bytes, Instant::now());
    }

    /// Drops `key`'s copy.
    pub fn invalidate(&self, key: &ScopedKey) {
        if self.max_bytes == 0 {
            return;
        }
        self.lock().remove(key);
    }
}

fn key_bytes(key: &ScopedKey) -> usize {
    key.tenant.len() + key.namespace.len() + key.key.as_str().len()
}

impl crate::LayeredStore for CachedStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        if let Some(record) = self.lookup(key) {
            return Box::pin(std::future::ready(Ok(Claim::Existing(record))));
        }
        Box::pin(async move {
            let sent = Instant::now();
            let claim = self.inner.claim(key, fingerprint, pending_ttl).await?;
            match &claim {
                Claim::Existing(record) => self.keep(key, record, sent),
                // The store had no live record: any copy here is gone.
                Claim::Acquired(_) => self.invalidate(key),
            }
            Ok(claim)
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.invalidate(key);
            let forgotten = self.inner.forget(key, attempt, timeline_ttl).await;
            // A read sent before the delete may have landed meanwhile.
            self.invalidate(key);
            if matches!(forgotten, Ok(true)) {
                // Every replica's copy was read before the delete, so it is
                // trusted no longer than TRUST from now.
                tokio::time::sleep(TRUST).await;
            }
            forgotten
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        if let Some(record) = self.lookup(key) {
            return Box::pin(std::future::ready(Ok(Some(record))));
        }
        Box::pin(async move {
            let sent = Instant::now();
            let record = self.inner.get(key).await?;
            if let Some(r) = &record {
                self.keep(key, r, sent);
            }
            Ok(record)
        })
    }
}

#[cfg(test)]
mod tests;
