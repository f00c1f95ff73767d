//! What the scripts leave in Redis for a timeline: its TTL and its length,
//! and where the executed attempt is kept. The scripts skip the `PTTL` of
//! a list they just created and the `LTRIM` of a list within bounds, and
//! keep the entry of a key run once in its record until a later entry
//! makes the list; these tests read Redis back with `redis-cli` to show
//! that the list still lives as long as its longest entry needs, never
//! shorter, never grows past the bound, and that the executed entry is
//! always in exactly one place.

mod support;

use std::time::Duration;

use idemgate_engine::{AttemptOutcome, Fenced, MAX_TIMELINE, ScopedKey, Store};
use idemgate_redis::{RedisStore, hash_tag};
use idemgate_testkit::{acquired, attempt, complete_executed, fp, fresh_key};

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

/// The name of one of `key`'s Redis keys (`tl`, `rec`).
fn redis_key(key: &ScopedKey, suffix: &str) -> String {
    format!("{}:{}:{suffix}", support::run_prefix(), hash_tag(key))
}

fn timeline_key(key: &ScopedKey) -> String {
    redis_key(key, "tl")
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

/// Records an attempt with `outcome` for `key` that must live `ttl`.
async fn record(store: &RedisStore, key: &ScopedKey, outcome: AttemptOutcome, ttl: Duration) {
    store
        .record_attempt(key, &attempt(outcome), ttl)
        .await
        .expect("record_attempt");
}

/// Appends a replay entry that must live `ttl`; returns the list's TTL.
async fn append_replay(store: &RedisStore, key: &ScopedKey, ttl: Duration) -> i64 {
    record(store, key, AttemptOutcome::Replayed, ttl).await;
    pttl(key)
}

/// Waits until the background writer's batch has made `key`'s list `n`
/// entries long.
async fn batch_lands(key: &ScopedKey, n: usize) {
    let landed = idemgate_testkit::eventually(|| async { llen(key) == n }).await;
    assert!(landed, "the batch never landed: {} entries", llen(key));
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// Claims and completes `key` with a first execution kept `ttl`.
async fn run_once(store: &RedisStore, key: &ScopedKey, ttl: Duration) {
    let lease = acquired(store.claim(key, &fp("a"), ttl).await.expect("claim"));
    let done = complete_executed(store, &lease, b"answer", ttl).await;
    assert_eq!(done, Fenced::Applied);
}

async fn outcomes(store: &RedisStore, key: &ScopedKey) -> Vec<AttemptOutcome> {
    let timeline = store.timeline(key).await.expect("timeline");
    timeline.iter().map(|a| a.outcome).collect()
}

/// Whether the record holds the executed attempt: the length written
/// after the value's 105-byte header is not 0.
fn record_holds_entry(key: &ScopedKey) -> bool {
    const ATTEMPT_LEN: &str = "local v = redis.call('GET', KEYS[1]) \
        return tonumber(string.sub(v, 106, string.find(v, ':', 106, true) - 1))";
    let out = support::redis_cli(
        SHARED_PORT,
        &["EVAL", ATTEMPT_LEN, "1", &redis_key(key, "rec")],
    )
    .expect("redis-cli EVAL");
    out.trim() != "0"
}

#[tokio::test]
async fn a_key_run_once_keeps_its_entry_in_the_record_and_has_no_list() {
    let store = store().await;
    let key = fresh_key();
    run_once(&store, &key, MINUTE).await;
    assert_eq!(pttl(&key), -2, "a key run once has no timeline list");
    assert!(record_holds_entry(&key));
    assert_eq!(outcomes(&store, &key).await, [AttemptOutcome::Executed]);
}

#[tokio::test]
async fn the_first_later_entry_makes_the_list_takes_the_entry_and_a_longer_one_extends_it() {
    let store = store().await;
    let key = fresh_key();
    run_once(&store, &key, MINUTE).await;

    // The list is made by the next entry, holds both, and lives as long
    // as the longer of them needs.
    let extended = append_replay(&store, &key, HOUR).await;
    assert!(
        (3_500_000..=3_600_000).contains(&extended),
        "an hour-long entry makes an hour-long list, got {extended} ms"
    );
    assert_eq!(llen(&key), 2);
    assert!(
        !record_holds_entry(&key),
        "the entry moved, it was not copied"
    );
    assert_eq!(
        outcomes(&store, &key).await,
        [AttemptOutcome::Executed, AttemptOutcome::Replayed]
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
async fn a_background_batch_takes_the_executed_entry_too() {
    let store = connect(support::options()).await;
    let key = fresh_key();
    run_once(&store, &key, MINUTE).await;
    for _ in 0..3 {
        record(&store, &key, AttemptOutcome::Replayed, HOUR).await;
    }
    batch_lands(&key, 4).await;
    assert!(!record_holds_entry(&key));
    assert_eq!(
        outcomes(&store, &key).await,
        [
            AttemptOutcome::Executed,
            AttemptOutcome::Replayed,
            AttemptOutcome::Replayed,
            AttemptOutcome::Replayed
        ]
    );
}

#[tokio::test]
async fn the_executed_entry_outlives_its_record_once_the_list_holds_it() {
    let store = store().await;
    let key = fresh_key();
    run_once(&store, &key, Duration::from_millis(300)).await;
    append_replay(&store, &key, HOUR).await;
    let gone =
        idemgate_testkit::eventually(|| async { store.get(&key).await.expect("get").is_none() })
            .await;
    assert!(gone, "the record never expired");
    assert_eq!(
        outcomes(&store, &key).await,
        [AttemptOutcome::Executed, AttemptOutcome::Replayed]
    );
}

#[tokio::test]
async fn a_completion_appends_to_the_list_a_key_already_has() {
    let store = store().await;
    let key = fresh_key();
    let lease = acquired(store.claim(&key, &fp("a"), MINUTE).await.unwrap());
    // A duplicate met the PENDING record: the key has a list already.
    record(&store, &key, AttemptOutcome::Conflict, MINUTE).await;
    let done = complete_executed(&store, &lease, b"answer", HOUR).await;
    assert_eq!(done, Fenced::Applied);
    assert!(!record_holds_entry(&key));
    assert_eq!(llen(&key), 2);
    let ttl = pttl(&key);
    assert!(
        ttl > 3_000_000,
        "the completion extends the list to the record's TTL, got {ttl} ms"
    );
    assert_eq!(
        outcomes(&store, &key).await,
        [AttemptOutcome::Conflict, AttemptOutcome::Executed]
    );
}

/// Readers on one connection, the appends that move the executed entry
/// into a new list on another: every read sees the entry exactly once.
/// A timeline read in two steps (the record's field, then the list) would
/// see it twice or not at all when a move lands between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeline_read_sees_the_executed_entry_exactly_once_while_it_moves() {
    let readers = store().await;
    let writers = store().await;
    for _ in 0..100 {
        let key = fresh_key();
        run_once(&writers, &key, MINUTE).await;
        let mut reads = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (store, key) = (readers.clone(), key.clone());
            reads.spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..8 {
                    seen.push(outcomes(&store, &key).await);
                }
                seen
            });
        }
        let write = {
            let (store, key) = (writers.clone(), key.clone());
            tokio::spawn(async move { append_replay(&store, &key, MINUTE).await })
        };
        for seen in reads.join_all().await.into_iter().flatten() {
            let executed = seen
                .iter()
                .filter(|o| **o == AttemptOutcome::Executed)
                .count();
            assert_eq!(executed, 1, "a read saw {seen:?}");
        }
        write.await.unwrap();
    }
}

#[tokio::test]
async fn a_timeline_started_by_a_background_batch_gets_a_ttl() {
    // The background writer's script, with several entries at once.
    let store = connect(support::options()).await;
    let key = fresh_key();
    for _ in 0..3 {
        record(&store, &key, AttemptOutcome::Mismatch, MINUTE).await;
    }
    batch_lands(&key, 3).await;
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
        record(&store, &key, AttemptOutcome::Conflict, MINUTE).await;
    }
    assert_eq!(llen(&key), MAX_TIMELINE);
    for _ in 0..3 {
        record(&store, &key, AttemptOutcome::Conflict, MINUTE).await;
        assert_eq!(llen(&key), MAX_TIMELINE);
    }
    assert!(pttl(&key) > 0, "the trimmed list kept its TTL");
}
