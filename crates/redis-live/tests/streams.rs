//! The Redis Streams backend against the shared Redis on 127.0.0.1:6379
//! under a random key prefix, and against a private 3-primary Redis
//! Cluster and a private Redis that speaks TLS only (both started with the
//! Redis store's test helpers). Owner and follower use separate
//! `RedisLiveEvents` instances, as two replicas would, so every follow
//! goes through Redis rather than the in-process registry.
//!
//! Sealed streams: an entry that does not open (a key the reader does not
//! hold, an entry copied to another position) is a store error, counted by
//! the seal-failure hook, never skipped.
//!
//! Under `CI=true` a missing Redis fails the suite; it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../redis/tests/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idemgate_engine::{ClientKey, ScopedKey, StoreErrorKind};
use idemgate_layer::LiveEvents;
use idemgate_layer::live::{Joined, LiveFollower, LivePublisher, LiveStream, Next};
use idemgate_redis_live::{FanoutOptions, RedisLiveEvents};
use idemgate_seal::store::FailureHook;
use idemgate_seal::{KeyRing, SealErrorKind};
use tokio::time::Instant;

const REDIS: &str = "redis://127.0.0.1:6379";

async fn replica(url: &str, prefix: &str) -> RedisLiveEvents {
    let opts = FanoutOptions::default()
        .prefix(prefix)
        .block(Duration::from_millis(200));
    match RedisLiveEvents::connect(url, opts).await {
        Ok(r) => r,
        Err(e) => {
            support::require(&format!("Redis at {url} ({e})"), false);
            unreachable!()
        }
    }
}

async fn cluster() -> &'static str {
    tokio::task::spawn_blocking(support::cluster_url)
        .await
        .unwrap()
}

fn prefix() -> String {
    format!("igfan{:08x}", rand::random::<u32>())
}

fn stream(key: &ScopedKey, fence: u64) -> LiveStream {
    LiveStream {
        key: key.clone(),
        fence,
        horizon: Duration::from_secs(30),
    }
}

fn event(n: u32) -> Bytes {
    Bytes::from(format!("id: {n}\ndata: token {n}\n\n"))
}

/// Publishes a stream for a new key on `owner` (fence 1000), begun as an
/// event stream with events 1 to `events` sent; the key and the publisher.
fn publish_sse(owner: &RedisLiveEvents, events: u32) -> (ScopedKey, Box<dyn LivePublisher>) {
    let key = ScopedKey::new("t", "ns", ClientKey::mint());
    let publisher = owner.publish(stream(&key, 1000));
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "text/event-stream".parse().unwrap());
    publisher.streaming(StatusCode::OK, headers);
    for n in 1..=events {
        publisher.event(event(n));
    }
    (key, publisher)
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

