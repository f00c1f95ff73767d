//! Records written by earlier versions: a hash per record (`st`, `fp`,
//! `tok`, `fence`, `exp`, `body`, `att`) instead of one string. They stay
//! in a shared Redis for as long as their TTL runs after an upgrade, so the
//! store must read them, honour their leases and fences, and keep their
//! timeline entry and TTL when it rewrites them in the string layout.
//!
//! Each test writes such a hash by hand on the shared Redis, as the earlier
//! scripts did, then uses the store on it.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::record::now_ms;
use idemgate_engine::{
    AttemptOutcome, Claim, Fenced, Lease, MAX_TIMELINE, RecordState, ScopedKey, Store,
};
use idemgate_redis::{RedisStore, hash_tag};
use idemgate_testkit::{attempt, fp, fresh_key};
use redis::AsyncCommands;

const TTL: Duration = Duration::from_secs(600);
const TOKEN: u128 = 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef;
/// A fence as the earlier scripts wrote it: `%.0f` of server µs, no padding.
const FENCE: u64 = 1_764_000_000_123_456;

async fn store() -> RedisStore {
    match RedisStore::connect_with(
        support::SHARED_URL,
        support::options().background_timeline(false),
    )
    .await
    {
        Ok(store) => store,
        Err(e) => {
            support::require(&format!("Redis at {} ({e})", support::SHARED_URL), false);
            unreachable!()
        }
    }
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(support::SHARED_URL)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn rec_key(key: &ScopedKey) -> String {
    format!("{}:{}:rec", support::run_prefix(), hash_tag(key))
}

/// Writes `key`'s record as the earlier scripts did: PENDING (`body`
/// `None`) or DONE with `body` and the executed attempt in `att`; returns
/// the expiry written.
async fn write_hash(key: &ScopedKey, state: &str, body: Option<&[u8]>) -> u64 {
    let mut conn = raw().await;
    let exp = now_ms() + 600_000;
    let mut fields: Vec<(&str, Vec<u8>)> = vec![
        ("st", state.as_bytes().to_vec()),
        ("fp", fp("a").0.to_vec()),
        ("tok", format!("{TOKEN:032x}").into_bytes()),
        ("fence", FENCE.to_string().into_bytes()),
        ("exp", exp.to_string().into_bytes()),
    ];
    if let Some(body) = body {
        fields.push(("body", body.to_vec()));
        let executed = serde_json::to_vec(&attempt(AttemptOutcome::Executed)).unwrap();
        fields.push(("att", executed));
    }
    let rec = rec_key(key);
    let () = conn.hset_multiple(&rec, &fields).await.unwrap();
    let () = conn.pexpire(&rec, 600_000).await.unwrap();
    exp
}

async fn key_type(key: &ScopedKey) -> String {
    let mut conn = raw().await;
    redis::cmd("TYPE")
        .arg(rec_key(key))
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn pttl(key: &ScopedKey) -> i64 {
    raw().await.pttl(rec_key(key)).await.unwrap()
}

fn lease(key: &ScopedKey, fence: u64) -> Lease {
    Lease {
        key: key.clone(),
        token: TOKEN,
        fence,
        expires_at_ms: now_ms() + 600_000,
        fingerprint: fp("a"),
    }
}

async fn outcomes(store: &RedisStore, key: &ScopedKey) -> Vec<AttemptOutcome> {
    let timeline = store.timeline(key).await.unwrap();
    timeline.iter().map(|a| a.outcome).collect()
}

#[tokio::test]
async fn a_done_hash_replays_and_is_rewritten_with_its_ttl_and_entry() {
    let store = store().await;
    let key = fresh_key();
    let exp = write_hash(&key, "D", Some(b"stored answer")).await;

    let Claim::Existing(record) = store.claim(&key, &fp("a"), TTL).await.unwrap() else {
        panic!("a claim on a DONE record of an earlier version acquired it")
    };
    assert_eq!(record.fingerprint, fp("a"));
    assert_eq!(
        record.state,
        RecordState::Done {
            payload: Bytes::from_static(b"stored answer"),
            expires_at_ms: exp
        }
    );
    assert_eq!(
        key_type(&key).await,
        "string",
        "rewritten in the new layout"
    );
    let left = pttl(&key).await;
    assert!(
        (590_000..=600_000).contains(&left),
        "the rewrite kept the TTL, got {left} ms"
    );
    // The executed attempt came along; the next entry moves it to a list.
    assert_eq!(outcomes(&store, &key).await, [AttemptOutcome::Executed]);
    store
        .record_attempt(&key, &attempt(AttemptOutcome::Replayed), TTL)
        .await
        .unwrap();
    assert_eq!(
        outcomes(&store, &key).await,
        [AttemptOutcome::Executed, AttemptOutcome::Replayed]
    );
    assert_eq!(store.get(&key).await.unwrap(), Some(record));
}

#[tokio::test]
async fn get_reads_a_hash_and_a_timeline_read_finds_its_entry() {
    let store = store().await;
    let key = fresh_key();
    let exp = write_hash(&key, "D", Some(b"")).await;
    let record = store.get(&key).await.unwrap().expect("the record");
    assert_eq!(
        record.state,
        RecordState::Done {
            payload: Bytes::new(),
            expires_at_ms: exp
        }
    );
    assert_eq!(key_type(&key).await, "string");

    let key = fresh_key();
    write_hash(&key, "D", Some(b"x")).await;
    assert_eq!(outcomes(&store, &key).await, [AttemptOutcome::Executed]);
    assert_eq!(key_type(&key).await, "string");
}

#[tokio::test]
async fn a_pending_hash_keeps_its_lease_and_fence() {
    let store = store().await;
    let key = fresh_key();
    let exp = write_hash(&key, "P", None).await;
    let Claim::Existing(record) = store.claim(&key, &fp("a"), TTL).await.unwrap() else {
        panic!("a claim took a key leased by an earlier version")
    };
    assert_eq!(
        record.state,
        RecordState::Pending {
            fence: FENCE,
            lease_expires_at_ms: exp
        }
    );
    // Only its own token and fence move it on.
    let mut wrong = lease(&key, FENCE + 1);
    assert_eq!(store.renew(&mut wrong, TTL).await.unwrap(), Fenced::Stale);
    let done = attempt(AttemptOutcome::Executed);
    assert_eq!(
        store
            .complete(&wrong, Bytes::from_static(b"late"), TTL, &done)
            .await
            .unwrap(),
        Fenced::Stale
    );
    let mut owner = lease(&key, FENCE);
    assert_eq!(store.renew(&mut owner, TTL).await.unwrap(), Fenced::Applied);
    assert!(owner.expires_at_ms >= exp, "the renewal moved the lease on");
    assert_eq!(
        store
            .complete(&owner, Bytes::from_static(b"answer"), TTL, &done)
            .await
            .unwrap(),
        Fenced::Applied
    );
    let Claim::Existing(record) = store.claim(&key, &fp("a"), TTL).await.unwrap() else {
        panic!("the completed key ran again")
    };
    assert!(matches!(record.state, RecordState::Done { payload, .. } if payload == "answer"));
    // A fresh claim after a forget gets a greater fence than the hash had.
    assert!(
        store
            .forget(&key, &attempt(AttemptOutcome::Forgotten), TTL)
            .await
            .unwrap()
    );
    let Claim::Acquired(next) = store.claim(&key, &fp("a"), TTL).await.unwrap() else {
        panic!("a forgotten key was not claimable")
    };
    assert!(next.fence > FENCE);
}

#[tokio::test]
async fn release_and_forget_act_on_hashes() {
    let store = store().await;
    let key = fresh_key();
    write_hash(&key, "P", None).await;
    let released = attempt(AttemptOutcome::Failed);
    assert_eq!(
        store
            .release(&lease(&key, FENCE), &released, TTL)
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert_eq!(outcomes(&store, &key).await, [AttemptOutcome::Failed]);

    let key = fresh_key();
    write_hash(&key, "D", Some(b"answer")).await;
    assert!(
        store
            .forget(&key, &attempt(AttemptOutcome::Forgotten), TTL)
            .await
            .unwrap()
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert_eq!(
        outcomes(&store, &key).await,
        [AttemptOutcome::Executed, AttemptOutcome::Forgotten],
        "the forget adopted the hash's executed attempt"
    );
    assert!(outcomes(&store, &key).await.len() <= MAX_TIMELINE);
}
