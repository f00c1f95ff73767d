//! The one place sqlx errors become [`StoreError`]s.

use idemgate_engine::{StoreError, StoreErrorKind};

/// Backend name in errors and metrics.
pub(crate) const BACKEND: &str = "postgres";

/// Maps a driver error to a store error kind:
/// - I/O, TLS and protocol failures (a dropped connection), pool time-outs,
///   and server errors of SQLSTATE class 08 (connection), 53 (insufficient
///   resources), 57P (shutdown, crash, cannot connect now), 40 (serialization
///   failure, deadlock): `Unavailable` — a retry may succeed;
/// - a closed pool: `Closed`;
/// - values that do not decode: `Corrupt`;
/// - everything else (bad URL, missing tables, permissions, data errors):
///   `Rejected`.
pub(crate) fn map_error(e: sqlx::Error) -> StoreError {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => StoreErrorKind::Unavailable,
        sqlx::Error::PoolClosed => StoreErrorKind::Closed,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some(code)
                if code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57P")
                    || code.starts_with("40") =>
            {
                StoreErrorKind::Unavailable
            }
            _ => StoreErrorKind::Rejected,
        },
        _ => StoreErrorKind::Rejected,
    };
    StoreError::new(kind, BACKEND, e.to_string()).with_source(e)
}

/// A row this version cannot read.
pub(crate) fn corrupt(message: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, BACKEND, message)
}
