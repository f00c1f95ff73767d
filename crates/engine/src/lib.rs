//! The idemgate engine: run each operation at most once per idempotency key.
//!
//! A timeout is the one failure that does not say whether the work happened.
//! When the caller retries, this engine decides from a shared record whether
//! the work already ran (replay its stored result), is running (wait, or say
//! so), or must run now (claim the key first, atomically).
//!
//! # Layout
//! The modules are private; the types a caller needs are re-exported here,
//! once each, and what only a store's implementation needs is in
//! [`backend`].
//!
//! - `key`: client keys (parsing, validation, minting), scoped keys, and
//!   builders for keys that stay stable across retries.
//! - `fingerprint`: what counts as "the same request" (canonical JSON).
//! - `record`: the record, its lease, and the timeline of attempts.
//! - `store`: the [`Store`] trait every backend implements.
//! - `memory`: the in-memory store, and the clocks it can run on.
//! - `layered`: [`LayeredStore`], the base of store wrappers: every method
//!   forwards to the wrapped store unless the wrapper overrides it.
//! - `execute`: the [`Engine`]: [`Engine::execute`] and the lower-level
//!   [`Engine::begin`].
//! - `guard`: [`LeaseGuard`], the owner's side of a claimed key (heartbeat,
//!   fenced [`Completion`], release on drop).
//! - `inflight`: [`Inflight`], the waiter's side of a key found PENDING,
//!   and how the wait [`Settled`].
//! - `policy`: [`Policy`], lease and record lifetimes, and [`OnInflight`].
//! - `notify`: per-key wake-ups used by stores for waiters.
//! - `renewals`: lease renewals for the runs that outlive half a heartbeat
//!   interval, without a task per claim.
//! - `cache`: [`CachedStore`], a store wrapper that answers replays of
//!   hot keys from memory for a bounded time.
//! - `observed`: [`ObservedStore`], a store wrapper that shows every
//!   operation to a [`StoreObserver`] (metrics, call counts).
//! - `aggregate`: [`AggregatingStore`], a store wrapper that writes the
//!   timeline entries of replays once per key and flush, with a count.
//! - [`backend`]: what a [`Store`] implementation needs beside the trait
//!   (the time base, per-key wake-ups, the clocks).
//!
//! # The key decision
//! A record is **absent → PENDING → DONE**, and PENDING → absent. PENDING is
//! a *lease* (random owner token + fencing counter + expiry) rather than a
//! flag: a short lease lets a crashed owner's claim rot within seconds, a
//! heartbeat lets a live owner keep it for minutes, and fencing makes sure an
//! owner that stalled past its lease cannot overwrite the result of the
//! owner that took over. Every store operation is one atomic step, one round
//! trip on a networked store.

mod aggregate;
pub mod backend;
mod cache;
mod execute;
mod fingerprint;
mod guard;
mod inflight;
mod key;
mod layered;
mod memory;
mod notify;
mod observed;
mod policy;
mod record;
mod renewals;
mod store;

pub use aggregate::AggregatingStore;
pub use cache::{CacheStats, CachedStore, HitHook};
pub use execute::{Begin, BeginError, Engine, ExecuteError, Executed, Origin, Unstored};
pub use fingerprint::{
    BodyDigest, BodyError, Fingerprint, MAX_JSON_DEPTH, canonical_json, digest_body,
};
pub use guard::{Completion, LeaseGuard};
pub use inflight::{Inflight, Settled};
pub use key::{ClientKey, DerivedKey, KeyError, MAX_KEY_LEN, ScopedKey, natural_key};
pub use layered::LayeredStore;
pub use memory::MemoryStore;
pub use observed::{ObservedStore, StoreObserver, StoreOp};
pub use policy::{DEFAULT_INFLIGHT_WAIT, OnInflight, Policy};
pub use record::{
    Attempt, AttemptOutcome, Claim, Fenced, Lease, MAX_TIMELINE, Record, RecordState, Repeated,
};
pub use store::{BoxFuture, Store, StoreError, StoreErrorKind};
