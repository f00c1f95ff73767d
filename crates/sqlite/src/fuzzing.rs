//! Row decoding for the fuzz targets in `fuzz/` (cargo feature
//! `fuzzing`). Not part of the API: nothing here is stable, and a build
//! without the feature has none of it.
//!
//! A row is written into an in-memory database whose tables have the
//! store's column types (so SQLite's type affinity converts values as it
//! would in a store file) but none of its constraints (a damaged or
//! hand-edited file need not honour them), then read back with the
//! store's own query columns and decoders.

use std::cell::RefCell;

use idemgate_engine::{Attempt, Record, StoreError, StoreErrorKind};
use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};

use crate::error::{BACKEND, map_error};
use crate::rows::{ATTEMPT_COLUMNS, RECORD_COLUMNS, raw_attempt, raw_record};

/// One column value, as a file may hold it whatever the schema says.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// `NULL`.
    Null,
    /// An integer.
    Integer(i64),
    /// A floating-point number.
    Real(f64),
    /// Text; SQLite keeps what it is given, valid UTF-8 or not.
    Text(Vec<u8>),
    /// A blob.
    Blob(Vec<u8>),
}

const TABLES: &str = "
CREATE TABLE records (id TEXT PRIMARY KEY, fingerprint BLOB, token BLOB,
    fence INTEGER, done INTEGER, expires_at INTEGER, payload BLOB);
CREATE TABLE attempts (seq INTEGER PRIMARY KEY, id TEXT, at_ms INTEGER,
    replica TEXT, outcome TEXT, status INTEGER, latency_us INTEGER,
    repeat_count INTEGER, last_at_ms INTEGER);
";

thread_local! {
    static DB: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

fn with_db<T>(f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
    DB.with(|db| {
        let mut db = db.borrow_mut();
        if db.is_none() {
            let conn = Connection::open_in_memory().map_err(map_error)?;
            conn.execute_batch(TABLES).map_err(map_error)?;
            *db = Some(conn);
        }
        match db.as_ref() {
            Some(conn) => f(conn),
            None => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                "no database",
            )),
        }
    })
}

fn value(c: &Column) -> Value {
    match c {
        Column::Null => Value::Null,
        Column::Integer(i) => Value::Integer(*i),
        Column::Real(f) => Value::Real(*f),
        // Text that is not UTF-8 can only be bound as a blob, then cast:
        // SQLite keeps the bytes and calls them text.
        Column::Text(t) => match String::from_utf8(t.clone()) {
            Ok(s) => Value::Text(s),
            Err(e) => Value::Blob(e.into_bytes()),
        },
        Column::Blob(b) => Value::Blob(b.clone()),
    }
}

/// The SQL for one bound value: `?n`, or `CAST(?n AS TEXT)` for text
/// bound as a blob.
fn placeholder(n: usize, c: &Column) -> String {
    match c {
        Column::Text(t) if std::str::from_utf8(t).is_err() => format!("CAST(?{n} AS TEXT)"),
        _ => format!("?{n}"),
    }
}

/// Writes one `records` row with `columns` (fingerprint, fence, done,
/// expires_at, payload) and reads it back as the store reads a record.
///
/// # Errors
/// The store's error for a row it cannot read.
pub fn read_record(columns: &[Column; 5]) -> Result<Record, StoreError> {
    with_db(|conn| {
        conn.execute("DELETE FROM records", []).map_err(map_error)?;
        let marks: Vec<String> = (1..=5).map(|n| placeholder(n, &columns[n - 1])).collect();
        conn.execute(
            &format!(
                "INSERT INTO records (id, token, fingerprint, fence, done, expires_at, payload) \
                 VALUES ('k', x'00', {})",
                marks.join(", ")
            ),
            params_from_iter(columns.iter().map(value)),
        )
        .map_err(map_error)?;
        let raw = conn
            .query_row(
                &format!("SELECT {RECORD_COLUMNS} FROM records WHERE id = 'k'"),
                [],
                raw_record,
            )
            .map_err(map_error)?;
        raw.decode()
    })
}

/// Writes one `attempts` row with `columns` (at_ms, replica, outcome,
/// status, latency_us, repeat_count, last_at_ms) and reads it back as the
/// store reads a timeline entry.
///
/// # Errors
/// The store's error for a row it cannot read.
pub fn read_attempt(columns: &[Column; 7]) -> Result<Attempt, StoreError> {
    with_db(|conn| {
        conn.execute("DELETE FROM attempts", [])
            .map_err(map_error)?;
        let marks: Vec<String> = (1..=7).map(|n| placeholder(n, &columns[n - 1])).collect();
        conn.execute(
            &format!(
                "INSERT INTO attempts (id, at_ms, replica, outcome, status, latency_us, \
                 repeat_count, last_at_ms) VALUES ('k', {})",
                marks.join(", ")
            ),
            params_from_iter(columns.iter().map(value)),
        )
        .map_err(map_error)?;
        let raw = conn
            .query_row(
                &format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = 'k'"),
                [],
                raw_attempt,
            )
            .map_err(map_error)?;
        raw.decode()
    })
}
