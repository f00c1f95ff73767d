//! Paths are routed as they read: a dot segment or an encoded separator
//! could pass one route's checks and then, resolved while building the
//! upstream URL, reach another route's path with the client's credential.
//! Sent over raw sockets (an HTTP client library would resolve the dots
//! itself) to a gateway in front of an upstream that records every path.

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawKeyMode, RawRoute};
use support::TestGateway;

/// An upstream that answers 200 to anything and records each path.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let app = Router::new().fallback(move |uri: http::Uri| {
        let record = Arc::clone(&record);
        async move {
            record
                .lock()
                .expect("the lock is never poisoned")
                .push(uri.path().to_owned());
            ([("content-type", "application/json")], "{\"ok\":true}")
        }
    });
    let url = support::serve(app).await;
    (url, seen)
}

/// A lenient route (`/v1`, no key needed) and a strict one (`/secret`,
/// key required) in front of the same upstream.
fn config(upstream: &str) -> GatewayConfig {
    let route = |prefix: &str, key: RawKeyMode| RawRoute {
        prefix: Some(prefix.into()),
        upstream: Some(upstream.into()),
        key: Some(key),
        ..RawRoute::default()
    };
    GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        shutdown_grace: Some("1s".into()),
        routes: vec![
            route("/v1", RawKeyMode::Optional),
            route("/secret", RawKeyMode::Require),
        ],
        ..RawConfig::default()
    })
    .unwrap_or_else(|e| panic!("config: {e}"))
}

/// Sends `POST target` as written and returns the status and body.
async fn raw_post(base: &str, target: &str) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let request = format!(
        "POST {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer k\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    support::raw_exchange(base, &request).await
}

#[tokio::test]
async fn dot_segments_and_encoded_separators_are_refused_before_routing() {
    let (upstream, seen) = recording_upstream().await;
    let gw = TestGateway::start(config(&upstream)).await;
    for target in [
        "/v1/../secret/admin",
        "/v1/../../secret/admin",
        "/v1/%2e%2e/secret/admin",
        "/v1/%2E%2E/secret/admin",
        "/v1/.%2e/secret/admin",
        "/v1/%2e./secret/admin",
        "/v1/./chat",
        "/v1/%2e/chat",
        "/v1/..%2fsecret/admin",
        "/v1/..%2Fsecret/admin",
        "/v1/..%5csecret/admin",
        "/v1/x/..",
    ] {
        let (status, text) = raw_post(&gw.base, target).await;
        assert_eq!(status, 400, "{target}: {text}");
        assert!(
            text.contains("https://idemgate.dev/problems/path-not-normalized"),
            "{target}: {text}"
        );
    }
    // A raw backslash is not a valid request target at all.
    let (status, _) = raw_post(&gw.base, "/v1/..\\secret/admin").await;
    assert_eq!(status, 400);
    assert!(
        seen.lock().expect("not poisoned").is_empty(),
        "nothing reached the upstream: {:?}",
        seen.lock().expect("not poisoned")
    );

    // Paths with dots inside a segment are ordinary.
    for target in ["/v1/chat", "/v1/file.v2..json", "/v1/.well-known"] {
        let (status, text) = raw_post(&gw.base, target).await;
        assert_eq!(status, 200, "{target}: {text}");
    }
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        vec!["/v1/chat", "/v1/file.v2..json", "/v1/.well-known"]
    );
    gw.stop().await.expect("a clean stop");
}
