//! A DONE record counts as written only once a replica has it: a private
//! master and replica (`--replicaof`), the replica frozen with SIGSTOP as
//! a stalled host would be.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Claim, Fenced, Lease, ScopedKey, Store, StoreError, StoreErrorKind,
};
use idemgate_redis::{RedisStore, WaitReplicas};
use idemgate_testkit::{acquired, attempt, fp, fresh_key};
use support::{Server, options, temp_root};

const TTL: Duration = Duration::from_secs(30);

fn done() -> Attempt {
    attempt(AttemptOutcome::Executed)
}

/// A fresh key, claimed on `store`, and its lease.
async fn claim_fresh(store: &RedisStore) -> (ScopedKey, Lease) {
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("q"), TTL).await.unwrap());
    (key, lease)
}

/// Completes `lease` and expects the DONE not to be trusted (`why`): a
/// temporary `Unavailable` error, returned.
async fn complete_refused(store: &RedisStore, lease: &Lease, why: &str) -> StoreError {
    let err = complete(store, lease).await.expect_err(why);
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    err
}

/// Completes `lease` with the answer every test writes.
async fn complete(store: &RedisStore, lease: &Lease) -> Result<Fenced, StoreError> {
    store
        .complete(lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
}

async fn store(server: &Server, wanted: WaitReplicas) -> RedisStore {
    RedisStore::connect_with(
        &server.url(),
        options()
            .wait_replicas(wanted)
            .wait_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap()
}

/// The name of one of `key`'s Redis keys (`rec`, `fence`, `tl`).
fn redis_key(key: &ScopedKey, suffix: &str) -> String {
    let tag = idemgate_redis::hash_tag(key);
    format!("{}:{tag}:{suffix}", options().prefix)
}

/// A node without replicas, and a store on it that waits for `wanted`.
async fn lone_node(wanted: WaitReplicas) -> (Server, RedisStore) {
    let node = Server::start(temp_root(), false);
    let store = store(&node, wanted).await;
    (node, store)
}

fn pair() -> (Server, Server) {
    let master = Server::start(temp_root(), false);
    let replica = Server::replica_of(temp_root(), master.port);
    master.wait_replication("connected_slaves", "1");
    replica.wait_replication("master_link_status", "up");
    // `WaitReplicas::Auto` counts the replicas `ROLE` lists: online ones.
    master.wait_replica_online();
    (master, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_record_waits_for_its_replica() {
    let (mut master, mut replica) = pair();
    let store = store(&master, WaitReplicas::Auto).await;
    let on_replica = RedisStore::connect_with(&replica.url(), options())
        .await
        .unwrap();

    // Acknowledged: the replica has it the moment complete returns.
    let (k, lease) = claim_fresh(&store).await;
    assert_eq!(complete(&store, &lease).await.unwrap(), Fenced::Applied);
    let copy = on_replica.get(&k).await.unwrap().expect("on the replica");
    assert!(copy.is_done());
    assert!(master.calls(&["wait"]) >= 1);

    // The replica stalls: the DONE is written on the master but not
    // acknowledged, so it is not trusted (a temporary error the owner holds
    // its result through).
    let (k, lease) = claim_fresh(&store).await;
    replica.pause();
    let err = complete_refused(&store, &lease, "an unacknowledged DONE is not trusted").await;
    assert!(err.to_string().contains("replica"), "{err}");
    // Thawed, the owner's retry of the same completion is acknowledged.
    replica.resume();
    assert_eq!(complete(&store, &lease).await.unwrap(), Fenced::Applied);
    let copy = on_replica.get(&k).await.unwrap().expect("on the replica");
    assert_eq!(copy.payload().unwrap().as_ref(), b"answer");

    // The replica dies: the master stops reporting it at once, and that is
    // exactly when an unreplicated DONE must not be trusted.
    replica.stop();
    master.wait_replication("connected_slaves", "0");
    tokio::time::sleep(Duration::from_millis(1100)).await; // past the cached ROLE
    let (_, lease) = claim_fresh(&store).await;
    complete_refused(
        &store,
        &lease,
        "a replica seen a moment ago is still waited for",
    )
    .await;
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_replicas_waits_for_none_unless_told() {
    let (mut node, auto) = lone_node(WaitReplicas::Auto).await;
    let (_, lease) = claim_fresh(&auto).await;
    assert_eq!(complete(&auto, &lease).await.unwrap(), Fenced::Applied);
    assert_eq!(node.calls(&["wait"]), 0, "no replica, no WAIT");

    // Told to wait for one replica that does not exist: never trusted.
    let one = store(&node, WaitReplicas::Count(1)).await;
    let (_, lease) = claim_fresh(&one).await;
    complete_refused(&one, &lease, "no replica acknowledged").await;
    node.stop();
}

/// A PENDING record that vanished — lost in a failover to a replica that
/// never had it, or expired and claimed by nobody — is written again as
/// DONE by its owner's completion: no other owner holds the key, so the
/// retry replays instead of running the work twice. Not after a newer
/// claim, a release or a forget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_record_is_written_again_by_its_owner() {
    let (mut node, store) = lone_node(WaitReplicas::Auto).await;
    let (k, lease) = claim_fresh(&store).await;
    // What a promoted replica that never had the claim looks like.
    let deleted = support::redis_cli(
        node.port,
        &["DEL", &redis_key(&k, "rec"), &redis_key(&k, "fence")],
    );
    assert!(deleted.is_some(), "redis-cli DEL");
    assert_eq!(store.get(&k).await.unwrap(), None);
    assert_eq!(complete(&store, &lease).await.unwrap(), Fenced::Applied);
    let rec = store.get(&k).await.unwrap().expect("DONE again");
    assert!(rec.is_done());
    assert_eq!(rec.fingerprint, lease.fingerprint);
    // A later claim finds it and does not run again.
    let fp = lease.fingerprint;
    assert!(matches!(
        store.claim(&k, &fp, TTL).await.unwrap(),
        Claim::Existing(r) if r.is_done()
    ));
    // Released, the owner cannot write it back.
    let (k, lease) = claim_fresh(&store).await;
    assert_eq!(
        store.release(&lease, &done(), TTL).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(complete(&store, &lease).await.unwrap(), Fenced::Stale);
    assert_eq!(store.get(&k).await.unwrap(), None);
    node.stop();
}

/// A PENDING record outlives its lease by the fence memory, its lease
/// judged by the server's clock: a lapsed lease reads as absent, yet
/// nobody else holds the key, so its owner's late renewal and completion
/// apply and a retry replays. A fresh key is one Redis key; the fence
/// counter appears only once a claim takes a lapsed lease over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_nobody_took_stays_its_owners() {
    let (mut node, store) = lone_node(WaitReplicas::Auto).await;
    let short = Duration::from_millis(300);
    let past_short = Duration::from_millis(600);
    let exists = |key: &ScopedKey, suffix: &str| {
        support::redis_cli(node.port, &["EXISTS", &redis_key(key, suffix)])
            .unwrap()
            .trim()
            == "1"
    };

    let key = fresh_key();
    let mut lease = acquired(store.claim(&key, &fp("q"), short).await.unwrap());
    assert!(exists(&key, "rec") && !exists(&key, "fence"), "one key");
    tokio::time::sleep(past_short).await;
    assert_eq!(store.get(&key).await.unwrap(), None, "the lease lapsed");
    assert!(exists(&key, "rec"), "the record outlives its lease");
    assert_eq!(store.renew(&mut lease, TTL).await.unwrap(), Fenced::Applied);
    assert!(store.get(&key).await.unwrap().is_some(), "renewed");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(complete(&store, &lease).await.unwrap(), Fenced::Applied);
    let fp_q = fp("q");
    assert!(matches!(
        store.claim(&key, &fp_q, TTL).await.unwrap(),
        Claim::Existing(r) if r.payload() == Some(&Bytes::from_static(b"answer"))
    ));
    assert!(!exists(&key, "fence"), "no takeover, no counter");

    // Taken over: the counter keeps the new fence for the old owner.
    let key = fresh_key();
    let old = acquired(store.claim(&key, &fp("q"), short).await.unwrap());
    tokio::time::sleep(past_short).await;
    let new = acquired(store.claim(&key, &fp("q"), TTL).await.unwrap());
    assert!(new.fence > old.fence);
    assert!(exists(&key, "fence"), "a takeover remembers its fence");
    assert_eq!(complete(&store, &old).await.unwrap(), Fenced::Stale);
    node.stop();
}

/// A PENDING record whose lease expiry or fence cannot be read is never
/// taken over nor hidden: a claim and a read both report it as corrupt,
/// long after its lease would have lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_pending_record_is_reported_not_taken_over() {
    let (mut node, store) = lone_node(WaitReplicas::Auto).await;
    let short = Duration::from_millis(200);
    // Byte offsets of the lease expiry and of the fence (see `scripts`).
    for (field, offset) in [("lease expiry", "85"), ("fence", "65")] {
        let key = fresh_key();
        acquired(store.claim(&key, &fp("q"), short).await.unwrap());
        let rec = redis_key(&key, "rec");
        support::redis_cli(
            node.port,
            &["SETRANGE", &rec, offset, "not-a-number-at-all!"],
        )
        .expect("redis-cli SETRANGE");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let claimed = store.claim(&key, &fp("q"), TTL).await;
        assert!(
            matches!(&claimed, Err(e) if e.kind() == StoreErrorKind::Corrupt),
            "{field}: claim gave {claimed:?}"
        );
        let read = store.get(&key).await;
        assert!(
            matches!(&read, Err(e) if e.kind() == StoreErrorKind::Corrupt),
            "{field}: get gave {read:?}"
        );
    }
    node.stop();
}
