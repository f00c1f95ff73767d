//! The gateway's own work for one keyed request, in process: the route's
//! idempotency layer over the store wrappers `idemgate serve` uses, on the
//! in-memory store, with an inner service that answers a chat completion at
//! once instead of an upstream over HTTP.
//!
//! Over real sockets most of a request's CPU is the kernel's loopback TCP,
//! hyper and the store's client, shared with the process at the other end,
//! and two runs on a shared machine differ by more than one feature costs.
//! This bench leaves those out, so what idemgate adds to every request
//! (key and fingerprint, claim and completion, the stored copy, telemetry,
//! the log line) is measured alone, to a few percent.
//!
//! Run with: `cargo bench -p idemgate-gateway --bench request -- --warm-up-time 3 --measurement-time 8`
//! (`cargo test -p idemgate-gateway --bench request` runs each case once).
//!
//! `fresh key` sends a key whose answer has expired, a first execution
//! each time; `replay` sends one of 100 keys already answered. Both log at
//! the gateway's default level into a sink, with the gateway's JSON line
//! format, as `idemgate serve` does (to stderr). At the end the bench
//! checks that every fresh request ran the work and no replay did.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response, header};
use http_body_util::BodyExt;
use idemgate_engine::MemoryStore;
use idemgate_gateway::{GatewayConfig, serve};
use idemgate_layer::{Idempotency, IdempotencyLayer};
use tower::{Layer, ServiceExt};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The allocator `idemgate serve` runs with: a request allocates and frees
/// many small objects, and the system allocator would be most of this bench.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
const PROMPT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
/// Distinct fresh keys, each sent again once its answer has expired.
const FRESH_KEYS: u64 = 1_000;

type Upstream = tower::util::BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

/// Answers every request with [`ANSWER`], after reading its body, and
/// counts them in `executed`.
fn upstream(executed: Arc<AtomicU64>) -> Upstream {
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |req: Request<Body>| {
        let executed = Arc::clone(&executed);
        async move {
            executed.fetch_add(1, Ordering::Relaxed);
            let _ = req.into_body().collect().await;
            Ok::<_, Infallible>(
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(ANSWER))
                    .expect("a valid response"),
            )
        }
    }))
}

/// The route of `idemgate serve --upstream …`, its store wrapped by
/// [`serve::wrap_store`], keeping answers for `done_ttl`, with or without the
/// replay cache.
fn gateway(
    done_ttl: Duration,
    replay_cache: bool,
    executed: Arc<AtomicU64>,
) -> Idempotency<Upstream> {
    let config = GatewayConfig::for_upstream("http://127.0.0.1:9").expect("a valid upstream");
    let mut route = config.routes[0].clone();
    route.done_ttl = done_ttl;
    let route = &route;
    let cache_bytes = if replay_cache { config.replay_cache } else { 0 };
    let (store, _gathered) = serve::wrap_store(Arc::new(MemoryStore::new()), cache_bytes);
    let engine = serve::engine(store, route);
    IdempotencyLayer::new(engine, route.layer_config()).layer(upstream(executed))
}

fn request(key: &str) -> Request<Body> {
    Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, "Bearer bench-tenant")
        .header("idempotency-key", key)
        .body(Body::from(PROMPT))
        .expect("a valid request")
}

async fn send(svc: &Idempotency<Upstream>, key: &str) {
    let res = svc.clone().oneshot(request(key)).await.expect("infallible");
    assert!(res.status().is_success(), "status {}", res.status());
    let _ = res.into_body().collect().await.expect("a body");
    // A server's connection task waits for the socket between requests,
    // and the tasks a request spawned (if any) run then. Nothing here
    // waits, so give them their turn, or they pile up until the whole
    // batch ends.
    tokio::task::yield_now().await;
}

fn logs() {
    tracing_subscriber::registry()
        .with(Targets::new().with_default(LevelFilter::INFO))
        .with(idemgate_telemetry::logging::json_layer(std::io::sink))
        .init();
}

fn bench(c: &mut Criterion) {
    logs();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Fresh keys come back after FRESH_KEYS requests, their answers
    // expired (and no replay cache to answer them from memory): the store
    // stays the same size, each key's timeline at its bound, so the bench
    // measures requests, not the page faults of a store that grows.
    let fresh_runs = Arc::new(AtomicU64::new(0));
    let replay_runs = Arc::new(AtomicU64::new(0));
    let fresh =
        rt.block_on(async { gateway(Duration::from_millis(1), false, Arc::clone(&fresh_runs)) });
    let replays =
        rt.block_on(async { gateway(Duration::from_secs(3600), true, Arc::clone(&replay_runs)) });
    rt.block_on(async {
        for i in 0..100 {
            send(&replays, &format!("replay-{i}")).await;
        }
    });
    let mut g = c.benchmark_group("gateway request, in process");
    g.throughput(Throughput::Elements(1));
    let next_fresh = AtomicU64::new(0);
    g.bench_function("fresh key", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!(
                "fresh-{}",
                next_fresh.fetch_add(1, Ordering::Relaxed) % FRESH_KEYS
            );
            let svc = &fresh;
            async move { send(svc, &key).await }
        });
    });
    let next_replay = AtomicU64::new(0);
    g.bench_function("replay", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!(
                "replay-{}",
                next_replay.fetch_add(1, Ordering::Relaxed) % 100
            );
            let svc = &replays;
            async move { send(svc, &key).await }
        });
    });
    g.finish();
    // Every fresh request ran the work once, and no replay ran it again.
    assert_eq!(
        fresh_runs.load(Ordering::Relaxed),
        next_fresh.load(Ordering::Relaxed)
    );
    assert_eq!(replay_runs.load(Ordering::Relaxed), 100);
}

criterion_group!(benches, bench);
criterion_main!(benches);