async fn join(r: &RedisLiveEvents, key: &ScopedKey, fence: u64) -> Box<dyn LiveFollower> {
    // The writer is asynchronous: give it a moment to publish the head.
    for _ in 0..100 {
        match r.join(key, fence, soon()).await {
            Joined::Streaming { status, follow, .. } => {
                assert_eq!(status, StatusCode::OK);
                return follow;
            }
            Joined::NotStreaming => panic!("a stream was published"),
            Joined::Failed(e) => panic!("the stream cannot be read: {e}"),
            Joined::Unknown => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("the stream never became visible to the other replica");
}

/// Reads until the stream ends (`End` or `Failed`); quiet blocks
/// (`Unsure`) are waited through, a few seconds at most.
async fn read_all(f: &mut Box<dyn LiveFollower>, cursor: &mut usize) -> (Vec<u8>, Next) {
    let mut out = Vec::new();
    let mut quiet = 0;
    loop {
        match f.next(cursor).await {
            Next::Events(b) => out.extend_from_slice(&b),
            Next::Unsure => {
                quiet += 1;
                assert!(quiet < 25, "the stream never ended");
            }
            other => return (out, other),
        }
    }
}

async fn follow_from_cursor_then_live(url: &str) {
    let p = prefix();
    let (owner, other) = (replica(url, &p).await, replica(url, &p).await);
    let (key, publisher) = publish_sse(&owner, 3);
    let mut follow = join(&other, &key, 1000).await;
    let mut cursor = 1;
    let mut got = Vec::new();
    while cursor < 3 {
        match follow.next(&mut cursor).await {
            Next::Events(b) => got.extend_from_slice(&b),
            Next::Unsure => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, [event(2), event(3)].concat());
    let reader = tokio::spawn(async move {
        let mut cursor = 3;
        let (bytes, end) = read_all(&mut follow, &mut cursor).await;
        (bytes, end, cursor)
    });
    for n in 4..=6 {
        publisher.event(event(n));
    }
    publisher.complete();
    let (bytes, end, cursor) = reader.await.unwrap();
    assert_eq!(bytes, [event(4), event(5), event(6)].concat());
    assert_eq!(end, Next::End);
    assert_eq!(cursor, 6);
    // A late joiner reads the whole stream and the end marker.
    let mut late = join(&other, &key, 1000).await;
    let mut cursor = 0;
    let (all, end) = read_all(&mut late, &mut cursor).await;
    assert_eq!(end, Next::End);
    assert_eq!(all, (1..=6).map(event).collect::<Vec<_>>().concat());
    assert_eq!(cursor, 6);
    assert_eq!(other.local_streams(), 0);
}

/// A follower whose cursor (the client's `Last-Event-ID`) is beyond the
/// end of a finished stream gets the end at once, as on the owner's replica.
async fn cursor_beyond_the_end(url: &str) {
    let p = prefix();
    let (owner, other) = (replica(url, &p).await, replica(url, &p).await);
    let (key, publisher) = publish_sse(&owner, 3);
    let mut follow = join(&other, &key, 1000).await;
    publisher.complete();
    let mut cursor = 10;
    let (bytes, end) = read_all(&mut follow, &mut cursor).await;
    assert!(bytes.is_empty());
    assert_eq!(end, Next::End);
    assert_eq!(cursor, 10);
}

async fn takeover(url: &str) {
    let p = prefix();
    let (old_owner, new_owner, other) = (
        replica(url, &p).await,
        replica(url, &p).await,
        replica(url, &p).await,
    );
    let key = ScopedKey::new("t", "ns", ClientKey::mint());
    let old = old_owner.publish(stream(&key, 1000));
    old.streaming(StatusCode::OK, HeaderMap::new());
    old.event(event(1));
    let mut follow_old = join(&other, &key, 1000).await;
    let mut cursor = 0;
    assert_eq!(follow_old.next(&mut cursor).await, Next::Events(event(1)));

    // The lease expired; another owner (a higher fence) streams now.
    let new = new_owner.publish(stream(&key, 2000));
    new.streaming(StatusCode::OK, HeaderMap::new());
    new.event(Bytes::from_static(b"id: 1\ndata: other\n\n"));
    let mut follow_new = join(&other, &key, 2000).await;
    let mut c2 = 0;
    assert_eq!(
        follow_new.next(&mut c2).await,
        Next::Events(Bytes::from_static(b"id: 1\ndata: other\n\n"))
    );
    // The stale owner resumes: Redis refuses its entries (ids below the
    // top), so the new owner's followers never see them.
    old.event(event(2));
    old.complete();
    new.event(Bytes::from_static(b"id: 2\ndata: more\n\n"));
    new.complete();
    let (rest, end) = read_all(&mut follow_new, &mut c2).await;
    assert_eq!(rest, b"id: 2\ndata: more\n\n");
    assert_eq!(end, Next::End);
    // The old owner's follower learns of the takeover instead of splicing.
    let (none, end_old) = read_all(&mut follow_old, &mut cursor).await;
    assert!(none.is_empty(), "no event of another owner");
    assert_eq!(end_old, Next::Failed);
    assert_eq!(cursor, 1);
}

async fn unknown_and_dropped(url: &str) {
    let p = prefix();
    let (owner, other) = (replica(url, &p).await, replica(url, &p).await);
    let key = ScopedKey::new("t", "ns", ClientKey::mint());
    assert!(matches!(other.join(&key, 1, soon()).await, Joined::Unknown));
    // A non-streaming response publishes nothing to Redis.
    let p1 = owner.publish(stream(&key, 5));
    p1.not_streaming();
    assert!(matches!(other.join(&key, 5, soon()).await, Joined::Unknown));
    drop(p1);
    // An owner dropped mid-stream (a panic) ends its followers with a failure.
    let p2 = owner.publish(stream(&key, 6));
    p2.streaming(StatusCode::OK, HeaderMap::new());
    p2.event(event(1));
    let mut f = join(&other, &key, 6).await;
    drop(p2);
    let mut cursor = 0;
    let (bytes, end) = read_all(&mut f, &mut cursor).await;
    assert_eq!(bytes, event(1));
    assert_eq!(end, Next::Failed);
    // A fence with no head (the owner of the record has not streamed).
    assert!(matches!(other.join(&key, 7, soon()).await, Joined::Unknown));
}

#[tokio::test]
async fn a_follower_on_another_replica_reads_from_its_cursor_then_live_to_the_end() {
    follow_from_cursor_then_live(REDIS).await;
}

#[tokio::test]
async fn a_cursor_beyond_the_end_ends_the_follow() {
    cursor_beyond_the_end(REDIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cursor_beyond_the_end() {
    cursor_beyond_the_end(cluster().await).await;
}

#[tokio::test]
async fn a_takeover_ends_the_old_owners_followers_and_fences_its_late_events() {
    takeover(REDIS).await;
}

#[tokio::test]
async fn unknown_streams_and_dropped_owners() {
    unknown_and_dropped(REDIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_follow_from_cursor_then_live() {
    follow_from_cursor_then_live(cluster().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_takeover() {
    takeover(cluster().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_unknown_and_dropped() {
    unknown_and_dropped(cluster().await).await;
}

fn ring(id: &str) -> Arc<KeyRing> {
    let line = idemgate_seal::generate_key_line(id).unwrap();
    Arc::new(KeyRing::parse(&format!("*{line}\n")).unwrap())
}

/// A hook that records each failure's reason.
fn counting() -> (FailureHook, Arc<Mutex<Vec<&'static str>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = Arc::clone(&seen);
    let hook: FailureHook = Arc::new(move |kind: &SealErrorKind| {
        into.lock()
            .unwrap()
            .push(idemgate_seal::store::failure_reason(kind));
    });
    (hook, seen)
}

async fn sealed_replica(prefix: &str, ring: Arc<KeyRing>, hook: FailureHook) -> RedisLiveEvents {
    let opts = FanoutOptions::default()
        .prefix(prefix)
        .block(Duration::from_millis(200))
        .key_ring(ring)
        .on_seal_failure(hook);
    match RedisLiveEvents::connect(REDIS, opts).await {
        Ok(r) => r,
        Err(e) => {
            support::require(&format!("Redis at {REDIS} ({e})"), false);
            unreachable!()
        }
    }
}

#[tokio::test]
async fn sealed_entries_that_do_not_open_are_counted_store_errors() {
    let p = prefix();
    let (hook, seen) = counting();
    let mine = ring("k1");
    let owner = sealed_replica(&p, Arc::clone(&mine), Arc::clone(&hook)).await;
    let friend = sealed_replica(&p, mine, Arc::clone(&hook)).await;
    // A replica whose ring lacks the owner's key (a rotation done halfway).
    let stranger = sealed_replica(&p, ring("k2"), hook).await;
    let (key, publisher) = publish_sse(&owner, 1);

    // The replica with the key follows; the stranger gets a store error,
    // not "no stream here".
    let mut follow = join(&friend, &key, 1000).await;
    match stranger.join(&key, 1000, soon()).await {
        Joined::Failed(e) => {
            assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
            assert!(e.to_string().contains("does not open"), "{e}");
        }
        Joined::Streaming { .. } => panic!("a head sealed under another key was read"),
        other => panic!("a head that does not open is a store error, got {other:?}"),
    }
    assert_eq!(*seen.lock().unwrap(), ["unknown_key_id"]);

    let mut cursor = 0;
    assert_eq!(follow.next(&mut cursor).await, Next::Events(event(1)));
    // Entry 1's sealed bytes copied to position 2, in Redis itself: bound
    // to its position, it does not open there, and the follow fails.
    let stream_key = friend.stream_key(&key);
    let client = redis::Client::open(REDIS).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let first: redis::Value = redis::cmd("XRANGE")
        .arg(&stream_key)
        .arg("1000-1")
        .arg("1000-1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let sealed = match &first {
        redis::Value::Array(entries) => match entries.first() {
            Some(redis::Value::Array(parts)) => match parts.get(1) {
                Some(redis::Value::Array(fields)) => fields.get(1).cloned(),
                Some(redis::Value::Map(fields)) => fields.first().map(|(_, v)| v.clone()),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    };
    let Some(redis::Value::BulkString(sealed)) = sealed else {
        panic!("entry 1 is not in the stream: {first:?}");
    };
    assert_ne!(sealed, event(1).to_vec(), "entries are sealed in Redis");
    let _: String = redis::cmd("XADD")
        .arg(&stream_key)
        .arg("1000-2")
        .arg("e")
        .arg(sealed)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (rest, end) = read_all(&mut follow, &mut cursor).await;
    assert!(rest.is_empty(), "nothing of the moved entry is handed out");
    assert_eq!(end, Next::Failed);
    assert_eq!(cursor, 1);
    assert_eq!(*seen.lock().unwrap(), ["unknown_key_id", "tampered"]);
    drop(publisher);
    let _: i64 = redis::cmd("DEL")
        .arg(&stream_key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Followers on a replica that reaches Redis over TLS (a private server
/// that speaks TLS only, its CA named by `tls_ca`): the shared connection
/// and the dedicated blocking ones alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_follow_from_cursor_then_live() {
    let url = tokio::task::spawn_blocking(support::tls_url).await.unwrap();
    follow_from_cursor_then_live(url).await;
}

#[tokio::test]
async fn a_password_in_the_url_is_not_in_the_connect_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("redis://:s3cr3t-pw@127.0.0.1:{port}/"),
        format!("rediss+cluster://:s3cr3t-pw@127.0.0.1:{port}/"),
    ] {
        let err = RedisLiveEvents::connect(&url, FanoutOptions::default())
            .await
            .expect_err("nothing listens there");
        let shown = format!("{err} | {err:?}");
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
    }
}
