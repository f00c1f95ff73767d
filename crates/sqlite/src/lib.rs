//! The embedded SQLite store for idemgate: the default store, which works
//! on a fresh machine with no server.
//!
//! One file in WAL mode. A result (DONE) or a forget is acknowledged only
//! once it would survive a power loss or a `kill -9` (`synchronous=FULL`);
//! a claim only once it would survive a `kill -9` (`synchronous=NORMAL`:
//! why a claim needs no fsync is in the `writer` module). Several
//! processes may share the file; each claim stays atomic across them.
//!
//! # Layout
//! - [`store`]: [`SqliteStore`] (the [`idemgate_engine::Store`]
//!   implementation), [`SqliteOptions`], and the reader pool.
//! - `writer`: the writer thread, which applies queued writes in batches.
//! - `schema`: tables, schema version, opening and preparing connections.
//! - `rows`: conversions between engine values and SQLite columns.
//! - [`error`]: [`SqliteError`] for opening, and the one mapping from
//!   driver errors to [`idemgate_engine::StoreError`].
//! - `fuzzing` (feature `fuzzing` only): row decoding for the fuzz
//!   targets; not part of the API.
//!
//! # The key decision
//! **Group commit on one writer thread.** A durable commit costs one fsync,
//! and one fsync per request caps a disk at a few thousand commits per
//! second. Every write is therefore sent to a single thread that owns the
//! write connection; it drains everything queued and applies it in two
//! `BEGIN IMMEDIATE … COMMIT`s: the claims (and renewals, releases,
//! timeline entries) without an fsync, answered at once, then the results
//! and forgets with one fsync, answered once it is done. Throughput grows
//! with concurrency, and no result is acknowledged before it is on disk.
//! Reads take the other road: a small pool of reader connections answers
//! `get`, `timeline` and the common `claim` of a key that is already held
//! or done, without touching the writer (WAL lets readers run beside it).
//! Reads run on the calling task's thread: they are short indexed lookups
//! in a local file, cheaper than a hop to a blocking thread pool.
//!
//! # Good to know
//! - A write whose caller stops waiting (a dropped future) may still be
//!   committed: a claim then stays PENDING until its lease runs out, as
//!   with any store whose round trip was cut.
//! - Other processes' changes wake `changed` waiters by polling (the engine
//!   re-reads at least every 100 ms); this process's own commits wake them
//!   at once.
//! - Dropping the last handle (or [`SqliteStore::close`]) finishes queued
//!   writes, then joins the writer thread: it may block for one commit.

pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod rows;
mod schema;
pub mod store;
mod writer;

pub use error::{BoxError, SqliteError};
pub use store::{CommitCounts, SqliteOptions, SqliteStore};
