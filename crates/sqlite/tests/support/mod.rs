//! Helpers shared by the SQLite store's integration tests: database files
//! in temporary directories, and claims that must acquire their key.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use idemgate_engine::{Lease, ScopedKey, Store};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::{acquired, fp};
use tempfile::TempDir;

/// A new temporary directory, and the path of the file `name` in it (the
/// directory and the file go when the `TempDir` is dropped).
pub fn temp_db(name: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    (dir, path)
}

/// A store on the new file `name` in a temporary directory, and that
/// directory (to keep while the store is used).
pub fn temp_store(name: &str) -> (TempDir, SqliteStore) {
    let (dir, path) = temp_db(name);
    let store = SqliteStore::open(path).expect("open");
    (dir, store)
}

/// Claims `k`, which must be free, with the fingerprint of `{}` for `ttl`;
/// the lease.
pub async fn claim_free(store: &SqliteStore, k: &ScopedKey, ttl: Duration) -> Lease {
    acquired(store.claim(k, &fp("{}"), ttl).await.expect("claim"))
}
