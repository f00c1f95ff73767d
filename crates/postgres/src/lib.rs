//! PostgreSQL store for idemgate: many gateway replicas and services share
//! one database and still execute each key once — and a service can commit
//! the DONE record **in the same transaction as its business writes**.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idemgate_engine::StoreError> {
//! use std::sync::Arc;
//! let store = idemgate_postgres::PostgresStore::connect("postgres://postgres@127.0.0.1/app").await?;
//! let engine = idemgate_engine::Engine::new(Arc::new(store));
//! # let _ = engine; Ok(()) }
//! ```
//!
//! # Layout
//! - [`store`]: [`PostgresStore`]: connecting, migrating, the bounded
//!   connection use, [`PostgresStore::complete_in`] and the background purge.
//! - `batch`: claims, completions and lease renewals of concurrent
//!   requests carried by one statement each, when every worker is busy:
//!   the queue and its workers, for any kind of job (`store::batched` has
//!   the two kinds: claims and completions together, and renewals).
//! - `connections`: the connections the operations run on, lent one
//!   operation at a time and taken back with no extra round trip.
//! - `options`: [`PostgresOptions`].
//! - `ops`: the `Store` implementation, one statement per operation.
//! - `rows`: statement parameters and row decoding.
//! - `sql`: every statement and the schema migrations.
//! - `timeline`: the background writer of timeline entries that change no
//!   record (replays, conflicts), one statement per batch.
//! - `error`: the one mapping from sqlx errors to `StoreError` kinds.
//! - `fuzzing` (feature `fuzzing` only): row decoding for the fuzz
//!   targets; not part of the API.
//! - `pgbench` (hidden): the claim and completion as a pgbench script,
//!   for the floor `bench/gateway.sh` measures; not part of the API.
//! - `replication`: the server settings the store's promises depend on
//!   (a synchronous standby keeps a committed DONE across a failover;
//!   autovacuum reclaims old row versions), for `idemgate check`.
//!
//! # The key decision
//! **A claim is one statement**: `INSERT … ON CONFLICT (id) DO UPDATE … WHERE
//! <the existing record expired> RETURNING …`, wrapped in a CTE that returns
//! the existing row when the update did not apply. The primary key makes the
//! database itself decide the one winner among concurrent claimers on any
//! number of replicas; fenced writes are `UPDATE … WHERE id AND token AND
//! fence`. Time is the database clock (`now()`), one clock for every replica.
//!
//! A replay is one statement: the claim finds the live DONE row and returns
//! it without writing. The timeline entry the engine adds for it goes to a
//! background writer that inserts entries in batches (best effort, as the
//! `Store` trait allows), so the request waits for no second round trip
//! and no second commit.
//!
//! The operations run on connections of the store's own rather than sqlx's
//! pool, which pings every connection it gets back: a connection goes back
//! as soon as its answer was read, so an operation is one round trip.
//!
//! Because the record is an ordinary row, a service that keeps its business
//! data in the same database can write DONE inside its own transaction
//! ([`PostgresStore::complete_in`]): the charge and the stored result commit
//! together or not at all, so neither "charged twice" nor "charged but no
//! result" can happen — which no store outside the business database can
//! promise.
//!
//! # TLS
//! With the `tls` feature (on by default) the URL's `sslmode` works as
//! with libpq: `require` encrypts without checking the certificate,
//! `verify-ca` checks it against the Mozilla roots and the authorities in
//! the `sslrootcert` file, `verify-full` also checks the host name
//! (`postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/idemgate/pg-ca.pem`).
//! It is rustls (aws-lc-rs), the same TLS stack as the Redis store's.

mod batch;
mod connections;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod ops;
mod options;
#[doc(hidden)]
pub mod pgbench;
mod replication;
mod rows;
mod sql;
pub mod store;
mod timeline;

pub use options::PostgresOptions;
pub use replication::{ServerSettings, server_settings};
pub use store::PostgresStore;
