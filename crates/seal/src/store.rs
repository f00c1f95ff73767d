//! [`SealedStore`]: a [`Store`] wrapper that seals every payload before it
//! reaches the backend and opens it on every read.
//!
//! Sealing sits in front of the store rather than in each backend or in
//! each reader of a payload: one choke point covers SQLite, Redis,
//! PostgreSQL and the memory store alike, the backends stay ignorant of
//! keys, and every reader (replay, attach, the admin timeline) gets the
//! opened payload through the same `get` and `claim` it already uses.
//!
//! The associated data is
//! `associated_data(["idemgate/response/v1", tenant, namespace, key, fingerprint hex])`,
//! so a payload copied under another record (another key, tenant, route, or
//! a rewritten fingerprint) fails to open.
//!
//! `complete` receives a lease, which names the key but not the
//! fingerprint the key was claimed with. The wrapper remembers the
//! fingerprint of each lease it handed out (until the lease is completed or
//! released); for a lease it does not know (claimed before a restart of the
//! wrapper, or forgotten after [`FORGET_AFTER`]) it reads the record's
//! fingerprint from the store first.
//!
//! A payload that cannot be opened (a key id no longer in the ring, modified
//! bytes, a record not sealed at all) is returned as a
//! [`StoreErrorKind::Corrupt`] error naming the reason, never as the bytes:
//! callers apply their store-error policy to it, and the failure hook
//! counts it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, RecordState, ScopedKey, Store,
    StoreError, StoreErrorKind,
};

use crate::{KeyRing, SealError, SealErrorKind, associated_data};

/// The domain label that starts the associated data of a stored response.
pub const RESPONSE_AD_LABEL: &str = "idemgate/response/v1";

/// How long the fingerprint of an unfinished lease is remembered; past it
/// `complete` reads the fingerprint from the store.
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Above this many remembered leases, those older than [`FORGET_AFTER`] are
/// dropped.
const PRUNE_ABOVE: usize = 10_000;

/// Sealed bytes of completed leases kept for a retried `complete` (whose
/// first reply was lost after the write), oldest dropped first, up to this
/// many bytes in all.
const COMPLETED_BYTES: usize = 16 * 1024 * 1024;

/// Why a seal or open failed, as a low-cardinality label.
pub fn failure_reason(kind: &SealErrorKind) -> &'static str {
    match kind {
        SealErrorKind::UnknownKeyId(_) => "unknown_key_id",
        SealErrorKind::Tampered => "tampered",
        SealErrorKind::Malformed(_) => "malformed",
        SealErrorKind::TooLarge { .. } => "too_large",
        SealErrorKind::Rng => "rng",
    }
}

/// The associated data of the stored response of `key`, claimed with
/// `fingerprint`.
pub fn response_associated_data(key: &ScopedKey, fingerprint: &Fingerprint) -> Vec<u8> {
    associated_data([
        RESPONSE_AD_LABEL,
        key.tenant.as_str(),
        key.namespace.as_str(),
        key.key.as_str(),
        fingerprint.to_hex().as_str(),
    ])
}

/// What [`SealedStore`] remembers of an unfinished lease.
struct LeaseEntry {
    fingerprint: Fingerprint,
    /// The plaintext last sealed for this lease, and its sealed form.
    sealed: Option<(Bytes, Bytes)>,
    at: Instant,
}

/// Called with each seal or open failure (for a metric).
pub type FailureHook = Arc<dyn Fn(&SealErrorKind) + Send + Sync>;

/// A [`Store`] whose payloads are sealed with a [`KeyRing`].
pub struct SealedStore {
    inner: Arc<dyn Store>,
    ring: Arc<KeyRing>,
    /// Each lease handed out by `claim`, by token: its fingerprint and,
    /// once `complete` sealed a payload for it, that payload and its sealed
    /// form. A `complete` retried after a temporary error (or a lost reply)
    /// sends the very same sealed bytes, so the store can recognise its own
    /// DONE record; sealing again would pick a new nonce and look like
    /// another payload.
    leases: Mutex<HashMap<u128, LeaseEntry>>,
    /// Completed leases still remembered for a retry, oldest first, with
    /// their sealed sizes (bounded by [`COMPLETED_BYTES`]).
    completed: Mutex<(std::collections::VecDeque<(u128, usize)>, usize)>,
    on_failure: Option<FailureHook>,
}

