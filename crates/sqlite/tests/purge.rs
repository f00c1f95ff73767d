//! Expired rows leave the file: records, timelines and their attempts.

mod support;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{Fenced, Store};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::{eventually, executed, key_n};
use support::{claim_free, temp_db};

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(300);

/// (records, timelines, attempts) rows in the file.
fn counts(path: &Path) -> (i64, i64, i64) {
    let raw = rusqlite::Connection::open(path).expect("raw open");
    let count = |table: &str| -> i64 {
        raw.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .expect("count")
    };
    (count("records"), count("timelines"), count("attempts"))
}

/// Writes `n` DONE records with `ttl` (timeline kept as long), starting at key `from`.
async fn fill(store: &SqliteStore, from: usize, n: usize, ttl: Duration) {
    let tasks: Vec<_> = (from..from + n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let lease = claim_free(&store, &key_n(i), LONG).await;
                let w = store
                    .complete(&lease, Bytes::from(vec![7u8; 256]), ttl, &executed())
                    .await
                    .expect("complete");
                assert_eq!(w, Fenced::Applied);
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

/// A store on `path` purging expired rows every `interval`, `batch` rows
/// at a time (the store's default batch if `None`).
fn purging(path: &Path, interval: Duration, batch: Option<usize>) -> SqliteStore {
    let options = SqliteStore::builder().purge_interval(interval);
    let options = match batch {
        Some(rows) => options.purge_batch(rows),
        None => options,
    };
    options.open(path).expect("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_purge_removes_only_expired_rows() {
    const SHORT_LIVED: usize = 2500;
    const KEPT: usize = 10;
    let (_dir, path) = temp_db("purge.db");
    // No background purge during this test: the explicit call does it all.
    let store = purging(&path, Duration::from_secs(3600), Some(1000));
    fill(&store, 0, SHORT_LIVED, SHORT).await;
    fill(&store, SHORT_LIVED, KEPT, LONG).await;
    let total = i64::try_from(SHORT_LIVED + KEPT).expect("fits");
    assert_eq!(counts(&path), (total, total, total));

    tokio::time::sleep(SHORT * 2).await;
    let removed = store.purge_expired().await.expect("purge");
    assert_eq!(removed, 2 * SHORT_LIVED, "records + timelines removed");
    let kept = i64::try_from(KEPT).expect("fits");
    assert_eq!(counts(&path), (kept, kept, kept));
    assert!(store.get(&key_n(0)).await.expect("get").is_none());
    assert!(store.get(&key_n(SHORT_LIVED)).await.expect("get").is_some());
    assert_eq!(
        store.timeline(&key_n(SHORT_LIVED)).await.expect("tl").len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_purge_empties_the_file_in_bounded_steps() {
    let (_dir, path) = temp_db("background.db");
    let store = purging(&path, Duration::from_millis(100), Some(300));
    fill(&store, 0, 2000, SHORT).await;
    fill(&store, 2000, 3, LONG).await;
    // No exact count here: on a busy machine the purge may already have
    // taken records whose 300 ms ran out while the rest were written.
    let written = counts(&path).0;
    assert!(written >= 3, "the fill left {written} records");
    let purged = eventually(|| {
        let path = path.clone();
        async move { counts(&path) == (3, 3, 3) }
    })
    .await;
    assert!(purged, "background purge left {:?}", counts(&path));
}

/// Fences keep growing for a key whose expired record was purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_grow_across_a_purge() {
    let (_dir, path) = temp_db("fence.db");
    let store = purging(&path, Duration::from_secs(3600), None);
    let mut last = 0;
    for _ in 0..5 {
        let lease = claim_free(&store, &key_n(1), SHORT).await;
        assert!(lease.fence > last, "fence {} after {last}", lease.fence);
        last = lease.fence;
        tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
        store.purge_expired().await.expect("purge");
        assert_eq!(counts(&path).0, 0, "expired PENDING purged");
    }
    // Reopening keeps the counter too.
    drop(store);
    let store = SqliteStore::open(&path).expect("reopen");
    let lease = claim_free(&store, &key_n(1), LONG).await;
    assert!(lease.fence > last);
}
