//! The file layout: tables, indexes, the schema version, and how a
//! connection is opened and prepared.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::error::{SqliteError, map_error};

/// The schema version this build writes, kept in `PRAGMA user_version`.
/// A file with a higher version is refused rather than misread.
pub(crate) const SCHEMA_VERSION: i64 = 2;

/// Version 1.
///
/// - `records`: one row per live or not-yet-purged record. `expires_at` is
///   the lease expiry of a PENDING row and the expiry of a DONE row, so one
///   comparison (`expires_at <= now`) decides "absent" for both.
/// - `timelines` + `attempts`: a key's attempts, oldest first by `seq`;
///   `timelines` holds the retention time and the entry count (so the
///   oldest entries are trimmed without counting), and deleting a
///   `timelines` row deletes its attempts (trigger).
/// - `counters`: the store-wide fence counter (`fence`). Fences come from
///   it, so they grow for every key even after an expired record was
///   purged, and across every process sharing the file (writers are
///   serialized). Its durable ceiling (`fence_ceiling`, written when first
///   needed) bounds every fence issued, so that claims committed without
///   an fsync cannot make a fence repeat after a power loss.
const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS records (
    id          TEXT PRIMARY KEY NOT NULL,
    fingerprint BLOB NOT NULL,
    token       BLOB NOT NULL,
    fence       INTEGER NOT NULL,
    done        INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    payload     BLOB
);
CREATE INDEX IF NOT EXISTS records_expires_at ON records(expires_at);
CREATE TABLE IF NOT EXISTS timelines (
    id          TEXT PRIMARY KEY NOT NULL,
    keep_until  INTEGER NOT NULL,
    entries     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS timelines_keep_until ON timelines(keep_until);
CREATE TABLE IF NOT EXISTS attempts (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    replica     TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    status      INTEGER,
    latency_us  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS attempts_id ON attempts(id, seq);
CREATE TRIGGER IF NOT EXISTS timelines_drop_attempts AFTER DELETE ON timelines
BEGIN
    DELETE FROM attempts WHERE id = old.id;
END;
CREATE TABLE IF NOT EXISTS counters (
    name        TEXT PRIMARY KEY NOT NULL,
    value       INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters(name, value) VALUES ('fence', 0);
";

/// Version 2: an attempt row may stand for several attempts of one
/// outcome from one replica (replays gathered over one timeline flush):
/// `repeat_count` (NULL for a single attempt) and the last one's time.
/// Added columns only, so version 1 files are migrated in place.
const SCHEMA_V2: &str = "
ALTER TABLE attempts ADD COLUMN repeat_count INTEGER;
ALTER TABLE attempts ADD COLUMN last_at_ms INTEGER;
";

/// Opens one connection (writer or reader) with the busy timeout set.
pub(crate) fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection, SqliteError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(path, e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| setup_error(path, e))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// Opens a reader connection: like [`connect`], but refusing writes, so a
/// bug can never bypass the writer thread.
pub(crate) fn connect_reader(
    path: &Path,
    busy_timeout: Duration,
) -> Result<Connection, SqliteError> {
    let conn = connect(path, busy_timeout)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| setup_error(path, e))?;
    Ok(conn)
}

/// Puts the file in WAL mode with `synchronous=FULL` (a commit is on disk
/// before it is acknowledged; the writer relaxes it to `NORMAL` for the
/// batches that need no fsync, see `writer`) and creates or checks the
/// schema.
pub(crate) fn prepare_writer(
    conn: &mut Connection,
    path: &Path,
    busy_timeout: Duration,
) -> Result<(), SqliteError> {
    // Switching to WAL needs an exclusive lock, and SQLite does not always
    // run the busy handler for it: retry while another process holds the file.
    let deadline = Instant::now() + busy_timeout;
    loop {
        let mode = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0));
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
            Ok(mode) => {
                return Err(SqliteError::Setup {
                    path: path.to_owned(),
                    source: crate::error::corrupt(format!(
                        "journal_mode stayed {mode:?}; WAL is required"
                    )),
                });
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(setup_error(path, e)),
        }
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| setup_error(path, e))?;
    migrate(conn, path)
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), SqliteError> {
    let found = user_version(conn).map_err(|e| setup_error(path, e))?;
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    check_version(path, found)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| setup_error(path, e))?;
    // Another process may have created the schema while we waited.
    let found = user_version(&tx).map_err(|e| setup_error(path, e))?;
    check_version(path, found)?;
    if found < 1 {
        tx.execute_batch(SCHEMA_V1)
            .map_err(|e| setup_error(path, e))?;
    }
    if found < 2 {
        tx.execute_batch(SCHEMA_V2)
            .map_err(|e| setup_error(path, e))?;
    }
    if found < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| setup_error(path, e))?;
    }
    tx.commit().map_err(|e| setup_error(path, e))
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

fn check_version(path: &Path, found: i64) -> Result<(), SqliteError> {
    if found > SCHEMA_VERSION {
        return Err(SqliteError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn open_error(path: &Path, e: rusqlite::Error) -> SqliteError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => SqliteError::NotADatabase {
            path: path.to_owned(),
            source: Box::new(e),
        },
        _ => SqliteError::Open {
            path: path.to_owned(),
            source: Box::new(e),
        },
    }
}

fn setup_error(path: &Path, e: rusqlite::Error) -> SqliteError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => SqliteError::NotADatabase {
            path: path.to_owned(),
            source: Box::new(e),
        },
        Some(ErrorCode::CannotOpen) => SqliteError::Open {
            path: path.to_owned(),
            source: Box::new(e),
        },
        _ => SqliteError::Setup {
            path: path.to_owned(),
            source: map_error(e),
        },
    }
}