impl fmt::Debug for SealedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedStore")
            .field("inner", &self.inner)
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl SealedStore {
    /// Seals the payloads `inner` keeps with `ring`.
    pub fn new(inner: Arc<dyn Store>, ring: Arc<KeyRing>) -> Self {
        Self {
            inner,
            ring,
            leases: Mutex::new(HashMap::new()),
            completed: Mutex::new((std::collections::VecDeque::new(), 0)),
            on_failure: None,
        }
    }

    /// Calls `hook` with every seal or open failure.
    pub fn on_failure(mut self, hook: FailureHook) -> Self {
        self.on_failure = Some(hook);
        self
    }

    /// The key ring in use.
    pub fn key_ring(&self) -> &KeyRing {
        &self.ring
    }

    fn failed(&self, err: &SealError, what: &str) -> StoreError {
        if let Some(hook) = &self.on_failure {
            hook(err.kind());
        }
        StoreError::new(
            StoreErrorKind::Corrupt,
            self.inner.backend(),
            format!("{what}: {err}"),
        )
        .with_source(err.clone())
    }

    fn open_record(&self, key: &ScopedKey, mut record: Record) -> Result<Record, StoreError> {
        if let RecordState::Done { payload, .. } = &mut record.state {
            let ad = response_associated_data(key, &record.fingerprint);
            let opened = self
                .ring
                .open(&ad, payload)
                .map_err(|e| self.failed(&e, "stored response could not be opened"))?;
            *payload = Bytes::from(opened);
        }
        Ok(record)
    }

    fn remember(&self, token: u128, fingerprint: Fingerprint) {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if leases.len() >= PRUNE_ABOVE {
            leases.retain(|_, e| e.at.elapsed() < FORGET_AFTER);
        }
        leases.insert(
            token,
            LeaseEntry {
                fingerprint,
                sealed: None,
                at: Instant::now(),
            },
        );
    }

    fn lease_fingerprint(&self, token: u128) -> Option<Fingerprint> {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&token)
            .map(|e| e.fingerprint)
    }

    /// A lease whose `complete` was acknowledged: its sealed bytes stay
    /// for a retry until newer completions push them out.
    fn completed(&self, token: u128) {
        let size = self
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&token)
            .and_then(|e| e.sealed.as_ref())
            .map_or(0, |(_, sealed)| sealed.len());
        let mut evict = Vec::new();
        {
            let mut done = self
                .completed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (queue, total) = &mut *done;
            queue.push_back((token, size));
            *total += size;
            while *total > COMPLETED_BYTES || queue.len() > PRUNE_ABOVE {
                let Some((old, n)) = queue.pop_front() else {
                    break;
                };
                *total -= n;
                evict.push(old);
            }
        }
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        for old in evict {
            leases.remove(&old);
        }
    }

    fn drop_lease(&self, token: u128) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&token);
    }

    /// `payload` sealed for the lease `token`: the bytes sealed before for
    /// the same payload, or freshly sealed (and remembered).
    fn sealed_for(&self, token: u128, ad: &[u8], payload: &Bytes) -> Result<Bytes, SealError> {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((plain, sealed)) = leases.get(&token).and_then(|e| e.sealed.as_ref())
            && plain == payload
        {
            return Ok(sealed.clone());
        }
        let sealed = Bytes::from(self.ring.seal(ad, payload)?);
        if let Some(entry) = leases.get_mut(&token) {
            entry.sealed = Some((payload.clone(), sealed.clone()));
        }
        Ok(sealed)
    }
}

impl Store for SealedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            match self.inner.claim(key, fingerprint, pending_ttl).await? {
                Claim::Acquired(lease) => {
                    self.remember(lease.token, *fingerprint);
                    Ok(Claim::Acquired(lease))
                }
                Claim::Existing(record) => Ok(Claim::Existing(self.open_record(key, record)?)),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        self.inner.renew(lease, pending_ttl)
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let fingerprint = match self.lease_fingerprint(lease.token) {
                Some(fp) => fp,
                // Not claimed through this wrapper (or forgotten): the
                // PENDING record names the fingerprint; no record, no lease.
                None => match self.inner.get(&lease.key).await? {
                    Some(record) => record.fingerprint,
                    None => return Ok(Fenced::Stale),
                },
            };
            let ad = response_associated_data(&lease.key, &fingerprint);
            let sealed = self
                .sealed_for(lease.token, &ad, &payload)
                .map_err(|e| self.failed(&e, "response could not be sealed"))?;
            let written = self.inner.complete(lease, sealed, done_ttl, attempt).await;
            // Kept for a retry (after an error, or a reply lost after the
            // write): it sends the same sealed bytes.
            if written.is_ok() {
                self.completed(lease.token);
            }
            written
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        self.drop_lease(lease.token);
        self.inner.release(lease, attempt, timeline_ttl)
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            match self.inner.get(key).await? {
                Some(record) => Ok(Some(self.open_record(key, record)?)),
                None => Ok(None),
            }
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.record_attempt(key, attempt, ttl)
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        self.inner.timeline(key)
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.forget(key, attempt, timeline_ttl)
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        self.inner.changed(key, max)
    }
}
