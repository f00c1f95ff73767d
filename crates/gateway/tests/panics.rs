//! A panic while handling one request costs that request only: it is
//! answered 500 `internal`, counted, and the connection, the listener and
//! every other request go on. Shown over a real socket with a handler
//! that panics on demand, behind the same guard both listeners of
//! `serve` use.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;

#[tokio::test]
async fn a_panicking_request_gets_500_and_the_listener_goes_on() {
    let telemetry = idemgate_telemetry::Telemetry::global();
    let handled = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&handled);
    let app = idemgate_gateway::guard_panics(Router::new().route(
        "/work",
        post(move |body: String| {
            let count = Arc::clone(&count);
            async move {
                assert!(body != "panic", "told to panic");
                count.fetch_add(1, Ordering::SeqCst);
                "done"
            }
        }),
    ));
    let url = format!("{}/work", support::serve(app).await);

    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let body = if i % 4 == 0 { "panic" } else { "work" };
            let resp = client.post(&url).body(body).send().await.expect("answered");
            let status = resp.status().as_u16();
            (body, status, resp.text().await.expect("a body"))
        }));
    }
    for t in tasks {
        let (body, status, text) = t.await.expect("the task ran");
        if body == "panic" {
            assert_eq!(status, 500, "{text}");
            assert!(
                text.contains("https://idemgate.dev/problems/internal"),
                "{text}"
            );
        } else {
            assert_eq!((status, text.as_str()), (200, "done"));
        }
    }
    assert_eq!(handled.load(Ordering::SeqCst), 30);
    let metrics = telemetry.render();
    assert!(
        metrics.contains("idemgate_panics_total{at=\"request\"} 10"),
        "{metrics}"
    );
}

/// An `abort` panic strategy would turn any panic into the end of the
/// process: no profile may set it.
#[test]
fn no_profile_aborts_on_panic() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
            .expect("read the workspace manifest");
    let squashed: String = manifest.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(
        !squashed.contains("panic=\"abort\"") && !squashed.contains("panic='abort'"),
        "a profile sets panic = \"abort\""
    );
}
