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
//! A retried `complete` must send the bytes of the first try, which a
//! fresh nonce would change, so the wrapper also keeps the sealed bytes of
//! each lease's last `complete` for a while: the `retain` module says why
//! and for how long ([`RETRY_WINDOW`] once the write is acknowledged).
//!
//! A payload that cannot be opened (a key id no longer in the ring, modified
//! bytes, a record not sealed at all) is returned as a
//! [`StoreErrorKind::Corrupt`] error naming the reason, never as the bytes:
//! callers apply their store-error policy to it, and the failure hook
//! counts it.

mod retain;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, LayeredStore, Lease, Record, RecordState,
    ScopedKey, Store, StoreError, StoreErrorKind,
};

use crate::{KeyRing, SealError, SealErrorKind, associated_data};

/// The domain label that starts the associated data of a stored response.
pub const RESPONSE_AD_LABEL: &str = "idemgate/response/v1";

/// How long the fingerprint of an unfinished lease is remembered; past it
/// `complete` reads the fingerprint from the store.
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// How long the sealed bytes of an acknowledged `complete` are kept, for a
/// retry of that `complete` to send the same bytes.
///
/// The caller that retries a `complete` is the engine's
/// `LeaseGuard::complete_or_hold`: after a temporary error it tries again
/// with a backoff of 50 ms doubling to at most 1 s, while the lease lasts.
/// A write this wrapper saw acknowledged is retried only when a layer
/// above it turned the acknowledgement into an error, and that retry comes
/// within the 1 s backoff cap. Five seconds is that second with room for a
/// loaded runtime; past it, an idle replica holds no answers. (Until the
/// acknowledgement, the bytes are kept as long as the lease: the engine
/// retries a failed write while the lease lasts.)
pub const RETRY_WINDOW: Duration = Duration::from_secs(5);

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

/// Called with each seal or open failure (for a metric).
pub type FailureHook = Arc<dyn Fn(&SealErrorKind) + Send + Sync>;

/// A [`Store`] whose payloads are sealed with a [`KeyRing`].
pub struct SealedStore {
    inner: Arc<dyn Store>,
    ring: Arc<KeyRing>,
    /// Each lease handed out by `claim`: its fingerprint, and the sealed
    /// bytes of its last `complete` for a retry to send again (a new seal
    /// would pick a new nonce and look like another payload to the store).
    leases: retain::Retained,
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
    ///
    /// Built inside a tokio runtime, it spawns the task that forgets
    /// acknowledged completions after [`RETRY_WINDOW`] (it ends when the
    /// store is dropped); built outside one, they are forgotten at the
    /// next call instead.
    pub fn new(inner: Arc<dyn Store>, ring: Arc<KeyRing>) -> Self {
        Self {
            inner,
            ring,
            leases: retain::Retained::new(),
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

    /// Acknowledged completions whose sealed bytes are still held for a
    /// retry, and their total size in bytes: both fall to 0 within
    /// [`RETRY_WINDOW`] of the last completion.
    pub fn retained_completions(&self) -> (usize, usize) {
        self.leases.completions()
    }
}

/// Seals on the way in and opens on the way out; the calls that carry no
/// stored answer (renewals, timelines, forgets, wake-ups) pass through.
impl LayeredStore for SealedStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
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
                    self.leases.remember(lease.token, *fingerprint);
                    Ok(Claim::Acquired(lease))
                }
                Claim::Existing(record) => Ok(Claim::Existing(self.open_record(key, record)?)),
            }
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
            let fingerprint = match self.leases.fingerprint(lease.token) {
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
                .leases
                .sealed_for(lease.token, &payload, || self.ring.seal(&ad, &payload))
                .map_err(|e| self.failed(&e, "response could not be sealed"))?;
            let written = self.inner.complete(lease, sealed, done_ttl, attempt).await;
            match &written {
                // Kept for a retry whose acknowledgement was lost above
                // this wrapper, for the retry window.
                Ok(_) => self.leases.completed(lease.token),
                // Kept while the lease lasts: the engine tries again.
                Err(e) if e.is_temporary() => {}
                Err(_) => self.leases.forget_sealed(lease.token),
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
        self.leases.drop_lease(lease.token);
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
}
