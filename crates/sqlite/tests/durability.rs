//! Which writes are fsynced: results and forgets always, claims not (their
//! batches are committed to the WAL only), and a fence is never issued
//! twice even when a power loss takes unsynced claims away.

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{AttemptOutcome, Fenced, Lease, ScopedKey, Store};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::{attempt, complete_executed, key_n};
use support::{claim_free, temp_db, temp_store};

const LONG: Duration = Duration::from_secs(300);

/// Claims the fresh key `k` for [`LONG`].
async fn claim(store: &SqliteStore, k: &ScopedKey) -> Lease {
    claim_free(store, k, LONG).await
}

#[tokio::test]
async fn claims_are_committed_unsynced_and_results_synced() {
    let (_dir, store) = temp_store("d.db");
    // The first claim raises the durable fence ceiling: synced.
    let first = claim(&store, &key_n(0)).await;
    let before = store.commit_counts();
    for n in 1..=5 {
        claim(&store, &key_n(n)).await;
    }
    let after_claims = store.commit_counts();
    assert_eq!(after_claims.synced, before.synced, "claims are not fsynced");
    assert_eq!(after_claims.unsynced, before.unsynced + 5);

    let done = complete_executed(&store, &first, b"result", LONG).await;
    assert_eq!(done, Fenced::Applied);
    let after_done = store.commit_counts();
    assert_eq!(
        after_done.synced,
        after_claims.synced + 1,
        "a result is fsynced"
    );

    assert!(
        store
            .forget(&key_n(1), &attempt(AttemptOutcome::Forgotten), LONG)
            .await
            .expect("forget")
    );
    assert_eq!(
        store.commit_counts().synced,
        after_done.synced + 1,
        "a forget is fsynced"
    );
}

#[tokio::test]
async fn claims_queued_beside_a_result_do_not_wait_for_its_fsync() {
    let (dir, store) = temp_store("d.db");
    let owned = claim(&store, &key_n(0)).await;
    let before = store.commit_counts();
    // Queued together, they may share one batch; whatever the batching,
    // the commit holding the result is synced and nothing is lost.
    let payload = Bytes::from_static(b"result");
    let executed = attempt(AttemptOutcome::Executed);
    let (k1, k2) = (key_n(1), key_n(2));
    let (c1, c2, done) = tokio::join!(
        claim(&store, &k1),
        claim(&store, &k2),
        store.complete(&owned, payload, LONG, &executed),
    );
    assert_eq!(done.expect("complete"), Fenced::Applied);
    assert!(c1.fence != c2.fence);
    let after = store.commit_counts();
    assert!(after.synced > before.synced, "{before:?} → {after:?}");
    // The claims were not held for the result's fsync: whatever the
    // batching, they went in an unsynced commit of their own.
    assert!(after.unsynced > before.unsynced, "{before:?} → {after:?}");
    store.close();
    let reopened = SqliteStore::open(dir.path().join("d.db")).expect("reopen");
    let record = reopened.get(&key_n(0)).await.expect("get").expect("DONE");
    assert!(record.is_done());
}

/// A power loss takes the last unsynced commits (claims) with it; the
/// restarted process must not hand their fences out again. Simulated by
/// rolling the file's fence counter and records back while it is closed.
#[tokio::test]
async fn fences_of_claims_lost_with_the_machine_are_not_issued_again() {
    let (_dir, path) = temp_db("d.db");
    let store = SqliteStore::open(&path).expect("open");
    let mut issued = Vec::new();
    for n in 0..20 {
        issued.push(claim(&store, &key_n(n)).await.fence);
    }
    store.close();
    drop(store);
    let highest = issued.iter().copied().max().expect("fences");
    {
        // What a power loss can leave: the claims' commits gone, the fence
        // counter back where the last synced commit left it.
        let raw = rusqlite::Connection::open(&path).expect("raw open");
        raw.execute("DELETE FROM records", []).expect("lose claims");
        raw.execute(
            "UPDATE counters SET value = ?1 WHERE name = 'fence'",
            [i64::try_from(issued[0]).expect("fence") - 1],
        )
        .expect("roll the counter back");
    }
    let store = SqliteStore::open(&path).expect("reopen");
    for n in 0..20 {
        let fence = claim(&store, &key_n(n)).await.fence;
        assert!(
            fence > highest,
            "fence {fence} was issued before (≤ {highest})"
        );
    }
}

/// Another process opening the file moves the counter up to the ceiling:
/// a process that planned an unsynced claim batch finds no headroom left,
/// and commits it synced (raising the ceiling) instead.
#[tokio::test]
async fn a_claim_past_the_ceiling_another_process_reached_is_synced() {
    let (_dir, path) = temp_db("d.db");
    let a = SqliteStore::open(&path).expect("open a");
    let first = claim(&a, &key_n(0)).await.fence;
    let b = SqliteStore::open(&path).expect("open b");
    let before = a.commit_counts();
    let next = claim(&a, &key_n(1)).await.fence;
    assert!(next > first);
    assert_eq!(a.commit_counts().synced, before.synced + 1);
    let from_b = claim(&b, &key_n(2)).await.fence;
    assert!(from_b > next);
}
