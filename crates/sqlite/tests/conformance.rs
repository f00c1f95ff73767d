//! The store conformance suite against SQLite: each case on its own fresh
//! file, and every case again sharing one file (cross-key interference).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idemgate_engine::Store;
use idemgate_sqlite::SqliteStore;
use tempfile::TempDir;

/// A store on a temporary file, removed when the store is dropped.
#[derive(Debug)]
struct OnTempFile {
    store: SqliteStore,
    _dir: TempDir,
}

impl idemgate_engine::LayeredStore for OnTempFile {
    fn inner(&self) -> &dyn Store {
        &self.store
    }
}

fn on_temp_file() -> OnTempFile {
    let dir = tempfile::tempdir().expect("temp dir");
    // A short purge interval, so purging runs during the cases too.
    let store = SqliteStore::builder()
        .purge_interval(Duration::from_millis(200))
        .open(dir.path().join("idemgate.db"))
        .expect("open store");
    OnTempFile { store, _dir: dir }
}

async fn make() -> Arc<dyn Store> {
    Arc::new(on_temp_file())
}

/// One store for every case of the shared module. The writer is a plain
/// thread, so the store outlives each case's runtime. Statics are never
/// dropped, so the file is kept under the target's tmp dir, not in /tmp.
async fn make_shared() -> Arc<dyn Store> {
    static SHARED: OnceLock<Arc<dyn Store>> = OnceLock::new();
    Arc::clone(SHARED.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("conformance-shared-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let store = SqliteStore::builder()
            .purge_interval(Duration::from_millis(200))
            .open(dir.path().join("shared.db"))
            .expect("open store");
        Arc::new(OnTempFile { store, _dir: dir })
    }))
}

idemgate_testkit::conformance_suite!(conformance_sqlite, make);
idemgate_testkit::conformance_suite!(conformance_sqlite_shared, make_shared);

/// The store as the gateway uses it: replays answered from memory while
/// trusted, and their timeline entries gathered.
async fn make_wrapped() -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(on_temp_file());
    let gathered = Arc::new(idemgate_engine::AggregatingStore::new(store));
    Arc::new(idemgate_engine::CachedStore::new(
        gathered,
        idemgate_engine::CachedStore::DEFAULT_BYTES,
    ))
}

idemgate_testkit::conformance_suite!(conformance_sqlite_wrapped, make_wrapped);
