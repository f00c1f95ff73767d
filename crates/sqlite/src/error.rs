//! Errors: [`SqliteError`] for opening a store, and the one function that
//! turns a driver error into the engine's [`StoreError`].

use std::path::PathBuf;

use idemgate_engine::{StoreError, StoreErrorKind};
use rusqlite::ErrorCode;

/// Name reported by [`StoreError::backend`].
pub(crate) const BACKEND: &str = "sqlite";

/// A boxed driver error, kept as a source for logs without exposing the
/// driver's types in this crate's API.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a SQLite store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteError {
    /// The file could not be opened or created (a directory, a missing parent
    /// directory, no permission).
    #[error("cannot open SQLite store {path}: {source}")]
    Open {
        /// The path given to `open`.
        path: PathBuf,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The file exists but is not a SQLite database (or is encrypted, or damaged).
    #[error("{path} is not a SQLite database (or it is damaged)")]
    NotADatabase {
        /// The path given to `open`.
        path: PathBuf,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The file was written by a newer idemgate with a schema this version
    /// cannot read. Upgrade idemgate, or point it at another file.
    #[error(
        "SQLite store {path} has schema version {found}; this idemgate understands up to {supported}"
    )]
    NewerSchema {
        /// The path given to `open`.
        path: PathBuf,
        /// `PRAGMA user_version` found in the file.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// The file opened but setting it up (WAL, schema) failed.
    #[error("cannot prepare SQLite store {path}: {source}")]
    Setup {
        /// The path given to `open`.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: StoreError,
    },
    /// The writer thread could not be started.
    #[error("cannot start the SQLite writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Maps every driver error to a [`StoreError`] kind. The one place where the
/// meaning of SQLite's result codes is decided:
///
/// - busy, locked, I/O, out of memory, cannot open → `Unavailable` (may pass);
/// - corrupt, not a database, undecodable column (text that is not
///   UTF-8 included) → `Corrupt`;
/// - full disk, read-only file, permission, constraint, anything else → `Rejected`.
pub(crate) fn map_error(e: rusqlite::Error) -> StoreError {
    use rusqlite::Error as E;
    let kind = match &e {
        E::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::OutOfMemory
            | ErrorCode::CannotOpen
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OperationInterrupted
            | ErrorCode::SchemaChanged => StoreErrorKind::Unavailable,
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Rejected,
        },
        E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::InvalidColumnType(..)
        | E::Utf8Error(..) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Rejected,
    };
    StoreError::new(kind, BACKEND, e.to_string()).with_source(e)
}

/// A value read from the file that this version cannot interpret.
pub(crate) fn corrupt(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, BACKEND, message)
}

/// The store was closed (or its writer thread is gone).
pub(crate) fn closed() -> StoreError {
    StoreError::new(
        StoreErrorKind::Closed,
        BACKEND,
        "the SQLite store is closed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn kinds_follow_result_codes() {
        use rusqlite::ffi;
        let cases = [
            (ffi::SQLITE_BUSY, StoreErrorKind::Unavailable),
            (ffi::SQLITE_LOCKED, StoreErrorKind::Unavailable),
            (ffi::SQLITE_IOERR, StoreErrorKind::Unavailable),
            (ffi::SQLITE_CORRUPT, StoreErrorKind::Corrupt),
            (ffi::SQLITE_NOTADB, StoreErrorKind::Corrupt),
            (ffi::SQLITE_FULL, StoreErrorKind::Rejected),
            (ffi::SQLITE_READONLY, StoreErrorKind::Rejected),
            (ffi::SQLITE_CONSTRAINT, StoreErrorKind::Rejected),
        ];
        for (code, kind) in cases {
            let e = map_error(failure(code));
            assert_eq!(e.kind(), kind, "code {code}");
            assert_eq!(e.backend(), "sqlite");
            assert_eq!(e.is_temporary(), kind == StoreErrorKind::Unavailable);
        }
        let e = map_error(rusqlite::Error::IntegralValueOutOfRange(0, -1));
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
    }

    #[test]
    fn text_that_is_not_utf8_is_a_corrupt_column() {
        // A file whose TEXT column holds bytes that are not UTF-8 (a
        // damaged or hand-edited store) must read as corrupt, not as a
        // refusal of the request.
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let err = conn
            .query_row("SELECT CAST(x'ff' AS TEXT)", [], |row| {
                row.get::<_, String>(0)
            })
            .unwrap_err();
        assert!(matches!(err, rusqlite::Error::Utf8Error(..)), "{err:?}");
        assert_eq!(map_error(err).kind(), StoreErrorKind::Corrupt);
    }
}
