//! When the store or the process goes away: a store outage fails closed
//! by default and passes requests through when failing open; shutdown
//! waits for detached work, then cancels it and releases its key, and lets
//! work that finishes in time store its result. The app and its harness
//! are in `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate_layer::{LayerConfig, OnInflight, StoreErrorMode};
use support::DownStore;
use support::app::{Harness, config, send};

#[tokio::test]
async fn a_store_outage_fails_closed_by_default() {
    let h = Harness::start_with(Arc::new(DownStore), config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("k"), "{}")).await;
    a.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable");
    assert_eq!(h.executions(), 0);
}

#[tokio::test]
async fn a_store_outage_passes_through_when_failing_open() {
    let h = Harness::start_with(
        Arc::new(DownStore),
        LayerConfig {
            on_store_error: StoreErrorMode::FailOpen,
            ..config(OnInflight::Reject)
        },
    )
    .await;
    let a = send(h.post("/json", Some("k"), r#"{"a":1}"#)).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(
        a.json()["echo"],
        r#"{"a":1}"#,
        "the buffered body is forwarded"
    );
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- shutdown

#[tokio::test]
async fn shutdown_waits_then_cancels_and_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    h.abandoned("stuck", ("x-gate", "1"), Duration::from_millis(100))
        .await;
    h.until_runs(1).await;
    assert_eq!(h.layer.detached(), 1);
    let report = h.layer.shutdown(Duration::from_millis(50)).await;
    assert_eq!(report.cancelled, 1);
    assert_eq!(h.layer.detached(), 0);
    let record = h.record("stuck").await;
    assert!(record.is_none(), "no PENDING left behind: {record:?}");
}

#[tokio::test]
async fn shutdown_lets_finishing_work_store_its_result() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    h.abandoned(
        "finishing",
        ("x-sleep-ms", "200"),
        Duration::from_millis(20),
    )
    .await;
    h.until_runs(1).await;
    let report = h.layer.shutdown(Duration::from_secs(30)).await;
    assert_eq!(report.cancelled, 0);
    let record = h.record("finishing").await.unwrap();
    assert!(record.is_done());
}
