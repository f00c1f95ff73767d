//! The gateway on stores reached over TLS, with the store URL an operator
//! writes: `rediss://…/?tls_ca=…&prefix=…` (records and live streams) and
//! `postgres://…?sslmode=verify-full&sslrootcert=…&schema=…`. The servers
//! are private, speak TLS only, and hold certificates signed by a CA this
//! test process makes; a JSON and a streamed answer are each executed once
//! and replayed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[path = "../../redis/tests/support/mod.rs"]
mod redis_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use idemgate_gateway::config::RawInflightMode;
use idemgate_testkit::http::replayed;
use support::TestGateway;
use tokio::net::TcpListener;

/// An upstream that counts its calls and answers JSON, or an event stream
/// when the request asks for one.
async fn upstream(calls: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(move |body: Bytes| {
        let calls = Arc::clone(&calls);
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let stream = serde_json::from_slice::<serde_json::Value>(&body)
                .is_ok_and(|v| v["stream"].as_bool() == Some(true));
            let answer: Response = if stream {
                (
                    [("content-type", "text/event-stream")],
                    format!("data: {{\"call\":{n}}}\n\ndata: [DONE]\n\n"),
                )
                    .into_response()
            } else {
                (
                    [("content-type", "application/json")],
                    format!("{{\"call\":{n}}}"),
                )
                    .into_response()
            };
            answer
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A JSON and a streamed request through a gateway on `store`: each runs
/// once upstream and is replayed the second time.
async fn executes_once_and_replays(store: String) {
    let calls = Arc::new(AtomicUsize::new(0));
    let gw = TestGateway::builder(&upstream(Arc::clone(&calls)).await)
        .store(store)
        .route(|r| r.on_inflight = Some(RawInflightMode::Attach))
        .start()
        .await;
    let client = reqwest::Client::new();
    for (key, stream) in [("tls-json", false), ("tls-sse", true)] {
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let body = serde_json::json!({ "stream": stream }).to_string();
            let req = support::json_post(&client, format!("{}/v1/chat", gw.base), body);
            // The gateway answers: its store opened over TLS.
            let r = support::expect_status(req.header("idempotency-key", key), 200).await;
            let again = replayed(&r);
            bodies.push((again, r.text().await.unwrap()));
        }
        assert_eq!(bodies[0].0.as_deref(), Some("false"), "{bodies:?}");
        assert_eq!(bodies[1].0.as_deref(), Some("true"), "{bodies:?}");
        assert_eq!(bodies[0].1, bodies[1].1, "the replay is the stored answer");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "each key ran once upstream"
    );
    gw.stop().await.expect("stop cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_store_with_a_private_ca_keeps_records_and_live_streams() {
    let url = tokio::task::spawn_blocking(redis_support::tls_url)
        .await
        .expect("start the TLS Redis");
    let prefix = format!("igtls{:08x}", rand::random::<u32>());
    executes_once_and_replays(format!("{url}&prefix={prefix}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_with_verify_full_keeps_records() {
    static SERVER: OnceLock<idemgate_testkit::postgres_server::Server> = OnceLock::new();
    let server = tokio::task::spawn_blocking(|| {
        SERVER.get_or_init(|| {
            idemgate_testkit::postgres_server::Server::start_tls(
                &idemgate_testkit::tls::TestCerts::generate(),
            )
        })
    })
    .await
    .expect("start the TLS PostgreSQL");
    executes_once_and_replays(format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&schema=igtls&pool=2",
        server.port,
        server.ca().display()
    ))
    .await;
}
