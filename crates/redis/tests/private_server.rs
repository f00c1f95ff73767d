//! Tests that need a Redis of their own (never the shared one on 6379):
//! round trips counted from `INFO commandstats`, and an outage — the server
//! stopped and restarted on the same port.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{Claim, Engine, Fenced, Store, StoreErrorKind};
use idemgate_redis::RedisStore;
use idemgate_testkit::round_trips::{
    assert_replays_in_order, claim_and_complete, claim_done, record_replays, run, timeline_reaches,
    warm_up, warm_up_timeline,
};
use idemgate_testkit::{complete_executed, executed, fp, fresh_key};
use support::Server;

const LONG: Duration = Duration::from_secs(300);

/// Commands the Lua scripts run inside the server. `INFO commandstats`
/// counts them too, so round trips are counted as: EVALSHA calls (only a
/// client can send those), GET calls (run inside the scripts a known number
/// of times: the record's value once per script that reads it, and the
/// fence counter once in a claim that writes), LRANGE
/// calls (run inside the timeline's script only), and every other command,
/// which must not appear at all (`HMGET` included: no record is a hash).
const INSIDE_SCRIPTS: &[&str] = &[
    "time", "set", "del", "rpush", "ltrim", "pttl", "pexpire", "exists", "lpush",
];

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    evalsha: u64,
    get: u64,
    lrange: u64,
    stray: u64,
}

fn counts(server: &Server) -> Counts {
    let mut skip = INSIDE_SCRIPTS.to_vec();
    skip.extend(["evalsha", "get", "lrange"]);
    Counts {
        evalsha: server.calls(&["evalsha"]),
        get: server.calls(&["get"]),
        lrange: server.calls(&["lrange"]),
        stray: server.calls_except(&skip),
    }
}

fn delta(a: Counts, b: Counts) -> Counts {
    Counts {
        evalsha: b.evalsha - a.evalsha,
        get: b.get - a.get,
        lrange: b.lrange - a.lrange,
        stray: b.stray - a.stray,
    }
}

const fn c(evalsha: u64, get: u64, lrange: u64) -> Counts {
    Counts {
        evalsha,
        get,
        lrange,
        stray: 0,
    }
}

