//! Keys and tenants: tenants never share records; malformed, doubled and
//! missing keys are refused; optional routes pass unkeyed requests
//! through; derived keys need their dimensions; a body over the limit is
//! refused before the key is claimed. The app and its harness are in
//! `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use axum::http::StatusCode;
use idemgate_layer::{DeriveTemplate, KeyMode, LayerConfig, OnInflight};
use reqwest::header::HeaderValue;
use support::app::{Harness, config, problem, send};

#[tokio::test]
async fn tenants_never_share_records() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("same"), "{}")).await;
    let b = send(h.post_as("Bearer tenant-b", "/json", Some("same"), "{}")).await;
    assert_eq!(a.replayed(), Some("false"));
    assert_eq!(b.replayed(), Some("false"));
    assert_ne!(a.body, b.body);
    assert_eq!(h.executions(), 2);
    let a2 = send(h.post("/json", Some("same"), "{}")).await;
    assert_eq!(a2.body, a.body);
    assert!(h.record("same").await.is_some());
}

#[tokio::test]
async fn malformed_and_missing_keys_are_refused() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let long = "k".repeat(256);
    let bad: Vec<HeaderValue> = vec![
        HeaderValue::from_static(""),
        HeaderValue::from_static("\"\""),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static("a\tb"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        HeaderValue::from_static("\"open"),
        HeaderValue::from_static("\"a\"b"),
        HeaderValue::from_static("\"a\\nb\""),
    ];
    for v in bad {
        let a = send(
            h.post("/json", None, "{}")
                .header("idempotency-key", v.clone()),
        )
        .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{v:?}");
        assert_eq!(a.problem_type(), problem("malformed-key"), "{v:?}");
    }
    let twice = send(
        h.post("/json", Some("a"), "{}")
            .header("idempotency-key", "b"),
    )
    .await;
    assert_eq!(twice.problem_type(), problem("malformed-key"));
    let missing = send(h.post("/json", None, "{}")).await;
    missing.assert_problem(StatusCode::BAD_REQUEST, "missing-key");
    assert_eq!(h.executions(), 0);
    // Other methods pass through.
    let plain = send(h.client.get(format!("{}/plain", h.base))).await;
    assert_eq!(plain.body, "plain");
    assert_eq!(plain.replayed(), None);
}

#[tokio::test]
async fn optional_routes_pass_unkeyed_requests_through_unmerged() {
    let h = Harness::rejecting_with(|c| c.key_mode = KeyMode::Optional).await;
    let a = send(h.post("/json", None, "{}")).await;
    let b = send(h.post("/json", None, "{}")).await;
    a.assert_replay(StatusCode::CREATED, None);
    assert_ne!(a.body, b.body);
    assert_eq!(h.executions(), 2);
    let big = format!(
        "{{\"x\":\"{}\"}}",
        "y".repeat(LayerConfig::default().body_limit)
    );
    let too_big = send(h.post("/json", None, &big)).await;
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.executions(), 2);
    // A key still protects.
    send(h.post("/json", Some("k"), "{}")).await;
    let r = send(h.post("/json", Some("k"), "{}")).await;
    assert_eq!(r.replayed(), Some("true"));
    assert_eq!(h.executions(), 3);
}

#[tokio::test]
async fn derived_keys_need_their_dimensions() {
    let h =
        Harness::rejecting_with(|c| c.key_mode = KeyMode::Derive(DeriveTemplate::default())).await;
    let missing = send(h.post("/json", None, "{}").header("x-user-id", "u1")).await;
    missing.assert_problem(StatusCode::BAD_REQUEST, "missing-key");
    let req = |session: &str| {
        h.post("/json", None, r#"{"q":"same question"}"#)
            .header("x-user-id", "u1")
            .header("x-session-id", session)
    };
    let first = send(req("s1")).await;
    let second = send(req("s1")).await;
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(second.replayed(), Some("true"));
    let other_session = send(req("s2")).await;
    assert_eq!(other_session.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_before_the_handler() {
    let h = Harness::rejecting_with(|c| c.body_limit = 64).await;
    let big = format!("{{\"x\":\"{}\"}}", "y".repeat(100));
    let a = send(h.post("/json", Some("big"), &big)).await;
    a.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, "body-too-large");
    assert_eq!(h.executions(), 0);
    let ok = send(h.post("/json", Some("big"), "{}")).await;
    assert_eq!(ok.status, StatusCode::CREATED, "the key was not claimed");
}
