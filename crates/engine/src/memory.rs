//! In-memory store: for tests and single-process use.
//!
//! Same semantics as the persistent stores, nothing survives the process.
//! State sits behind a std `Mutex` because no lock is held across `.await`;
//! every operation is one short critical section, which is what makes
//! `claim` atomic. A background task (started when the store is created
//! inside a tokio runtime) purges expired records; it stops when the store
//! is dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::notify::KeyedNotify;
use crate::record::{MAX_TIMELINE, monotonic_ms, ms, now_ms};
use crate::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, RecordState, ScopedKey, Store,
    StoreError,
};

/// A source of "now" in ms since the epoch. Injected so that tests can step
/// time exactly; production uses [`SystemClock`].
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// The wall clock read once, then advanced by elapsed time
/// ([`crate::record::monotonic_ms`]): steps of the wall clock do not move
/// lease expiry. The default of [`MemoryStore::new`].
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        monotonic_ms()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(AtomicU64::new(start_ms))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(ms(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The in-memory store. Cheap to clone: clones share state.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    clock: Arc<dyn Clock>,
    /// Held for one short critical section per operation, never across `.await`.
    state: Mutex<HashMap<String, Entry>>,
    notify: KeyedNotify,
    /// Store-wide fence source: fences keep growing even after an expired
    /// record (and its per-key counter) has been purged.
    fences: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    record: Option<Slot>,
    /// Fence of the latest claim of this key.
    fence: u64,
    timeline: VecDeque<Attempt>,
    /// When the entry may be dropped entirely (timeline retention).
    keep_until_ms: u64,
}

#[derive(Debug)]
struct Slot {
    fingerprint: Fingerprint,
    token: u128,
    state: RecordState,
}

impl Slot {
    fn live(&self, now: u64) -> bool {
        match self.state {
            RecordState::Pending {
                lease_expires_at_ms,
                ..
            } => lease_expires_at_ms > now,
            RecordState::Done { expires_at_ms, .. } => expires_at_ms > now,
        }
    }

    fn to_record(&self) -> Record {
        Record {
            fingerprint: self.fingerprint,
            state: self.state.clone(),
        }
    }

    fn owned_by(&self, lease: &Lease) -> bool {
        matches!(self.state, RecordState::Pending { fence, .. } if fence == lease.fence)
            && self.token == lease.token
    }

    /// Whether this is the DONE record that `lease` itself completed with
    /// `payload`: a retried `complete` whose first reply was lost.
    fn completed_by(&self, lease: &Lease, payload: &Bytes, now: u64) -> bool {
        self.token == lease.token
            && matches!(&self.state, RecordState::Done { payload: p, expires_at_ms }
                if p == payload && *expires_at_ms > now)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the process's monotonic clock ([`MonotonicClock`]).
    pub fn new() -> Self {
        Self::with_clock(Arc::new(MonotonicClock))
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let shared = Arc::new(Shared {
            clock,
            state: Mutex::new(HashMap::new()),
            notify: KeyedNotify::new(),
            fences: AtomicU64::new(0),
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(purge_task(Arc::downgrade(&shared)));
        }
        Self { shared }
    }

    /// Drops expired records and timelines now; returns how many entries went.
    pub fn purge_expired(&self) -> usize {
        self.shared.purge()
    }

    /// Number of keys held (records or timelines).
    pub fn len(&self) -> usize {
        self.shared.lock().len()
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock cannot leave an entry half-written
        // (each operation assigns whole values), so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn purge(&self) -> usize {
        let now = self.clock.now_ms();
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, e| {
            if e.record.as_ref().is_some_and(|s| !s.live(now)) {
                e.record = None;
            }
            e.record.is_some() || e.keep_until_ms > now
        });
        before - map.len()
    }
}

async fn purge_task(shared: Weak<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match shared.upgrade() {
            Some(s) => {
                s.purge();
            }
            None => return,
        }
    }
}

fn push_attempt(entry: &mut Entry, attempt: &Attempt, keep_until_ms: u64) {
    if entry.timeline.len() >= MAX_TIMELINE {
        entry.timeline.pop_front();
    }
    entry.timeline.push_back(attempt.clone());
    entry.keep_until_ms = entry.keep_until_ms.max(keep_until_ms);
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let id = key.storage_id();
            let mut map = self.shared.lock();
            let entry = map.entry(id).or_insert_with(|| Entry {
                record: None,
                fence: 0,
                timeline: VecDeque::new(),
                keep_until_ms: 0,
            });
            if let Some(slot) = entry.record.as_ref().filter(|s| s.live(now)) {
                return Ok(Claim::Existing(slot.to_record()));
            }
            entry.fence = self.shared.fences.fetch_add(1, Ordering::Relaxed) + 1;
            let lease = Lease {
                key: key.clone(),
                token: Lease::new_token(),
                fence: entry.fence,
                expires_at_ms: now.saturating_add(ms(pending_ttl)),
                fingerprint: *fingerprint,
            };
            entry.record = Some(Slot {
                fingerprint: *fingerprint,
                token: lease.token,
                state: RecordState::Pending {
                    fence: lease.fence,
                    lease_expires_at_ms: lease.expires_at_ms,
                },
            });
            Ok(Claim::Acquired(lease))
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let mut map = self.shared.lock();
            let slot = map
                .get_mut(&lease.key.storage_id())
                .and_then(|e| e.record.as_mut())
                .filter(|s| s.owned_by(lease));
            let Some(slot) = slot else {
                return Ok(Fenced::Stale);
            };
            let expires = now.saturating_add(ms(pending_ttl));
            slot.state = RecordState::Pending {
                fence: lease.fence,
                lease_expires_at_ms: expires,
            };
            lease.expires_at_ms = expires;
            Ok(Fenced::Applied)
        })
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let id = lease.key.storage_id();
            {
                let mut map = self.shared.lock();
                let Some(entry) = map.get_mut(&id) else {
                    return Ok(Fenced::Stale);
                };
                if entry.fence == lease.fence
                    && entry
                        .record
                        .as_ref()
                        .is_some_and(|s| s.completed_by(lease, &payload, now))
                {
                    return Ok(Fenced::Applied);
                }
                let Some(slot) = entry.record.as_mut().filter(|s| s.owned_by(lease)) else {
                    return Ok(Fenced::Stale);
                };
                let expires_at_ms = now.saturating_add(ms(done_ttl));
                slot.state = RecordState::Done {
                    payload,
                    expires_at_ms,
                };
                push_attempt(entry, attempt, expires_at_ms);
            }
            self.shared.notify.notify(&id);
            Ok(Fenced::Applied)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let id = lease.key.storage_id();
            {
                let mut map = self.shared.lock();
                let Some(entry) = map.get_mut(&id) else {
                    return Ok(Fenced::Stale);
                };
                if !entry.record.as_ref().is_some_and(|s| s.owned_by(lease)) {
                    return Ok(Fenced::Stale);
                }
                entry.record = None;
                push_attempt(entry, attempt, now.saturating_add(ms(timeline_ttl)));
            }
            self.shared.notify.notify(&id);
            Ok(Fenced::Applied)
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let id = key.storage_id();
            {
                let mut map = self.shared.lock();
                let Some(entry) = map.get_mut(&id) else {
                    return Ok(false);
                };
                if entry.record.take().is_none() {
                    return Ok(false);
                }
                push_attempt(entry, attempt, now.saturating_add(ms(timeline_ttl)));
            }
            self.shared.notify.notify(&id);
            Ok(true)
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let map = self.shared.lock();
            Ok(map
                .get(&key.storage_id())
                .and_then(|e| e.record.as_ref())
                .filter(|s| s.live(now))
                .map(Slot::to_record))
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let mut map = self.shared.lock();
            let entry = map.entry(key.storage_id()).or_insert_with(|| Entry {
                record: None,
                fence: 0,
                timeline: VecDeque::new(),
                keep_until_ms: 0,
            });
            push_attempt(entry, attempt, now.saturating_add(ms(ttl)));
            Ok(())
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let now = self.shared.clock.now_ms();
            let map = self.shared.lock();
            let mut attempts: Vec<Attempt> = map
                .get(&key.storage_id())
                .filter(|e| e.keep_until_ms > now || e.record.is_some())
                .map(|e| e.timeline.iter().cloned().collect())
                .unwrap_or_default();
            // Oldest first by the attempts' own time: an entry written
            // late (a gathered replay) is shown in its place.
            attempts.sort_by_key(|a| a.at_ms);
            Ok(attempts)
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.shared.notify.wait(&key.storage_id(), max).await;
        })
    }
}
