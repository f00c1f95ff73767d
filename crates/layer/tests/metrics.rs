//! The metrics the layer records (docs/design.md, "Metrics"), read back through a recorder
//! installed for this test binary, over real HTTP.
#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idemgate_engine::{Engine, MemoryStore};
use idemgate_layer::{IdempotencyLayer, KeyMode, LayerConfig, OnInflight, StoreErrorMode};

mod support;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use support::DownStore;
use support::app::serve;

/// Counters by `name{label=value,…}` (labels sorted).
#[derive(Debug, Default)]
struct Counters(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Recorder for &'static Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let id = format!("{}{{{}}}", key.name(), labels.join(","));
        let c = Arc::clone(self.0.lock().unwrap().entry(id).or_default());
        Counter::from_arc(c)
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn counters() -> &'static Counters {
    static C: OnceLock<&'static Counters> = OnceLock::new();
    C.get_or_init(|| {
        let c: &'static Counters = Box::leak(Box::default());
        metrics::set_global_recorder(c).unwrap();
        c
    })
}

fn value(id: &str) -> u64 {
    counters()
        .0
        .lock()
        .unwrap()
        .get(id)
        .map_or(0, |c| c.load(Ordering::SeqCst))
}

#[tokio::test]
async fn replays_count_hits_and_saved_tokens_conflicts_and_outcomes() {
    counters();
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let layer = IdempotencyLayer::new(
        engine,
        LayerConfig {
            on_inflight: OnInflight::Reject,
            ..LayerConfig::new("metrics")
        },
    );
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route(
            "/v1/chat",
            post(|body: String| async move {
                if body.contains("slow") {
                    let mut open = gate_rx.clone();
                    let _ = open.wait_for(|o| *o).await;
                }
                (
                    [("content-type", "application/json")],
                    r#"{"usage":{"prompt_tokens":11,"completion_tokens":22}}"#,
                )
            }),
        )
        .layer(layer.clone());
    let url = format!("{}/v1/chat", serve(app).await);
    let client = reqwest::Client::new();
    let post = |key: &str, body: &'static str| {
        client
            .post(&url)
            .header("idempotency-key", key)
            .body(body)
            .send()
    };

    post("a", "{}").await.unwrap();
    post("a", "{}").await.unwrap();
    post("a", "{}").await.unwrap();
    assert_eq!(value("idempotency_hit_total{route=metrics}"), 2);
    assert_eq!(value("idempotency_tokens_saved_total{route=metrics}"), 66);
    assert_eq!(
        value("idempotency_requests_total{outcome=executed,route=metrics}"),
        1
    );
    assert_eq!(
        value("idempotency_requests_total{outcome=replayed,route=metrics}"),
        2
    );

    post("a", r#"{"other":1}"#).await.unwrap();
    assert_eq!(
        value("idempotency_requests_total{outcome=mismatch,route=metrics}"),
        1
    );

    let slow = tokio::spawn(post("b", r#"{"slow":1}"#));
    while layer.detached() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dup = post("b", r#"{"slow":1}"#).await.unwrap();
    assert_eq!(dup.status(), 409);
    gate.send_replace(true);
    slow.await.unwrap().unwrap();
    assert_eq!(
        value("idempotency_inflight_conflict_total{route=metrics}"),
        1
    );
    let keyed: Vec<String> = counters()
        .0
        .lock()
        .unwrap()
        .keys()
        .filter(|k| k.contains("=a") || k.contains("=b"))
        .cloned()
        .collect();
    assert!(keyed.is_empty(), "no key in any label: {keyed:?}");
}

/// A layer with `config` on a fresh memory store.
fn memory_layer(config: LayerConfig) -> IdempotencyLayer {
    IdempotencyLayer::new(Engine::new(Arc::new(MemoryStore::new())), config)
}

/// Collecting a `Prefer: respond-async` result is the asker's own read:
/// counted as `operation_read`, never as a hit or as tokens saved.
#[tokio::test]
async fn reading_an_operation_is_not_a_replay() {
    counters();
    let layer = memory_layer(LayerConfig::new("ops"));
    let app = Router::new()
        .route(
            "/v1/chat",
            post(|| async {
                (
                    [("content-type", "application/json")],
                    r#"{"usage":{"prompt_tokens":11,"completion_tokens":22}}"#,
                )
            }),
        )
        .layer(layer.clone());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let accepted = client
        .post(format!("{base}/v1/chat"))
        .header("idempotency-key", "op")
        .header("prefer", "respond-async")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let location = accepted.headers()["location"].to_str().unwrap().to_owned();
    let mut done = None;
    for _ in 0..200 {
        let r = client
            .get(format!("{base}{location}"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            done = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = done.expect("the operation finished");
    assert_eq!(done.headers()["idempotent-replayed"], "true");
    assert_eq!(
        value("idempotency_requests_total{outcome=operation_read,route=ops}"),
        1
    );
    assert_eq!(value("idempotency_hit_total{route=ops}"), 0);
    assert_eq!(value("idempotency_tokens_saved_total{route=ops}"), 0);
}

/// Sends `req` and asserts that the handler ran and answered `ran`.
async fn assert_ran(req: reqwest::RequestBuilder) {
    assert_eq!(req.send().await.unwrap().text().await.unwrap(), "ran");
}

/// The two causes of an unprotected request are counted apart: a request
/// without a key on an optional route, and a request forwarded because the
/// store is down under `fail_open`.
#[tokio::test]
async fn unprotected_requests_are_counted_by_cause() {
    counters();
    let optional = memory_layer(LayerConfig {
        key_mode: KeyMode::Optional,
        ..LayerConfig::new("no-key")
    });
    let failing_open = IdempotencyLayer::new(
        Engine::new(Arc::new(DownStore)),
        LayerConfig {
            on_store_error: StoreErrorMode::FailOpen,
            ..LayerConfig::new("store-down")
        },
    );
    let handler = || post(|| async { "ran" });
    let app = Router::new()
        .route("/optional", handler().layer(optional))
        .route("/open", handler().layer(failing_open));
    let base = serve(app).await;
    let client = reqwest::Client::new();
    for _ in 0..3 {
        assert_ran(client.post(format!("{base}/optional"))).await;
    }
    for k in 0..2 {
        let keyed = client.post(format!("{base}/open"));
        assert_ran(keyed.header("idempotency-key", format!("k{k}"))).await;
    }
    assert_eq!(
        value("idempotency_requests_total{outcome=unprotected_no_key,route=no-key}"),
        3
    );
    assert_eq!(
        value("idempotency_requests_total{outcome=unprotected_store_error,route=store-down}"),
        2
    );
    assert_eq!(
        value("idempotency_requests_total{outcome=unprotected_store_error,route=no-key}")
            + value("idempotency_requests_total{outcome=unprotected_no_key,route=store-down}"),
        0
    );
}

/// A panic in the owner's work is answered 500, releases the key (the retry
/// runs), and is counted where it was caught.
#[tokio::test]
async fn a_panicking_execution_is_counted() {
    counters();
    let runs = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&runs);
    let layer = memory_layer(LayerConfig::new("panics"));
    let app = Router::new()
        .route(
            "/work",
            post(move || {
                let seen = Arc::clone(&seen);
                async move {
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    assert!(n > 0, "the first run panics");
                    "ran"
                }
            }),
        )
        .layer(layer);
    let url = format!("{}/work", serve(app).await);
    let client = reqwest::Client::new();
    let send = || client.post(&url).header("idempotency-key", "p").send();
    assert_eq!(send().await.unwrap().status(), 500);
    let again = send().await.unwrap();
    assert_eq!(again.status(), 200, "the key was released");
    assert_eq!(again.text().await.unwrap(), "ran");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(value("idemgate_panics_total{at=execution}"), 1);
}
