//! Conversions between engine values and SQLite columns.
//!
//! SQLite integers are signed 64-bit: times, fences and latencies are stored
//! as `i64` (saturating on the way in, refused as corrupt if negative on the
//! way out). Tokens are 16-byte and fingerprints 32-byte BLOBs.

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Fingerprint, Record, RecordState, Repeated, StoreError,
};
use rusqlite::Row;

use crate::error::corrupt;

/// `u64` → SQLite integer, saturating at `i64::MAX`.
pub(crate) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// SQLite integer → `u64`; a negative value means the file was not written
/// by this store.
pub(crate) fn uint(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(format!("negative {what} ({v})")))
}

/// The owner token as stored.
pub(crate) fn token_bytes(token: u128) -> [u8; 16] {
    token.to_be_bytes()
}

/// The columns of `records` that make up a [`Record`], in the order
/// [`record_from_row`] reads them.
pub(crate) const RECORD_COLUMNS: &str = "fingerprint, fence, done, expires_at, payload";

/// Raw columns of a record row, read without interpretation so that the
/// driver borrow ends before decoding.
#[derive(Debug)]
pub(crate) struct RawRecord {
    fingerprint: Vec<u8>,
    fence: i64,
    done: i64,
    expires_at: i64,
    payload: Option<Vec<u8>>,
}

/// Reads [`RECORD_COLUMNS`] from a row.
pub(crate) fn raw_record(row: &Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        fingerprint: row.get(0)?,
        fence: row.get(1)?,
        done: row.get(2)?,
        expires_at: row.get(3)?,
        payload: row.get(4)?,
    })
}

impl RawRecord {
    /// Decodes the row into a [`Record`].
    pub(crate) fn decode(self) -> Result<Record, StoreError> {
        let fingerprint = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map(Fingerprint::from_bytes)
            .map_err(|_| corrupt("fingerprint is not 32 bytes"))?;
        let expires = uint(self.expires_at, "expiry")?;
        let state = if self.done != 0 {
            RecordState::Done {
                payload: Bytes::from(self.payload.unwrap_or_default()),
                expires_at_ms: expires,
            }
        } else {
            RecordState::Pending {
                fence: uint(self.fence, "fence")?,
                lease_expires_at_ms: expires,
            }
        };
        Ok(Record { fingerprint, state })
    }
}

/// The columns of `attempts` that make up an [`Attempt`].
pub(crate) const ATTEMPT_COLUMNS: &str =
    "at_ms, replica, outcome, status, latency_us, repeat_count, last_at_ms";

/// Raw columns of an attempt row.
#[derive(Debug)]
pub(crate) struct RawAttempt {
    at_ms: i64,
    replica: String,
    outcome: String,
    status: Option<i64>,
    latency_us: i64,
    repeat_count: Option<i64>,
    last_at_ms: Option<i64>,
}

/// Reads [`ATTEMPT_COLUMNS`] from a row.
pub(crate) fn raw_attempt(row: &Row<'_>) -> rusqlite::Result<RawAttempt> {
    Ok(RawAttempt {
        at_ms: row.get(0)?,
        replica: row.get(1)?,
        outcome: row.get(2)?,
        status: row.get(3)?,
        latency_us: row.get(4)?,
        repeat_count: row.get(5)?,
        last_at_ms: row.get(6)?,
    })
}

impl RawAttempt {
    /// Decodes the row into an [`Attempt`].
    pub(crate) fn decode(self) -> Result<Attempt, StoreError> {
        let outcome = AttemptOutcome::parse(&self.outcome)
            .ok_or_else(|| corrupt(format!("unknown attempt outcome {:?}", self.outcome)))?;
        let status = self
            .status
            .map(|s| u16::try_from(s).map_err(|_| corrupt(format!("status {s} out of range"))))
            .transpose()?;
        let repeated = match (self.repeat_count, self.last_at_ms) {
            (Some(count), Some(last)) => Some(Repeated {
                count: uint(count, "repeat count")?,
                last_at_ms: uint(last, "last attempt time")?,
            }),
            (None, None) => None,
            _ => return Err(corrupt("attempt row has half of a repeat")),
        };
        Ok(Attempt {
            at_ms: uint(self.at_ms, "attempt time")?,
            replica: self.replica,
            outcome,
            status,
            latency_us: uint(self.latency_us, "latency")?,
            repeated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_saturate_and_refuse_negatives() {
        assert_eq!(int(u64::MAX), i64::MAX);
        assert_eq!(int(7), 7);
        assert_eq!(uint(7, "x").ok(), Some(7));
        assert!(uint(-1, "x").is_err());
    }
}
