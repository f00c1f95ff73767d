//! Redis store for idemgate: many gateway replicas and services share one
//! Redis (a single node or a Redis Cluster) and still execute each key once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idemgate_engine::StoreError> {
//! use std::sync::Arc;
//! let store = idemgate_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let engine = idemgate_engine::Engine::new(Arc::new(store));
//! # let _ = engine; Ok(()) }
//! ```
//!
//! # Layout
//! - [`store`]: [`RedisStore`], its [`RedisOptions`], key naming and reply decoding.
//! - `scripts`: the Lua scripts behind claim, renew, complete, release and
//!   timeline appends.
//! - `timeline`: the background writer of timeline entries that change no
//!   record (replays, conflicts), batched off the request path.
//! - `conn`: [`Conn`], the connection to a node or a cluster, how it is
//!   opened, and how commands, pipelines and scripts run on it.
//! - `endpoint`: [`Endpoint`], what a URL names (node or cluster, plain or
//!   TLS, the certificate authority to trust) and the driver clients for it.
//! - `error`: [`map_error`], the one mapping from driver errors to
//!   `StoreError` kinds.
//! - `fuzzing` (feature `fuzzing` only): record decoding for the fuzz
//!   targets; not part of the API.
//! - `replication`: `WAIT` for replicas before a DONE record counts as
//!   written ([`WaitReplicas`]).
//!
//! [`Conn`], [`Endpoint`], [`map_error`] and [`hash_tag`] are public
//! because the live event streams (`idemgate-redis-live`) run on the same
//! connection type, open their clients from the same URL, report errors
//! the same way and keep their keys in the record's slot.
//!
//! # TLS
//! `rediss://` (and `rediss+cluster://`) connect with rustls (the `tls`
//! feature, on by default), verifying the server against the system's
//! root certificates, or against the certificate authorities of the PEM
//! file named by the URL's `tls_ca` parameter
//! (`rediss://:PASSWORD@host:6380/?tls_ca=/etc/idemgate/redis-ca.pem`).
//!
//! # The key decision
//! **Every operation is one round trip and one atomic step on the server.**
//! A claim is a Lua script (sent as `EVALSHA`) that reads the record and, if
//! it is absent, writes PENDING with a fresh fence in the same step; renew,
//! complete and release are scripts that check token and fence first; a
//! record is one string. Expiry is Redis's own key TTL (DONE key TTL =
//! `done_ttl`; a PENDING key lives for its lease plus the fence memory,
//! the lease itself checked by the scripts) and every timestamp comes from
//! the server's `TIME`, so replicas with skewed clocks still agree. The
//! alternative — `WATCH`/`MULTI` transactions — costs several round trips
//! and retries under contention, which is exactly when a claim must be
//! fast.
//!
//! A replay is therefore one round trip: the claim script finds DONE and
//! returns it. The timeline entry the engine adds for it is handed to a
//! background writer that appends entries in batches (best effort, as the
//! `Store` trait allows), so it costs the request no second round trip.
//!
//! Fences are `max(last fence + 1, server time in µs)`: strictly growing per
//! key while the last one is remembered (for [`RedisOptions::fence_memory`],
//! in the PENDING record or, after a takeover, a release or a forget, in a
//! small per-key counter), and still growing after it is forgotten.

mod conn;
mod endpoint;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod replication;
mod scripts;
pub mod store;
mod timeline;

pub use conn::Conn;
pub use endpoint::{Endpoint, TLS_CA_PARAM};
pub use error::{BACKEND, map_error};
pub use replication::{REPLICA_REMEMBERED_FOR, WaitReplicas};
pub use store::{RedisOptions, RedisStore, hash_tag};
