//! Unit tests of the parent module.

use super::*;

#[test]
fn paths_join_the_base() {
    assert_eq!(
        join("http://h:1", "/v1/chat/completions"),
        "http://h:1/v1/chat/completions"
    );
    assert_eq!(join("http://h:1/api", "v1/x"), "http://h:1/api/v1/x");
    assert_eq!(join("http://h:1", "https://other/x"), "https://other/x");
}

#[test]
fn debug_never_shows_credentials() {
    let client = Client::builder("http://127.0.0.1:1/")
        .bearer_auth("sk-very-secret")
        .header("x-api-key", "also-secret")
        .build()
        .unwrap();
    let shown = format!("{client:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(shown.contains("authorization"), "{shown}");
    let req = client.post("/v1/x").header("api-key", "more-secret");
    let shown = format!("{req:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(shown.contains(req.key().as_str()), "{shown}");
}

#[test]
fn the_key_is_fixed_when_the_request_is_built() {
    let client = Client::new("http://127.0.0.1:1").unwrap();
    let a = client.post("/x");
    let b = client.post("/x");
    assert_ne!(a.key(), b.key(), "one key per operation");
    let natural = IdempotencyKey::new("order-81").unwrap();
    let a = a.idempotency_key(natural.clone());
    assert_eq!(a.key(), &natural);
    let c = client.post("/x").header("Idempotency-Key", "order-82");
    assert_eq!(c.key().as_str(), "order-82");
}

#[test]
fn bad_input_surfaces_at_send_time_without_values() {
    let err = Client::builder("not a url").build().unwrap_err();
    assert!(matches!(err, Error::Url { .. }), "{err}");
    let err = Client::builder("http://h")
        .header("authorization", "Bearer sec\nret")
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Header { .. }));
    assert!(!err.to_string().contains("sec"), "{err}");
    let err = Client::builder("http://h")
        .header("Idempotency-Key", "one-for-all")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("per request"), "{err}");
}
