//! Encryption at rest through the real gateway: what each store holds after
//! a request whose answer carries a marker (nothing readable with a key
//! ring, the marker itself without one), key rotation across restarts, and
//! a tampered row answered with 503, never with garbage.
//!
//! The Redis and PostgreSQL cases use the shared servers (127.0.0.1:6379,
//! db `test`) under a random prefix or schema; a missing server fails them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::TestGateway;

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::RawInflightMode;
use idemgate_testkit::postgres_server;
use tokio::net::TcpListener;

const REDIS: &str = "redis://127.0.0.1:6379";

fn tag() -> String {
    format!("igenc{:08x}", rand::random::<u32>())
}

/// An upstream whose answers repeat the marker the request names (JSON, or
/// an event stream when the request asks for one).
async fn upstream() -> String {
    async fn answer(body: Bytes) -> Response {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let marker = v["marker"].as_str().unwrap_or("none").to_owned();
        if v["stream"].as_bool() == Some(true) {
            let mut sse = String::new();
            for i in 0..3 {
                sse.push_str(&format!("data: {{\"delta\":\"{marker} part {i}\"}}\n\n"));
            }
            sse.push_str("data: [DONE]\n\n");
            ([("content-type", "text/event-stream")], sse).into_response()
        } else {
            (
                [("content-type", "application/json")],
                format!("{{\"answer\":\"{marker}\"}}"),
            )
                .into_response()
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().fallback(answer))
            .await
            .unwrap();
    });
    url
}

/// A keyed route on `store` in front of `upstream` (the gateway's default
/// timeouts), with the encryption key file `key_file` if given.
fn config(store: &str, upstream: &str, key_file: Option<&Path>) -> GatewayConfig {
    support::keyed(store, upstream)
        // Streams are published live (to Redis, with that store).
        .on_inflight(RawInflightMode::Attach)
        .route(|r| r.timeouts = None)
        .config(|c| {
            c.encryption_key_file =
                key_file.map(|p| figment::value::magic::RelativePathBuf::from(p.to_path_buf()));
        })
        .into_config()
}

/// A key file in `dir` with fresh keys `ids`, `active` marked; returns its
/// path. The same id keeps its key across calls within `dir`.
fn key_file(dir: &Path, ids: &[&str], active: &str) -> PathBuf {
    let mut text = String::new();
    for id in ids {
        let saved = dir.join(format!("key-{id}"));
        let line = match std::fs::read_to_string(&saved) {
            Ok(l) => l,
            Err(_) => {
                let l = idemgate_seal::generate_key_line(id).unwrap();
                std::fs::write(&saved, &l).unwrap();
                l
            }
        };
        if *id == active {
            text.push('*');
        }
        text.push_str(&line);
        text.push('\n');
    }
    let path = dir.join(format!("keys-{}-{active}", ids.join("-")));
    std::fs::write(&path, text).unwrap();
    path
}

