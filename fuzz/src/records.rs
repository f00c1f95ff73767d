//! Records read back from a store: SQLite rows, the Redis record string,
//! PostgreSQL rows, timeline entries, and the stored response a DONE
//! record's payload holds.
//!
//! Every error must be `Corrupt` (the gateway answers 503 under
//! fail-closed), and every record a decoder returns must be exactly what
//! its bytes say: a damaged record is never read as some other record.

use bytes::Bytes;
use idemgate_engine::{Attempt, Record, RecordState, StoreError, StoreErrorKind};
use idemgate_layer::stored::StoredResponse;
use idemgate_sqlite::fuzzing::Column;

use crate::input::Input;

fn assert_corrupt(e: &StoreError, what: &str) {
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: {e}");
}

fn column(input: &mut Input<'_>) -> Column {
    match input.byte() % 5 {
        0 => Column::Null,
        1 => Column::Integer(input.i64()),
        2 => Column::Real(f64::from_bits(input.i64() as u64)),
        3 => Column::Text(input.short().to_vec()),
        _ => Column::Blob(input.medium().to_vec()),
    }
}

/// An integer column as the store reads it back, when it is one.
fn int(c: &Column) -> Option<i64> {
    match c {
        Column::Integer(i) => Some(*i),
        _ => None,
    }
}

/// SQLite rows of `records` and `attempts`, with any value in any column.
///
/// The first byte picks the table; the columns follow, each a type tag
/// and a value.
pub fn sqlite_row(data: &[u8]) {
    let mut input = Input::new(data);
    if input.byte().is_multiple_of(2) {
        let cols: [Column; 5] = std::array::from_fn(|_| column(&mut input));
        match idemgate_sqlite::fuzzing::read_record(&cols) {
            Err(e) => assert_corrupt(&e, "sqlite record"),
            Ok(record) => check_sqlite_record(&cols, &record),
        }
    } else {
        let cols: [Column; 7] = std::array::from_fn(|_| column(&mut input));
        match idemgate_sqlite::fuzzing::read_attempt(&cols) {
            Err(e) => assert_corrupt(&e, "sqlite attempt"),
            Ok(a) => {
                if let Some(at) = int(&cols[0]) {
                    assert_eq!(Some(a.at_ms), u64::try_from(at).ok());
                }
                if let Some(latency) = int(&cols[4]) {
                    assert_eq!(Some(a.latency_us), u64::try_from(latency).ok());
                }
            }
        }
    }
}

fn check_sqlite_record(cols: &[Column; 5], record: &Record) {
    if let Column::Blob(fp) = &cols[0] {
        assert_eq!(&record.fingerprint.as_bytes()[..], &fp[..], "fingerprint");
    }
    let expires = int(&cols[3]).map(|e| u64::try_from(e).ok());
    match (&record.state, int(&cols[2])) {
        (
            RecordState::Done {
                payload,
                expires_at_ms,
            },
            done,
        ) => {
            assert_ne!(done, Some(0), "a PENDING row read as DONE");
            match &cols[4] {
                Column::Blob(p) => assert_eq!(&payload[..], &p[..], "payload"),
                Column::Null => assert!(payload.is_empty()),
                _ => {}
            }
            if let Some(e) = expires {
                assert_eq!(e, Some(*expires_at_ms));
            }
        }
        (
            RecordState::Pending {
                fence,
                lease_expires_at_ms,
            },
            done,
        ) => {
            assert!(done.is_none_or(|d| d == 0), "a DONE row read as PENDING");
            if let Some(f) = int(&cols[1]) {
                assert_eq!(u64::try_from(f).ok(), Some(*fence));
            }
            if let Some(e) = expires {
                assert_eq!(e, Some(*lease_expires_at_ms));
            }
        }
    }
}

