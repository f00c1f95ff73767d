//! Parameters and rows: how leases, TTLs and attempts are bound to
//! statements, and how result rows decode into records.

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::backend::ms;
use idemgate_engine::{
    Attempt, Fenced, Fingerprint, Lease, Record, RecordState, StoreError, StoreErrorKind,
};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::error::{BACKEND, corrupt, map_error};

/// A duration in ms as a query parameter, at least 1.
pub(crate) fn ttl_param(d: Duration) -> i64 {
    i64::try_from(ms(d).max(1)).unwrap_or(i64::MAX)
}

/// The lease's fence as stored; `None` when it cannot be one of ours.
pub(crate) fn fence_param(lease: &Lease) -> Option<i64> {
    i64::try_from(lease.fence).ok()
}

pub(crate) fn attempt_json(attempt: &Attempt) -> Result<String, StoreError> {
    serde_json::to_string(attempt).map_err(|e| {
        StoreError::new(StoreErrorKind::Rejected, BACKEND, "attempt not encodable").with_source(e)
    })
}

pub(crate) fn applied(row: &PgRow) -> Result<Fenced, StoreError> {
    let n: i64 = row.try_get("applied").map_err(map_error)?;
    Ok(if n > 0 {
        Fenced::Applied
    } else {
        Fenced::Stale
    })
}

pub(crate) fn to_u64(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(&format!("{what} is negative")))
}

/// Decodes `fingerprint, state, fence, exp_ms, payload` into a record.
pub(crate) fn decode_record(row: &PgRow) -> Result<Record, StoreError> {
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(map_error)?;
    let state: String = row.try_get("state").map_err(map_error)?;
    let exp_ms: i64 = row.try_get("exp_ms").map_err(map_error)?;
    let (fence, payload) = match state.as_str() {
        "P" => (Some(row.try_get("fence").map_err(map_error)?), None),
        "D" => (None, row.try_get("payload").map_err(map_error)?),
        _ => (None, None),
    };
    record_from_columns(&fingerprint, &state, fence, exp_ms, payload)
}

/// A record from its column values, as read by [`decode_record`]: `fence`
/// is read for a PENDING row only, `payload` for a DONE row only.
pub(crate) fn record_from_columns(
    fingerprint: &[u8],
    state: &str,
    fence: Option<i64>,
    exp_ms: i64,
    payload: Option<Vec<u8>>,
) -> Result<Record, StoreError> {
    let fingerprint = <[u8; 32]>::try_from(fingerprint)
        .map(Fingerprint::from_bytes)
        .map_err(|_| corrupt("record fingerprint is not 32 bytes"))?;
    let exp = to_u64(exp_ms, "expiry")?;
    let state = match state {
        "P" => RecordState::Pending {
            fence: to_u64(
                fence.ok_or_else(|| corrupt("PENDING record has no fence"))?,
                "fence",
            )?,
            lease_expires_at_ms: exp,
        },
        "D" => RecordState::Done {
            payload: Bytes::from(payload.ok_or_else(|| corrupt("DONE record has no payload"))?),
            expires_at_ms: exp,
        },
        _ => return Err(corrupt("record state is neither P nor D")),
    };
    Ok(Record { fingerprint, state })
}

/// Decodes one timeline entry (JSON, as [`attempt_json`] writes it).
pub(crate) fn attempt_from_entry(entry: &str) -> Result<Attempt, StoreError> {
    serde_json::from_str(entry)
        .map_err(|e| corrupt("timeline entry is not an attempt").with_source(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_decode_to_the_record_they_say_and_anything_else_is_corrupt() {
        let fp = [7u8; 32];
        let pending = record_from_columns(&fp, "P", Some(9), 42, None).unwrap();
        assert_eq!(pending.fingerprint, Fingerprint::from_bytes(fp));
        assert_eq!(
            pending.state,
            RecordState::Pending {
                fence: 9,
                lease_expires_at_ms: 42
            }
        );
        let done = record_from_columns(&fp, "D", None, 5, Some(b"body".to_vec())).unwrap();
        assert_eq!(
            done.state,
            RecordState::Done {
                payload: Bytes::from_static(b"body"),
                expires_at_ms: 5
            }
        );
        for (what, decoded) in [
            (
                "short fingerprint",
                record_from_columns(&fp[..31], "P", Some(1), 1, None),
            ),
            (
                "negative expiry",
                record_from_columns(&fp, "P", Some(1), -1, None),
            ),
            (
                "negative fence",
                record_from_columns(&fp, "P", Some(-1), 1, None),
            ),
            (
                "PENDING without fence",
                record_from_columns(&fp, "P", None, 1, None),
            ),
            (
                "DONE without payload",
                record_from_columns(&fp, "D", None, 1, None),
            ),
            (
                "unknown state",
                record_from_columns(&fp, "X", Some(1), 1, Some(Vec::new())),
            ),
        ] {
            let e = decoded.expect_err(what);
            assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: {e}");
        }
        let e = attempt_from_entry("{\"at_ms\":-1}").unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
    }
}