async fn post(
    gw: &TestGateway,
    key: &str,
    marker: &str,
    stream: bool,
) -> (u16, Option<String>, String) {
    let body = serde_json::json!({ "marker": marker, "stream": stream });
    let url = format!("{}/v1/chat", gw.base);
    let client = reqwest::Client::new();
    let r = support::keyed_post(&client, url, "Bearer sk-enc-test", key, body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let replayed = idemgate_testkit::http::replayed(&r);
    (status, replayed, r.text().await.unwrap())
}

/// Starts a gateway and fails the test when its store cannot be opened.
async fn start(config: GatewayConfig) -> TestGateway {
    let gw = TestGateway::start(config).await;
    for _ in 0..50 {
        if reqwest::get(format!("{}/readyz", gw.admin))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return gw;
        }
        if gw.task.is_finished() {
            let err = gw.stop().await.err();
            panic!(
                "the gateway did not start: {err:?} (start the servers with `bash scripts/services.sh`)"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the gateway did not become ready");
}

async fn stop(gw: TestGateway) {
    gw.stop().await.expect("stop cleanly");
}

/// Sends a JSON and a streaming request carrying `marker`, checks both are
/// answered and replayed with it, and returns the gateway still running.
async fn exercise(gw: &TestGateway, marker: &str) {
    for (key, stream) in [("enc-json", false), ("enc-sse", true)] {
        let (status, replayed, body) = post(gw, key, marker, stream).await;
        assert_eq!(
            (status, replayed.as_deref()),
            (200, Some("false")),
            "{body}"
        );
        assert!(body.contains(marker), "{body}");
        let (status, replayed, again) = post(gw, key, marker, stream).await;
        assert_eq!(
            (status, replayed.as_deref()),
            (200, Some("true")),
            "{again}"
        );
        assert_eq!(again, body);
    }
}

fn holds(haystack: &[u8], marker: &str) -> bool {
    let hexed = hex::encode(marker.as_bytes());
    [marker.as_bytes(), hexed.as_bytes()]
        .iter()
        .any(|needle| haystack.windows(needle.len()).any(|w| w == *needle))
}

/// Every byte of the SQLite file and its WAL.
fn sqlite_bytes(db: &Path) -> Vec<u8> {
    let mut all = std::fs::read(db).unwrap();
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    if let Ok(w) = std::fs::read(&wal) {
        all.extend(w);
    }
    all
}

/// A gateway on `store` (sealed with key `a`, its key file in `dir`, when
/// `encrypted`) that has been [`exercise`]d with a fresh marker; returns it
/// and the marker.
async fn exercised(store: &str, dir: &Path, encrypted: bool) -> (TestGateway, String) {
    let keys = encrypted.then(|| key_file(dir, &["a"], "a"));
    let marker = format!("SECRET-ANSWER-{}", tag());
    let gw = start(config(store, &upstream().await, keys.as_deref())).await;
    exercise(&gw, &marker).await;
    (gw, marker)
}

/// Runs `case` unsealed, the control, which must find the marker, and
/// sealed, which must not (`leaked` says where it was found).
async fn sealed_hides_the_marker<F: std::future::Future<Output = bool>>(
    case: impl Fn(bool) -> F,
    leaked: &str,
) {
    assert!(
        case(false).await,
        "the unsealed control must find the marker"
    );
    assert!(!case(true).await, "{leaked}");
}

/// A fresh directory, the SQLite file `store.db` in it, and that store's
/// URL.
fn sqlite_store() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let store = format!("sqlite:{}", db.display());
    (dir, db, store)
}

async fn sqlite_case(encrypted: bool) -> bool {
    let (dir, db, store) = sqlite_store();
    let (gw, marker) = exercised(&store, dir.path(), encrypted).await;
    let running = holds(&sqlite_bytes(&db), &marker);
    stop(gw).await;
    running || holds(&sqlite_bytes(&db), &marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_and_wal_never_hold_the_answer_when_sealed() {
    sealed_hides_the_marker(sqlite_case, "the marker reached the SQLite file or its WAL").await;
}

/// A connection to the shared Redis, and the keys under `prefix`.
async fn redis_keys(prefix: &str) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let client = redis::Client::open(REDIS).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    (conn, keys)
}

/// Every value under `prefix`, read by type.
async fn redis_values(prefix: &str) -> Vec<u8> {
    let (mut conn, keys) = redis_keys(prefix).await;
    assert!(!keys.is_empty(), "nothing stored under {prefix}");
    let mut all = Vec::new();
    let mut streams = 0;
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        streams += usize::from(kind == "stream");
        let mut cmd = match kind.as_str() {
            "string" => redis::cmd("GET"),
            "hash" => redis::cmd("HGETALL"),
            "list" => redis::cmd("LRANGE"),
            "set" => redis::cmd("SMEMBERS"),
            "zset" => redis::cmd("ZRANGE"),
            "stream" => redis::cmd("XRANGE"),
            other => panic!("key {key} of type {other}"),
        };
        cmd.arg(&key);
        match kind.as_str() {
            "list" | "zset" => {
                cmd.arg(0).arg(-1);
            }
            "stream" => {
                cmd.arg("-").arg("+");
            }
            _ => {}
        }
        let v: redis::Value = cmd.query_async(&mut conn).await.unwrap();
        flatten(&v, &mut all);
    }
    assert!(
        streams > 0,
        "no live stream under {prefix}: the SSE case was not covered"
    );
    all
}

fn flatten(v: &redis::Value, out: &mut Vec<u8>) {
    match v {
        redis::Value::BulkString(b) => out.extend_from_slice(b),
        redis::Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|i| flatten(i, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        _ => {}
    }
}

async fn drop_prefix(prefix: &str) {
    let (mut conn, keys) = redis_keys(prefix).await;
    for k in keys {
        let _: () = redis::cmd("DEL")
            .arg(k)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

async fn redis_case(encrypted: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let (gw, marker) = exercised(&store, dir.path(), encrypted).await;
    // The live stream of the SSE request is kept for its end grace.
    let found = holds(&redis_values(&prefix).await, &marker);
    stop(gw).await;
    drop_prefix(&prefix).await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_records_and_live_streams_never_hold_the_answer_when_sealed() {
    sealed_hides_the_marker(redis_case, "the marker reached a Redis value").await;
}

async fn psql(sql: &str) -> String {
    let out = tokio::process::Command::new("psql")
        .args([&postgres_server::shared_url(), "-q", "-A", "-t", "-c", sql])
        .output()
        .await
        .expect("run psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn postgres_case(encrypted: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let schema = tag();
    let store = format!("{}?schema={schema}&pool=4", postgres_server::shared_url());
    let (gw, marker) = exercised(&store, dir.path(), encrypted).await;
    stop(gw).await;
    let tables = psql(&format!(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'"
    ))
    .await;
    let mut all = String::new();
    for t in tables.lines().filter(|t| !t.is_empty()) {
        all.push_str(&psql(&format!("SELECT t::text FROM {schema}.{t} t")).await);
    }
    assert!(all.len() > 100, "nothing read from schema {schema}: {all}");
    psql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    holds(all.as_bytes(), &marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_never_hold_the_answer_when_sealed() {
    sealed_hides_the_marker(postgres_case, "the marker reached a PostgreSQL row").await;
}

async fn metrics(gw: &TestGateway) -> String {
    reqwest::get(format!("{}/metrics", gw.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Asserts that `key`'s stored answer on `gw` is refused, closed: a 503
/// `store-unavailable` problem, not a replay, that shows nothing of the
/// answer (`marker`); and that a seal failure of `reason` is counted.
async fn assert_refused_closed(gw: &TestGateway, key: &str, marker: &str, reason: &str) {
    let (status, replayed, body) = post(gw, key, marker, false).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(replayed, None);
    assert!(!body.contains(marker), "{body}");
    assert!(body.contains("store-unavailable"), "{body}");
    assert_seal_failures(gw, reason).await;
}

/// Asserts that `gw`'s `/metrics` counts seal failures of `reason`.
async fn assert_seal_failures(gw: &TestGateway, reason: &str) {
    let m = metrics(gw).await;
    let series = format!("idemgate_seal_failures_total{{reason=\"{reason}\"}}");
    assert!(m.lines().any(|l| l.starts_with(&series)), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_replays_old_records_until_their_key_is_removed_then_fails_closed() {
    let (dir, _db, store) = sqlite_store();
    let up = upstream().await;
    let marker = format!("SECRET-ANSWER-{}", tag());

    let gw = start(config(
        &store,
        &up,
        Some(&key_file(dir.path(), &["a"], "a")),
    ))
    .await;
    let (status, replayed, first) = post(&gw, "rot-1", &marker, false).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("false")));
    stop(gw).await;

    // B active, A kept for opening: the record sealed under A replays.
    let gw = start(config(
        &store,
        &up,
        Some(&key_file(dir.path(), &["a", "b"], "b")),
    ))
    .await;
    let (status, replayed, body) = post(&gw, "rot-1", &marker, false).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("true")));
    assert_eq!(body, first);
    let (status, _, _) = post(&gw, "rot-2", &marker, false).await;
    assert_eq!(status, 200);
    stop(gw).await;

    // A removed: its record is refused (fail closed), counted; the record
    // sealed under B still replays.
    let gw = start(config(
        &store,
        &up,
        Some(&key_file(dir.path(), &["b"], "b")),
    ))
    .await;
    assert_refused_closed(&gw, "rot-1", &marker, "unknown_key_id").await;
    let (status, replayed, _) = post(&gw, "rot-2", &marker, false).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("true")));
    stop(gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_row_is_answered_503_not_garbage() {
    let (dir, db, store) = sqlite_store();
    let keys = key_file(dir.path(), &["a"], "a");
    let up = upstream().await;
    let marker = format!("SECRET-ANSWER-{}", tag());

    let gw = start(config(&store, &up, Some(&keys))).await;
    assert_eq!(post(&gw, "tamper", &marker, false).await.0, 200);
    stop(gw).await;

    // Flip one byte of the sealed payload, in the row itself.
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut payload: Vec<u8> = conn
            .query_row("SELECT payload FROM records WHERE done = 1", [], |r| {
                r.get(0)
            })
            .unwrap();
        let last = payload.len() - 20;
        payload[last] ^= 0x01;
        let n = conn
            .execute("UPDATE records SET payload = ?1 WHERE done = 1", [&payload])
            .unwrap();
        assert_eq!(n, 1);
    }

    let gw = start(config(&store, &up, Some(&keys))).await;
    assert_refused_closed(&gw, "tamper", &marker, "tampered").await;
    stop(gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_body_false_keeps_status_and_headers_and_replays_an_empty_body() {
    let (_dir, db, store) = sqlite_store();
    let marker = format!("SECRET-ANSWER-{}", tag());
    let mut config = config(&store, &upstream().await, None);
    config.routes[0].store_body = false;
    let gw = start(config).await;
    for (key, stream) in [("min-json", false), ("min-sse", true)] {
        let (status, replayed, body) = post(&gw, key, &marker, stream).await;
        assert_eq!((status, replayed.as_deref()), (200, Some("false")));
        assert!(
            body.contains(&marker),
            "the first caller gets the answer: {body}"
        );
        let body = serde_json::json!({ "marker": marker, "stream": stream }).to_string();
        let url = format!("{}/v1/chat", gw.base);
        let client = reqwest::Client::new();
        let retry = support::keyed_post(&client, url, "Bearer sk-enc-test", key, body);
        let r = support::expect_status(retry, 200).await;
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(
            ct.starts_with(if stream {
                "text/event-stream"
            } else {
                "application/json"
            }),
            "{ct}"
        );
        assert_eq!(
            r.text().await.unwrap(),
            "",
            "the retry learns it ran, not what"
        );
    }
    let found = holds(&sqlite_bytes(&db), &marker);
    stop(gw).await;
    assert!(
        !found && !holds(&sqlite_bytes(&db), &marker),
        "the body was stored"
    );
}

/// Replica A seals under key `a`; replica B holds only key `b` (a rotation
/// whose first step was skipped on it). A duplicate of A's stream sent to
/// B meets a live head it cannot open: a store error (503, counted) while
/// A's stream still runs — neither passed through, nor taken for "no
/// stream" (which would wait for A's DONE record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_entry_that_does_not_open_is_a_counted_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let sim = idemgate_llm_sim::spawn(idemgate_llm_sim::SimConfig::default())
        .await
        .unwrap();
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let a = start(config(
        &store,
        &sim.url(),
        Some(&key_file(dir.path(), &["a"], "a")),
    ))
    .await;
    let b = start(config(
        &store,
        &sim.url(),
        Some(&key_file(dir.path(), &["b"], "b")),
    ))
    .await;
    let client = reqwest::Client::new();
    let request = |gw: &TestGateway| {
        let url = format!("{}/v1/chat/completions", gw.base);
        let body = support::chat_body(true, "hello");
        support::keyed_post(&client, url, "Bearer sk-enc-test", "live-unopenable", body)
            // ~3 s of generation: 60 tokens, 50 ms apart.
            .header("x-sim-tokens", "60")
            .header("x-sim-token-interval-ms", "50")
    };
    let mut first = request(&a).send().await.unwrap();
    assert_eq!(first.status(), 200);
    // The first event is out: A's stream head is published.
    let chunk = first.chunk().await.unwrap();
    assert!(chunk.is_some_and(|c| !c.is_empty()));
    let a_ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let a_ended = std::sync::Arc::clone(&a_ended);
        tokio::spawn(async move {
            while first.chunk().await.unwrap().is_some() {}
            a_ended.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let dup = request(&b).send().await.unwrap();
    assert_eq!(dup.status(), 503);
    assert!(
        !a_ended.load(std::sync::atomic::Ordering::SeqCst),
        "B answered while A's stream ran, not after its DONE"
    );
    let body = dup.text().await.unwrap();
    assert!(body.contains("store-unavailable"), "{body}");
    assert_seal_failures(&b, "unknown_key_id").await;
    // A's own client is served to the end, once.
    reader.await.unwrap();
    assert_eq!(sim.executions_for("live-unopenable"), 1);
    stop(b).await;
    stop(a).await;
    drop_prefix(&prefix).await;
}