fn digits(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The Redis record string (and a timeline entry).
///
/// The first byte picks what the rest is: a record's value or a timeline
/// entry. A record that decodes holds the fingerprint, fence, expiry and
/// payload its value says, each from its own field.
pub fn redis_record(data: &[u8]) {
    use idemgate_redis::fuzzing::{HEADER, decode_attempt, decode_record};
    let mut input = Input::new(data);
    let what = input.byte();
    let raw = input.rest();
    if what % 4 == 3 {
        check_attempt(decode_attempt(raw), "redis timeline entry");
        return;
    }
    let record = match decode_record(raw.to_vec()) {
        Err(e) => return assert_corrupt(&e, "redis record"),
        Ok(r) => r,
    };
    assert_eq!(&record.fingerprint.as_bytes()[..], &raw[1..33]);
    let exp = digits(&raw[85..HEADER]);
    match record.state {
        RecordState::Pending {
            fence,
            lease_expires_at_ms,
        } => {
            assert_eq!(raw[0], b'P');
            assert_eq!(Some(fence), digits(&raw[65..85]));
            assert_eq!(Some(lease_expires_at_ms), exp);
        }
        RecordState::Done {
            payload,
            expires_at_ms,
        } => {
            assert_eq!(raw[0], b'D');
            assert_eq!(Some(expires_at_ms), exp);
            let tail = &raw[HEADER..];
            let colon = tail.iter().position(|&b| b == b':').expect("a colon");
            let len = digits(&tail[..colon]).expect("an attempt length");
            let start = HEADER + colon + 1 + usize::try_from(len).expect("a length");
            assert_eq!(&payload[..], &raw[start..], "payload");
        }
    }
}

fn check_attempt(decoded: Result<Attempt, StoreError>, what: &str) {
    match decoded {
        Err(e) => assert_corrupt(&e, what),
        Ok(a) => {
            let json = serde_json::to_vec(&a).expect("an attempt encodes");
            let again: Attempt = serde_json::from_slice(&json).expect("and decodes");
            assert_eq!(again, a, "{what} does not round-trip");
        }
    }
}

/// PostgreSQL rows (and a timeline entry), as column values.
///
/// The first byte picks the row's state (`P`, `D`, or text from the
/// input) and whether fence and payload are NULL; the columns follow.
pub fn postgres_row(data: &[u8]) {
    use idemgate_postgres::fuzzing::{attempt_from_entry, record_from_columns};
    let mut input = Input::new(data);
    let what = input.byte();
    if what % 8 == 7 {
        check_attempt(
            attempt_from_entry(&String::from_utf8_lossy(input.rest())),
            "postgres timeline entry",
        );
        return;
    }
    let fingerprint = input.short();
    let owned_state;
    let state = match what % 4 {
        0 => "P",
        1 => "D",
        _ => {
            owned_state = String::from_utf8_lossy(input.short()).into_owned();
            owned_state.as_str()
        }
    };
    let fence = (what & 0x10 == 0).then(|| input.i64());
    let exp_ms = input.i64();
    let payload = (what & 0x20 == 0).then(|| input.rest().to_vec());
    let record = match record_from_columns(fingerprint, state, fence, exp_ms, payload.clone()) {
        Err(e) => return assert_corrupt(&e, "postgres record"),
        Ok(r) => r,
    };
    assert_eq!(&record.fingerprint.as_bytes()[..], fingerprint);
    match record.state {
        RecordState::Pending {
            fence: f,
            lease_expires_at_ms,
        } => {
            assert_eq!(state, "P");
            assert_eq!(fence.and_then(|f| u64::try_from(f).ok()), Some(f));
            assert_eq!(u64::try_from(exp_ms).ok(), Some(lease_expires_at_ms));
        }
        RecordState::Done {
            payload: p,
            expires_at_ms,
        } => {
            assert_eq!(state, "D");
            assert_eq!(payload.as_deref(), Some(&p[..]));
            assert_eq!(u64::try_from(exp_ms).ok(), Some(expires_at_ms));
        }
    }
}

/// The stored response a DONE record's payload holds.
///
/// A payload that decodes encodes again, and that encoding decodes to the
/// same response.
pub fn stored_response(data: &[u8]) {
    let payload = Bytes::copy_from_slice(data);
    let Ok(response) = StoredResponse::decode(&payload) else {
        return;
    };
    let encoded = response.encode().expect("a decoded response encodes");
    assert_eq!(
        StoredResponse::decode(&encoded).as_ref(),
        Ok(&response),
        "does not round-trip"
    );
    for skip in [0, 1, usize::MAX] {
        let _ = response.body_bytes(skip);
    }
}
