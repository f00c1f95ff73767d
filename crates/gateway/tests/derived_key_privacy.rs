//! A derived key is built from user and session headers, and the key is
//! forwarded upstream: the provider must see a hash, never the user id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use axum::response::IntoResponse;
use support::TestGateway;

use std::sync::{Arc, Mutex};

use http::HeaderMap;
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawKeyMode, RawRoute};
use tokio::net::TcpListener;

const USER: &str = "alice.private@example.com";
const SESSION: &str = "session-4be2-private";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarded_key_header_holds_no_user_or_session_id() {
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let record = Arc::clone(&seen);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let record = Arc::clone(&record);
        async move {
            record.lock().unwrap().push(headers);
            ([("content-type", "application/json")], "{\"ok\":true}").into_response()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let config = GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        routes: vec![RawRoute {
            prefix: Some("/v1".into()),
            upstream: Some(upstream),
            key: Some(RawKeyMode::Derive),
            key_template: Some(vec![
                "tenant".into(),
                "header:x-user-id".into(),
                "header:x-session-id".into(),
                "body".into(),
            ]),
            key_window: Some("10m".into()),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })
    .unwrap();
    let gw = TestGateway::start(config).await;
    let client = reqwest::Client::new();
    let mut replays = Vec::new();
    for _ in 0..2 {
        let req = support::json_post(&client, format!("{}/v1/chat", gw.base), "{\"q\":1}")
            .header("x-user-id", USER)
            .header("x-session-id", SESSION);
        let r = support::expect_status(req, 200).await;
        replays.push(idemgate_testkit::http::replayed(&r));
    }
    assert_eq!(replays, [Some("false".into()), Some("true".into())]);

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one execution");
    let key = seen[0]
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .expect("the derived key is forwarded");
    assert!(key.starts_with("d:"), "{key}");
    assert!(
        !key.contains("alice") && !key.contains("example.com"),
        "{key}"
    );
    assert!(!key.contains("4be2"), "{key}");
    gw.stop().await.expect("stop cleanly");
}
