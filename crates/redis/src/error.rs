//! The one place Redis errors become [`StoreError`]s, for the store and for
//! every other component that talks to the same Redis (the live event
//! streams), so that one outage reads the same everywhere.

use idemgate_engine::{StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Backend name in errors and metrics.
pub const BACKEND: &str = "redis";

/// Maps a driver error to a store error kind:
/// - I/O, timeouts, refused or dropped connections, cluster trouble (down,
///   moved mid-failover, no node for the slot), a loading or read-only
///   server: `Unavailable` (temporary, a retry may succeed);
/// - unexpected reply types and parse failures: `Corrupt`;
/// - a server certificate the TLS client does not trust (unknown
///   authority, another host's name, expired): `Rejected`, since retrying
///   cannot help, with a hint at `tls_ca`;
/// - everything else the server refused (ACLs, OOM, script errors, bad
///   configuration): `Rejected`.
pub fn map_error(e: RedisError) -> StoreError {
    if untrusted_certificate(&e) {
        let message = format!(
            "{e}: the server's TLS certificate is not trusted for this host; \
             name the authority that signed it with `tls_ca=PATH` in the URL, \
             and connect by a name the certificate holds"
        );
        return StoreError::new(StoreErrorKind::Rejected, BACKEND, message).with_source(e);
    }
    let kind = match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => StoreErrorKind::Unavailable,
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreErrorKind::Corrupt,
        _ if e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() => {
            StoreErrorKind::Unavailable
        }
        _ => StoreErrorKind::Rejected,
    };
    StoreError::new(kind, BACKEND, e.to_string()).with_source(e)
}

/// Whether `e` is rustls refusing the server's certificate (its message
/// for `rustls::Error::InvalidCertificate`; the driver keeps the typed
/// error behind a shared I/O error).
fn untrusted_certificate(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Io && e.to_string().contains("invalid peer certificate")
}

/// A reply this version cannot read.
pub(crate) fn corrupt(message: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, BACKEND, message)
}
