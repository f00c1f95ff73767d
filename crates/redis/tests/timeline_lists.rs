//! What the scripts leave in Redis for a timeline: its TTL and its length.
//! The scripts skip the `PTTL` of a list they just created and the `LTRIM`
//! of a list within bounds; these tests read the list back with
//! `redis-cli` to show that the list still lives as long as its longest
//! entry needs, never shorter, and never grows past the bound.

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{AttemptOutcome, Fenced, MAX_TIMELINE, ScopedKey, Store};
use idemgate_redis::{RedisStore, hash_tag};
use idemgate_testkit::{acquired, attempt, fp, fresh_key};

const SHARED_PORT: u16 = 6379;

/// A store on the shared Redis whose timeline entries are written on the
/// request path, so the list can be read back at once.
async fn store() -> RedisStore {
    connect(support::options().background_timeline(false)).await
}

async fn connect(opts: idemgate_redis::RedisOptions) -> RedisStore {
    match RedisStore::connect_with(support::SHARED_URL, opts).await {
        Ok(store) => store,
        Err(e) => {
            support::require(&format!("Redis at {} ({e})", support::SHARED_URL), false);
            unreachable!()
        }
    }
}

fn timeline_key(key: &ScopedKey) -> String {
    format!("{}:{}:tl", support::run_prefix(), hash_tag(key))
}

/// The list's TTL in ms, or Redis's -1 (none) / -2 (no list).
fn pttl(key: &ScopedKey) -> i64 {
    let out =
        support::redis_cli(SHARED_PORT, &["PTTL", &timeline_key(key)]).expect("redis-cli PTTL");
    out.trim().parse().expect("PTTL answers an integer")
}

fn llen(key: &ScopedKey) -> usize {
    let out =
        support::redis_cli(SHARED_PORT, &["LLEN", &timeline_key(key)]).expect("redis-cli LLEN");
    out.trim().parse().expect("LLEN answers an integer")
}

/// Appends a replay entry that must live `ttl`; returns the list's TTL.
async fn append_replay(store: &RedisStore, key: &ScopedKey, ttl: Duration) -> i64 {
    store
        .record_attempt(key, &attempt(AttemptOutcome::Replayed), ttl)
        .await
        .expect("record_attempt");
    pttl(key)
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_new_timeline_gets_the_records_ttl_and_a_longer_entry_extends_it() {
    let store = store().await;
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), MINUTE).await.unwrap());
    let done = store
        .complete(
            &lease,
            Bytes::from_static(b"answer"),
            MINUTE,
            &attempt(AttemptOutcome::Executed),
        )
        .await
        .unwrap();
    assert_eq!(done, Fenced::Applied);
    // Created by the complete: the record's TTL, not none.
    let first = pttl(&key);
    assert!(
        (50_000..=60_000).contains(&first),
        "a new timeline lives as long as its record, got {first} ms"
    );

    // A later entry that must live longer extends the list.
    let extended = append_replay(&store, &key, HOUR).await;
    assert!(
        (3_500_000..=3_600_000).contains(&extended),
        "an hour-long entry extends the list, got {extended} ms"
    );

    // A shorter one never shortens it.
    let kept = append_replay(&store, &key, MINUTE).await;
    assert!(
        kept > 3_000_000,
        "a minute-long entry shortened the list to {kept} ms"
    );
    assert_eq!(llen(&key), 3);
}

#[tokio::test]
async fn a_timeline_started_by_a_background_batch_gets_a_ttl() {
    // The background writer's script, with several entries at once.
    let store = connect(support::options()).await;
    let key = fresh_key();
    for _ in 0..3 {
        store
            .record_attempt(&key, &attempt(AttemptOutcome::Mismatch), MINUTE)
            .await
            .unwrap();
    }
    let landed = idemgate_testkit::eventually(|| async { llen(&key) == 3 }).await;
    assert!(landed, "the batch never landed: {} entries", llen(&key));
    let ttl = pttl(&key);
    assert!(
        (50_000..=60_000).contains(&ttl),
        "a list made by a batch lives as long as its entries, got {ttl} ms"
    );
}

#[tokio::test]
async fn a_timeline_is_trimmed_once_past_its_bound_and_not_before() {
    let store = store().await;
    let key = fresh_key();
    for _ in 0..MAX_TIMELINE {
        store
            .record_attempt(&key, &attempt(AttemptOutcome::Conflict), MINUTE)
            .await
            .unwrap();
    }
    assert_eq!(llen(&key), MAX_TIMELINE);
    for _ in 0..3 {
        store
            .record_attempt(&key, &attempt(AttemptOutcome::Conflict), MINUTE)
            .await
            .unwrap();
        assert_eq!(llen(&key), MAX_TIMELINE);
    }
    assert!(pttl(&key) > 0, "the trimmed list kept its TTL");
}
