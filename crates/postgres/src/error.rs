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
/// - a server certificate the TLS client does not trust (unknown
///   authority, another host's name, expired): `Rejected`, since retrying
///   cannot help, with a hint at `sslrootcert`;
/// - everything else (bad URL, missing tables, permissions, data errors):
///   `Rejected`.
pub(crate) fn map_error(e: sqlx::Error) -> StoreError {
    if untrusted_certificate(&e) {
        let message = format!(
            "{e}: the server's TLS certificate is not trusted for this host; \
             name the authority that signed it with `sslrootcert=PATH` in the URL \
             (`sslmode=verify-full`), and connect by a name the certificate holds"
        );
        return StoreError::new(StoreErrorKind::Rejected, BACKEND, message).with_source(e);
    }
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

/// Whether `e` is rustls refusing the server's certificate (its message
/// for `rustls::Error::InvalidCertificate`, which the driver passes on as
/// an I/O or TLS error).
fn untrusted_certificate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Tls(_))
        && e.to_string().contains("invalid peer certificate")
}

/// A row this version cannot read.
pub(crate) fn corrupt(message: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, BACKEND, message)
}
