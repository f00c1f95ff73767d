//! The `Store` trait: the few atomic operations every backend provides.
//!
//! Each method is **one atomic step and, on a networked store, one round
//! trip**: `claim` is an insert-or-read (a Lua script in Redis, one
//! `INSERT … ON CONFLICT … RETURNING` in SQL), never a read followed by a
//! write. Time is milliseconds since the epoch so that several processes
//! sharing a store agree on lease expiry: the server's clock for networked
//! stores, the process's wall-anchored monotonic clock
//! ([`crate::record::monotonic_ms`]) for the in-process ones.
//!
//! The behaviour of every method is pinned down by the conformance suite in
//! `idemgate-testkit`, which every store runs unchanged.
//!
//! # Async methods: hand-written [`BoxFuture`], not `#[async_trait]`
//! Every async trait of the workspace ([`Store`] here, the live-event traits
//! of `idemgate-layer`, and the layer's tower `Service`, whose future is a
//! `BoxFuture<'static, _>`) returns a [`BoxFuture`] written out by hand:
//! `fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, …>`, with the
//! body in `Box::pin(async move { … })`. One convention, for these reasons:
//! - The traits are used as trait objects (`Arc<dyn Store>`,
//!   `Arc<dyn LiveEvents>`), and a `dyn` call to an async method needs a
//!   boxed future whichever way it is written: `#[async_trait]` expands to
//!   the same `Pin<Box<dyn Future + Send + 'a>>`. Nothing is gained at run
//!   time by the macro, and nothing lost without it.
//! - The signature a backend author reads is the one the compiler checks:
//!   the documentation shows `BoxFuture<'a, Result<Claim, StoreError>>`, the
//!   `Send` bound and how long each argument is borrowed, not the macro's
//!   `'life0, 'life1, 'async_trait` expansion, and error messages point at
//!   real code.
//! - No procedural macro in the build of the engine and of every store.
//! - An implementation can do synchronous work before it boxes, or return a
//!   ready future (the default [`Store::changed`] boxes a plain sleep).
//!
//! The cost is one `Box::pin(async move { … })` per method in each
//! implementation. [`BoxFuture`] is re-exported here so that a backend
//! needs no dependency beyond this crate.

use std::time::Duration;

use bytes::Bytes;
pub use futures_util::future::BoxFuture;

use crate::{Attempt, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey};

/// The kind of a [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or did not answer in time.
    Unavailable,
    /// The store answered with data this version cannot read.
    Corrupt,
    /// The store refused the operation (schema, permissions, full disk).
    Rejected,
    /// The store was closed by its owner.
    Closed,
}

/// An error from a store backend. Driver error types never leak: the source is
/// kept for logs, the kind says what the caller may do about it.
#[derive(Debug, thiserror::Error)]
#[error("{backend} store {kind:?}: {message}")]
pub struct StoreError {
    kind: StoreErrorKind,
    backend: &'static str,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A new error of `kind` from `backend`.
    pub fn new(kind: StoreErrorKind, backend: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying driver error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Which backend reported it (`memory`, `sqlite`, `redis`, `postgres`).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_temporary(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Unavailable)
    }
}

/// A place to keep idempotency records.
///
/// Implementations must be safe to share between tasks (and, for the
/// persistent ones, between processes).
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Short backend name for metrics and errors.
    fn backend(&self) -> &'static str;

    /// Claims `key` for work, or returns what is there.
    ///
    /// # Behavior
    /// Atomically: if the key is absent, or PENDING with a lease that has
    /// expired, writes PENDING with `fingerprint`, a fresh random token, a
    /// fence greater than any the store remembers for the key, and a lease
    /// expiry of now + `pending_ttl`, and returns [`Claim::Acquired`].
    /// Otherwise returns the record ([`Claim::Existing`]) without changing
    /// it — whatever its fingerprint (mismatch is the caller's decision).
    /// An expired DONE record counts as absent.
    ///
    /// Safe to repeat: a store whose driver sends a call again after its
    /// reply was lost (the Redis Cluster client does) must give the
    /// repeated claim the answer the first one got, its own lease, never
    /// its own PENDING record as [`Claim::Existing`].
    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>>;

    /// Extends the lease (heartbeat).
    ///
    /// # Behavior
    /// If the record is PENDING with `lease`'s token and fence, sets the lease
    /// expiry to now + `pending_ttl`, updates `lease.expires_at_ms` and
    /// returns [`Fenced::Applied`]; otherwise changes nothing and returns
    /// [`Fenced::Stale`].
    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;

    /// Stores the result: PENDING → DONE.
    ///
    /// # Behavior
    /// If the record is PENDING with `lease`'s token and fence, replaces it by
    /// DONE holding `payload` (and the claim's fingerprint), expiring after
    /// `done_ttl`, appends `attempt` to the key's timeline in the same step,
    /// and returns [`Fenced::Applied`]. If the record is the DONE record this
    /// very lease wrote (same token and fence) holding the same `payload` —
    /// a retry after the first call's reply was lost — writes nothing and
    /// returns [`Fenced::Applied`]. Otherwise writes nothing and returns
    /// [`Fenced::Stale`]. A store acknowledges only once the write is durable
    /// to the store's own standard.
    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;

    /// Gives the key up: PENDING → absent.
    ///
    /// # Behavior
    /// If the record is PENDING with `lease`'s token and fence, deletes it,
    /// appends `attempt` to the timeline (kept for `timeline_ttl`) and returns
    /// [`Fenced::Applied`]; otherwise changes nothing and returns
    /// [`Fenced::Stale`].
    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>>;

    /// Forgets the key: an operator's action, e.g. to clear an
    /// outcome-unknown answer once the upstream's side has been checked.
    ///
    /// # Behavior
    /// Deletes the record whatever its state (PENDING or DONE), appends
    /// `attempt` to the timeline (kept for `timeline_ttl`) in the same step,
    /// and returns whether there was a record. The next claim acquires the
    /// key with a new fence, so a PENDING owner that was forgotten is
    /// fenced ([`Fenced::Stale`]) when it completes. With no record, writes
    /// nothing and returns `false` — except for the same forget sent again
    /// by the driver after its reply was lost, which returns `true` as the
    /// first did.
    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Reads the record.
    ///
    /// # Behavior
    /// Returns DONE records before their expiry and PENDING records whose
    /// lease has not expired; `None` otherwise.
    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;

    /// Appends an attempt that did not change the record (a replay, a
    /// conflict, a mismatch) to the key's timeline, kept for `ttl`.
    ///
    /// # Behavior
    /// Best effort: a store may batch these and acknowledge before they are
    /// durable. At most [`crate::MAX_TIMELINE`] entries are kept per key.
    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The key's attempts, oldest first.
    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>>;

    /// Waits until the key's record may have changed, or `max` has passed.
    ///
    /// # Behavior
    /// A hint, not a guarantee: callers re-read with [`Store::get`] after it
    /// returns. The default sleeps for `max` capped at 50 ms (polling); stores
    /// with notifications return as soon as the record changes.
    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        let _ = key;
        Box::pin(tokio::time::sleep(max.min(Duration::from_millis(50))))
    }
}
