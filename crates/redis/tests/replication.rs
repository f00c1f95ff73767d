//! A DONE record counts as written only once a replica has it: a private
//! master and replica (`--replicaof`), the replica frozen with SIGSTOP as
//! a stalled host would be.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Claim, Fenced, Lease, ScopedKey, Store, StoreErrorKind,
};
use idemgate_redis::{RedisStore, WaitReplicas};
use idemgate_testkit::{acquired, attempt, fp, fresh_key};
use support::{Server, options, temp_root};

const TTL: Duration = Duration::from_secs(30);

fn done() -> Attempt {
    attempt(AttemptOutcome::Executed)
}

async fn claim(store: &RedisStore, key: &ScopedKey) -> Lease {
    acquired(store.claim(key, &fp("q"), TTL).await.unwrap())
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
    let k = fresh_key();
    let lease = claim(&store, &k).await;
    let w = store
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .unwrap();
    assert_eq!(w, Fenced::Applied);
    let copy = on_replica.get(&k).await.unwrap().expect("on the replica");
    assert!(copy.is_done());
    assert!(master.calls(&["wait"]) >= 1);

    // The replica stalls: the DONE is written on the master but not
    // acknowledged, so it is not trusted (a temporary error the owner holds
    // its result through).
    let k = fresh_key();
    let lease = claim(&store, &k).await;
    replica.pause();
    let err = store
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .expect_err("an unacknowledged DONE is not trusted");
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("replica"), "{err}");
    // Thawed, the owner's retry of the same completion is acknowledged.
    replica.resume();
    let w = store
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .unwrap();
    assert_eq!(w, Fenced::Applied);
    let copy = on_replica.get(&k).await.unwrap().expect("on the replica");
    assert_eq!(copy.payload().unwrap().as_ref(), b"answer");

    // The replica dies: the master stops reporting it at once, and that is
    // exactly when an unreplicated DONE must not be trusted.
    replica.stop();
    master.wait_replication("connected_slaves", "0");
    tokio::time::sleep(Duration::from_millis(1100)).await; // past the cached ROLE
    let k = fresh_key();
    let lease = claim(&store, &k).await;
    let err = store
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .expect_err("a replica seen a moment ago is still waited for");
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_replicas_waits_for_none_unless_told() {
    let mut node = Server::start(temp_root(), false);
    let auto = store(&node, WaitReplicas::Auto).await;
    let k = fresh_key();
    let lease = claim(&auto, &k).await;
    let w = auto
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .unwrap();
    assert_eq!(w, Fenced::Applied);
    assert_eq!(node.calls(&["wait"]), 0, "no replica, no WAIT");

    // Told to wait for one replica that does not exist: never trusted.
    let one = store(&node, WaitReplicas::Count(1)).await;
    let k = fresh_key();
    let lease = claim(&one, &k).await;
    let err = one
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .expect_err("no replica acknowledged");
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    node.stop();
}

/// A PENDING record that vanished — lost in a failover to a replica that
/// never had it, or expired and claimed by nobody — is written again as
/// DONE by its owner's completion: no other owner holds the key, so the
/// retry replays instead of running the work twice. Not after a newer
/// claim, a release or a forget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_record_is_written_again_by_its_owner() {
    let mut node = Server::start(temp_root(), false);
    let store = store(&node, WaitReplicas::Auto).await;
    let k = fresh_key();
    let lease = claim(&store, &k).await;
    // What a promoted replica that never had the claim looks like.
    let tag = idemgate_redis::hash_tag(&k);
    let prefix = options().prefix;
    let deleted = std::process::Command::new("redis-cli")
        .args(["-p", &node.port.to_string(), "del"])
        .arg(format!("{prefix}:{tag}:rec"))
        .arg(format!("{prefix}:{tag}:fence"))
        .output()
        .unwrap();
    assert!(deleted.status.success());
    assert_eq!(store.get(&k).await.unwrap(), None);
    let w = store
        .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
        .await
        .unwrap();
    assert_eq!(w, Fenced::Applied);
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
    let k = fresh_key();
    let lease = claim(&store, &k).await;
    assert_eq!(
        store.release(&lease, &done(), TTL).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        store
            .complete(&lease, Bytes::from_static(b"answer"), TTL, &done())
            .await
            .unwrap(),
        Fenced::Stale
    );
    assert_eq!(store.get(&k).await.unwrap(), None);
    node.stop();
}
