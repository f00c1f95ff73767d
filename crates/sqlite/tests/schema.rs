//! Files written by an earlier schema version open, migrate in place and
//! keep what they held.

use std::time::Duration;

use idemgate_engine::{AttemptOutcome, Claim, ClientKey, Fingerprint, Repeated, ScopedKey, Store};
use idemgate_sqlite::SqliteStore;

/// The version 1 layout, as the first release wrote it.
const V1: &str = "
CREATE TABLE records (
    id TEXT PRIMARY KEY NOT NULL, fingerprint BLOB NOT NULL, token BLOB NOT NULL,
    fence INTEGER NOT NULL, done INTEGER NOT NULL, expires_at INTEGER NOT NULL, payload BLOB);
CREATE INDEX records_expires_at ON records(expires_at);
CREATE TABLE timelines (
    id TEXT PRIMARY KEY NOT NULL, keep_until INTEGER NOT NULL, entries INTEGER NOT NULL);
CREATE INDEX timelines_keep_until ON timelines(keep_until);
CREATE TABLE attempts (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL, at_ms INTEGER NOT NULL, replica TEXT NOT NULL,
    outcome TEXT NOT NULL, status INTEGER, latency_us INTEGER NOT NULL);
CREATE INDEX attempts_id ON attempts(id, seq);
CREATE TRIGGER timelines_drop_attempts AFTER DELETE ON timelines
BEGIN DELETE FROM attempts WHERE id = old.id; END;
CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
INSERT INTO counters(name, value) VALUES ('fence', 41);
PRAGMA user_version = 1;
";

#[tokio::test]
async fn a_version_1_file_is_migrated_and_keeps_its_timeline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v1.db");
    let key = ScopedKey::new("t", "ns", ClientKey::parse("old-key").expect("key"));
    {
        let raw = rusqlite::Connection::open(&path).expect("raw open");
        raw.execute_batch(V1).expect("v1 layout");
        raw.execute(
            "INSERT INTO timelines(id, keep_until, entries) VALUES (?1, ?2, 1)",
            rusqlite::params![key.storage_id(), i64::MAX],
        )
        .expect("timeline");
        raw.execute(
            "INSERT INTO attempts(id, at_ms, replica, outcome, status, latency_us)
             VALUES (?1, 1000, 'old-replica', 'executed', 200, 7)",
            rusqlite::params![key.storage_id()],
        )
        .expect("attempt");
    }

    let store = SqliteStore::open(&path).expect("a version 1 file opens");
    let timeline = store.timeline(&key).await.expect("timeline");
    assert_eq!(timeline.len(), 1, "{timeline:?}");
    assert_eq!(timeline[0].outcome, AttemptOutcome::Executed);
    assert_eq!(timeline[0].replica, "old-replica");
    assert_eq!(timeline[0].repeated, None, "a version 1 row is one attempt");

    // The migrated file takes entries that stand for several attempts.
    let mut gathered = timeline[0].clone();
    gathered.at_ms = 2000;
    gathered.outcome = AttemptOutcome::Replayed;
    gathered.repeated = Some(Repeated {
        count: 5,
        last_at_ms: 2400,
    });
    store
        .record_attempt(&key, &gathered, Duration::from_secs(60))
        .await
        .expect("record");
    store.close();
    let store = SqliteStore::open(&path).expect("reopen");
    let timeline = store.timeline(&key).await.expect("timeline");
    assert_eq!(timeline.len(), 2, "{timeline:?}");
    assert_eq!(timeline[1], gathered);

    // The fence counter carried over: the next claim's fence is above it.
    let fp = Fingerprint::of_request("POST", "/m", b"{}", &[]);
    let fresh = ScopedKey::new("t", "ns", ClientKey::parse("new-key").expect("key"));
    match store
        .claim(&fresh, &fp, Duration::from_secs(30))
        .await
        .expect("claim")
    {
        Claim::Acquired(lease) => assert!(lease.fence > 41, "fence {}", lease.fence),
        Claim::Existing(r) => panic!("fresh key found {r:?}"),
    }
    let version: i64 = rusqlite::Connection::open(&path)
        .expect("raw open")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2);
}
