//! The store conformance suite against SQLite: each case on its own fresh
//! file, and every case again sharing one file (cross-key interference).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};
use idemgate_sqlite::SqliteStore;
use tempfile::TempDir;

/// A store on a temporary file, removed when the store is dropped.
#[derive(Debug)]
struct OnTempFile {
    store: SqliteStore,
    _dir: TempDir,
}

impl Store for OnTempFile {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }
    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move { self.store.claim(key, fingerprint, pending_ttl).await })
    }
    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { self.store.renew(lease, pending_ttl).await })
    }
    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { self.store.complete(lease, payload, done_ttl, attempt).await })
    }
    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { self.store.release(lease, attempt, timeline_ttl).await })
    }
    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { self.store.forget(key, attempt, timeline_ttl).await })
    }
    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move { self.store.get(key).await })
    }
    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.store.record_attempt(key, attempt, ttl).await })
    }
    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move { self.store.timeline(key).await })
    }
    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.store.changed(key, max).await;
        })
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
