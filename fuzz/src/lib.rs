//! Fuzz targets for every parser of bytes that come from outside: client
//! requests, upstream answers, the configuration, and records read back
//! from a store.
//!
//! Each target is a plain function of the input bytes, here in the
//! library, so the regression test (`tests/corpus.rs`) replays the
//! committed corpus through them in `cargo test` without any fuzzer. The
//! binaries in `src/bin/` (feature `afl`) only hand AFL++'s inputs to these
//! functions; `scripts/fuzz.sh TARGET MINUTES` builds and runs one.
//!
//! A target panics on purpose when a parser breaks its contract, not only
//! when the parser itself panics: a decoder that accepts a damaged record
//! and returns something other than what the bytes say, a canonical form
//! that changes when canonicalised again, an SSE stream whose events
//! depend on how it was chunked.
//!
//! # Layout
//! - `input`: a cursor that splits fuzz input into the fields a target
//!   needs.
//! - `request`: [`key`], [`digest`], [`multipart`] and [`headers`]: what
//!   a client sends.
//! - `stream`: [`sse`]: the SSE scanner, id rewriting and the dialect
//!   judge on what an upstream streams.
//! - `config`: [`config`] and [`store_url`].
//! - `records`: [`sqlite_row`], [`redis_record`], [`postgres_row`] and
//!   [`stored_response`]: records and payloads read back from a store.
//! - `sealed`: [`sealed`]: sealed payloads, through the `SealedStore`.
//! - `reference`: the earlier canonicaliser, compiled from the engine's
//!   tests, that [`digest`] compares with.
//!
//! # The key decision
//! **A stored record that does not decode is a `Corrupt` store error,
//! never a panic and never another key's answer.** The record targets
//! assert it: every error they get is `Corrupt`, and every record they get
//! back is exactly what its bytes say (and, sealed, opens only under its
//! own key).

mod config;
mod input;
mod records;
#[path = "../../crates/engine/src/fingerprint/tests/reference.rs"]
mod reference;
mod request;
mod sealed;
mod stream;

pub use config::{config, store_url};
pub use records::{postgres_row, redis_record, sqlite_row, stored_response};
pub use request::{digest, headers, key, multipart};
pub use sealed::sealed;
pub use stream::sse;

/// A fuzz target: runs a parser on the input, panics on a broken contract.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("key", key),
    ("digest", digest),
    ("multipart", multipart),
    ("headers", headers),
    ("sse", sse),
    ("config", config),
    ("store_url", store_url),
    ("sqlite_row", sqlite_row),
    ("redis_record", redis_record),
    ("postgres_row", postgres_row),
    ("stored_response", stored_response),
    ("sealed", sealed),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
