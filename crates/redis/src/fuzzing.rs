//! Record decoding for the fuzz targets in `fuzz/` (cargo feature
//! `fuzzing`). Not part of the API: nothing here is stable, and a build
//! without the feature has none of it.

use idemgate_engine::{Attempt, Record, StoreError};

/// Offset of the attempt length in a record's value: state, fingerprint,
/// token, fence and expiry come before it (the layout is in `scripts`).
pub const HEADER: usize = crate::store::HEADER;

/// Decodes a record's value as a `GET` or a claim returns it.
///
/// # Errors
/// A `Corrupt` store error for a value this version cannot read.
pub fn decode_record(raw: Vec<u8>) -> Result<Record, StoreError> {
    crate::store::decode_record(raw)
}

/// Decodes one timeline entry.
///
/// # Errors
/// A `Corrupt` store error for an entry that is not an attempt.
pub fn decode_attempt(entry: &[u8]) -> Result<Attempt, StoreError> {
    crate::store::decode_attempt(entry)
}
