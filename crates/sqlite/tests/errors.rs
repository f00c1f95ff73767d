//! Error paths: files that are not stores, newer schemas, and a closed store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Claim, Fenced, Lease, MAX_TIMELINE, Store, StoreError, StoreErrorKind,
};
use idemgate_sqlite::{SqliteError, SqliteStore};
use idemgate_testkit::{acquired, fp, key};

const LONG: Duration = Duration::from_secs(300);

/// Not the testkit's `attempt`: attempt `n` is stamped `n` ms and `n` µs,
/// so the order and the identity of each one read back can be checked.
fn attempt(n: u64) -> Attempt {
    Attempt {
        at_ms: n,
        replica: "r".into(),
        outcome: AttemptOutcome::Replayed,
        status: None,
        latency_us: n,
        repeated: None,
    }
}

/// What the store answers to a claim of the key `name`.
async fn try_claim(store: &SqliteStore, name: &str) -> Result<Claim, StoreError> {
    store.claim(&key(name), &fp("{}"), LONG).await
}

/// Claims the key `name`, which must be free; its lease.
async fn claim(store: &SqliteStore, name: &str) -> Lease {
    acquired(try_claim(store, name).await.expect("claim"))
}

/// Completes `lease` with `body` as attempt 1; what the store said.
async fn complete(store: &SqliteStore, lease: &Lease, body: &'static [u8]) -> Fenced {
    store
        .complete(lease, Bytes::from_static(body), LONG, &attempt(1))
        .await
        .expect("complete")
}

#[test]
fn a_directory_is_refused_clearly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = SqliteStore::open(dir.path()).expect_err("a directory is not a store");
    assert!(matches!(err, SqliteError::Open { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
}

#[test]
fn a_missing_parent_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = SqliteStore::open(dir.path().join("no/such/dir/x.db")).expect_err("missing parent");
    assert!(matches!(err, SqliteError::Open { .. }), "{err:?}");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notes.txt");
    let text = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &text).expect("write");
    let err = SqliteStore::open(&path).expect_err("not a database");
    assert!(matches!(err, SqliteError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("future.db");
    drop(SqliteStore::open(&path).expect("create"));
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    let version: i64 = raw
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2, "the store records its schema version");
    raw.pragma_update(None, "user_version", 99).expect("bump");
    drop(raw);
    let err = SqliteStore::open(&path).expect_err("newer schema");
    assert!(
        matches!(
            err,
            SqliteError::NewerSchema {
                found: 99,
                supported: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn the_file_is_in_wal_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal.db");
    let _store = SqliteStore::open(&path).expect("open");
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    let mode: String = raw
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_after_close_fail_with_closed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("closed.db")).expect("open");
    let lease = claim(&store, "a").await;
    let mut other = claim(&store, "b").await;
    assert_eq!(complete(&store, &lease, b"x").await, Fenced::Applied);
    store.close();
    store.close(); // idempotent

    let closed = |r: Result<(), idemgate_engine::StoreError>| {
        let e = r.expect_err("closed store must refuse");
        assert_eq!(e.kind(), StoreErrorKind::Closed, "{e}");
        assert_eq!(e.backend(), "sqlite");
    };
    closed(try_claim(&store, "a").await.map(|_| ()));
    closed(try_claim(&store, "new").await.map(|_| ()));
    closed(store.get(&key("a")).await.map(|_| ()));
    closed(store.renew(&mut other, LONG).await.map(|_| ()));
    closed(
        store
            .complete(&other, Bytes::new(), LONG, &attempt(2))
            .await
            .map(|_| ()),
    );
    closed(store.release(&other, &attempt(3), LONG).await.map(|_| ()));
    closed(store.record_attempt(&key("a"), &attempt(4), LONG).await);
    closed(store.timeline(&key("a")).await.map(|_| ()));
    closed(store.purge_expired().await.map(|_| ()));
    // `changed` is a hint: it returns (no hang) even on a closed store.
    store.changed(&key("a"), Duration::from_millis(10)).await;
    drop(store);

    // What was committed before the close is in the file.
    let store = SqliteStore::open(dir.path().join("closed.db")).expect("reopen");
    let rec = store.get(&key("a")).await.expect("get").expect("record");
    assert_eq!(rec.payload().map(|p| p.to_vec()), Some(b"x".to_vec()));
}

/// Closing while many tasks write: every call ends (no hang, no panic),
/// either applied or refused as closed, and once a caller has been refused
/// every later call is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_during_writes_answers_every_caller() {
    for round in 0..5usize {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(SqliteStore::open(dir.path().join("race.db")).expect("open"));
        let applied = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let (store, applied) = (Arc::clone(&store), Arc::clone(&applied));
                tokio::spawn(async move {
                    let mut refused = false;
                    for i in 0..50 {
                        let k = key(&format!("r{round}-t{t}-{i}"));
                        match store.claim(&k, &fp("{}"), LONG).await {
                            Ok(_) => {
                                assert!(!refused, "a write succeeded after a Closed error");
                                applied.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => {
                                assert_eq!(e.kind(), StoreErrorKind::Closed, "{e}");
                                refused = true;
                            }
                        }
                    }
                })
            })
            .collect();
        // Close in the middle of the writes, at a different point each round.
        while applied.load(Ordering::SeqCst) < 50 + 200 * round {
            tokio::task::yield_now().await;
        }
        let closer = Arc::clone(&store);
        tokio::task::spawn_blocking(move || closer.close())
            .await
            .expect("close");
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a caller hung after close")
                .expect("task");
        }
        let e = try_claim(&store, "after").await.expect_err("closed");
        assert_eq!(e.kind(), StoreErrorKind::Closed);
    }
}

/// Timeline entries sent just before the store is dropped are still
/// written (best effort means "not awaited", not "maybe lost"), and only
/// the newest `MAX_TIMELINE` are kept, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_timeline_entries_are_written_on_drop_and_trimmed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("timeline.db");
    let total = MAX_TIMELINE as u64 + 36;
    {
        let store = SqliteStore::open(&path).expect("open");
        for n in 1..=total {
            store
                .record_attempt(&key("t"), &attempt(n), LONG)
                .await
                .expect("record");
        }
    } // dropped: the writer drains its queue, then stops
    let store = SqliteStore::open(&path).expect("reopen");
    let timeline = store.timeline(&key("t")).await.expect("timeline");
    let got: Vec<u64> = timeline.iter().map(|a| a.at_ms).collect();
    let want: Vec<u64> = (total - MAX_TIMELINE as u64 + 1..=total).collect();
    assert_eq!(got, want);
}

/// Another writer holding the file's write lock past the busy timeout makes
/// writes fail as `Unavailable` (temporary), while reads go on; once the
/// lock is released, writes succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_is_unavailable_then_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("busy.db");
    let store = SqliteStore::builder()
        .busy_timeout(Duration::from_millis(200))
        .open(&path)
        .expect("open");
    let lease = claim(&store, "done").await;
    assert_eq!(complete(&store, &lease, b"d").await, Fenced::Applied);

    let other = rusqlite::Connection::open(&path).expect("second connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let e = try_claim(&store, "blocked")
        .await
        .expect_err("write lock is held");
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert!(e.is_temporary());
    // Reads do not need the write lock.
    assert!(store.get(&key("done")).await.expect("get").is_some());
    let replay = try_claim(&store, "done").await.expect("replay");
    assert!(matches!(replay, Claim::Existing(_)));
    other.execute_batch("COMMIT").expect("release the lock");

    // `claim` asserts the blocked key is now acquired.
    claim(&store, "blocked").await;
}
