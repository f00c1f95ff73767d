//! Row decoding for the fuzz targets in `fuzz/` (cargo feature
//! `fuzzing`). Not part of the API: nothing here is stable, and a build
//! without the feature has none of it.
//!
//! The driver turns each column into a Rust value first (a value of the
//! wrong type or an unexpected NULL is its `ColumnDecode` error, which the
//! store reports as `Corrupt`); these take those values.

use idemgate_engine::{Attempt, Record, StoreError};

/// A record from the columns `fingerprint, state, fence, exp_ms, payload`
/// (`fence` as read for a PENDING row, `payload` for a DONE row).
///
/// # Errors
/// A `Corrupt` store error for values this version cannot read.
pub fn record_from_columns(
    fingerprint: &[u8],
    state: &str,
    fence: Option<i64>,
    exp_ms: i64,
    payload: Option<Vec<u8>>,
) -> Result<Record, StoreError> {
    crate::rows::record_from_columns(fingerprint, state, fence, exp_ms, payload)
}

/// Decodes one timeline entry.
///
/// # Errors
/// A `Corrupt` store error for an entry that is not an attempt.
pub fn attempt_from_entry(entry: &str) -> Result<Attempt, StoreError> {
    crate::rows::attempt_from_entry(entry)
}
