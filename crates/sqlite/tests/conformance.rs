//! The store conformance suite against SQLite: each case on its own fresh
//! file, and every case again sharing one file (cross-key interference).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemgate_engine::{
    Attempt, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};
use idemgate_sqlite::SqliteStore;
use tempfile::TempDir;

/// A store on a temporary file, removed when the store is dropped.
#[derive(Debug)]
struct OnTempFile {
    store: SqliteStore,
    _dir: TempDir,
}

#[async_trait]
impl Store for OnTempFile {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }
    async fn claim(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        pending_ttl: Duration,
    ) -> Result<Claim, StoreError> {
        self.store.claim(key, fingerprint, pending_ttl).await
    }
    async fn renew(&self, lease: &mut Lease, pending_ttl: Duration) -> Result<Fenced, StoreError> {
        self.store.renew(lease, pending_ttl).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &Attempt,
    ) -> Result<Fenced, StoreError> {
        self.store.complete(lease, payload, done_ttl, attempt).await
    }
    async fn release(
        &self,
        lease: &Lease,
        attempt: &Attempt,
        timeline_ttl: Duration,
    ) -> Result<Fenced, StoreError> {
        self.store.release(lease, attempt, timeline_ttl).await
    }
    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        self.store.get(key).await
    }
    async fn record_attempt(
        &self,
        key: &ScopedKey,
        attempt: &Attempt,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.store.record_attempt(key, attempt, ttl).await
    }
    async fn timeline(&self, key: &ScopedKey) -> Result<Vec<Attempt>, StoreError> {
        self.store.timeline(key).await
    }
    async fn changed(&self, key: &ScopedKey, max: Duration) {
        self.store.changed(key, max).await;
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