/// A private server (its data under `root`) and a store on it.
async fn private(root: &tempfile::TempDir) -> (Server, RedisStore) {
    let server = tokio::task::spawn_blocking({
        let root = root.path().to_owned();
        move || Server::start(&root, false)
    })
    .await
    .unwrap();
    let store = RedisStore::connect_with(&server.url(), support::options())
        .await
        .unwrap();
    (server, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_operation() {
    let root = tempfile::tempdir().unwrap();
    let (server, store) = private(&root).await;
    // Warm up: load every script once (the first EVALSHA of a script answers
    // NOSCRIPT and is followed by SCRIPT LOAD).
    warm_up(&store).await;

    let stats = || tokio::task::block_in_place(|| counts(&server));

    // Store level: first execution = claim + complete; replay = claim.
    let k = fresh_key();
    let before = stats();
    let sets = tokio::task::block_in_place(|| server.calls(&["set"]));
    assert_eq!(claim_and_complete(&store, &k, b"r").await, Fenced::Applied);
    // GETs inside: the claim's of the record and of the fence counter, the
    // completion's of the record.
    assert_eq!(delta(before, stats()), c(2, 3, 0), "first execution");
    // Writes: the claim's PENDING record and the completion's DONE record.
    // A fresh key has no other owner to fence, so no fence counter.
    assert_eq!(
        tokio::task::block_in_place(|| server.calls(&["set"])) - sets,
        2,
        "a first execution writes its record twice and nothing else"
    );

    let before = stats();
    claim_done(&store, &k).await;
    assert_eq!(delta(before, stats()), c(1, 1, 0), "replay: one EVALSHA");

    let before = stats();
    store.get(&k).await.unwrap();
    assert_eq!(
        delta(before, stats()),
        c(1, 1, 0),
        "get: one EVALSHA (the server's clock judges a PENDING lease)"
    );
    let before = stats();
    store.timeline(&k).await.unwrap();
    assert_eq!(
        delta(before, stats()),
        c(1, 1, 1),
        "timeline: one EVALSHA (the record's entry and the list)"
    );

    // Through the engine: a first execution is claim + complete; a replay is
    // the claim, and the timeline entry the engine appends for it
    // (record_attempt) is written by the background writer, off the
    // request path: one more EVALSHA, counted once it has landed.
    let engine = Engine::new(Arc::new(store.clone()));
    let k = fresh_key();
    let before = stats();
    assert!(!run(&engine, &k, 1).await.replayed());
    assert_eq!(delta(before, stats()), c(2, 3, 0), "engine first execution");
    let before = stats();
    assert!(run(&engine, &k, 2).await.replayed());
    let polls = timeline_reaches(&store, &k, 2).await;
    let d = delta(before, stats());
    // GETs: the claim's, the entry's (the list it creates adopts the
    // record's entry), and one per timeline read.
    assert_eq!(
        (d.evalsha - polls, d.get - polls, d.stray),
        (2, 2, 0),
        "engine replay: claim + background timeline entry (besides {polls} timeline reads)"
    );
}

/// Timeline entries of replays are batched: 64 entries queued without the
/// caller yielding (one thread) are written with one script call, and all
/// of them land, in order.
#[tokio::test]
async fn background_timeline_entries_are_batched() {
    let root = tempfile::tempdir().unwrap();
    let (server, store) = private(&root).await;
    // Warm up: the first call of the batch script loads it.
    warm_up_timeline(&store).await;

    let k = fresh_key();
    // `counts` blocks this (only) thread briefly: nothing else needs it then.
    let c0 = counts(&server);
    record_replays(&store, &k, 64).await;
    let polls = timeline_reaches(&store, &k, 64).await;
    let d = delta(c0, counts(&server));
    assert_eq!(d.evalsha - polls, 1, "64 entries, one script call: {d:?}");
    assert_eq!(d.stray, 0);
    assert_replays_in_order(&store, &k, 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_server_restart() {
    let root = tempfile::tempdir().unwrap();
    let (mut server, store) = private(&root).await;
    let done = fresh_key();
    let Claim::Acquired(lease) = store.claim(&done, &fp("{}"), LONG).await.unwrap() else {
        panic!("claim")
    };
    let w = complete_executed(&store, &lease, b"kept", LONG).await;
    assert_eq!(w, Fenced::Applied);

    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();

    // During the outage every operation ends, with Unavailable.
    for _ in 0..5 {
        let bound = Duration::from_secs(30); // a hang detector, not a timing claim
        let claim = tokio::time::timeout(bound, store.claim(&fresh_key(), &fp("{}"), LONG))
            .await
            .expect("claim hung during the outage");
        assert_eq!(claim.unwrap_err().kind(), StoreErrorKind::Unavailable);
        let get = tokio::time::timeout(bound, store.get(&done))
            .await
            .expect("get hung during the outage");
        assert_eq!(get.unwrap_err().kind(), StoreErrorKind::Unavailable);
        let complete = tokio::time::timeout(
            bound,
            store.complete(&lease, Bytes::from_static(b"x"), LONG, &executed()),
        )
        .await
        .expect("complete hung during the outage");
        let e = complete.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        assert!(e.is_temporary());
    }

    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();

    // Back again: the same store recovers, and the DONE record survived
    // (append-only file, fsync always).
    let recovered = support_eventually(|| {
        let store = store.clone();
        let done = done.clone();
        async move { matches!(store.get(&done).await, Ok(Some(r)) if r.is_done()) }
    })
    .await;
    assert!(recovered, "the store never recovered after the restart");
    let rec = store.get(&done).await.unwrap().unwrap();
    assert_eq!(rec.payload().unwrap().as_ref(), b"kept");
    let fresh = fresh_key();
    let Claim::Acquired(lease) = store.claim(&fresh, &fp("{}"), LONG).await.unwrap() else {
        panic!("claim after restart")
    };
    assert!(lease.fence > 0);
}

async fn support_eventually<F, Fut>(check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut check = check;
    for _ in 0..200 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
