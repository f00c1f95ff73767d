//! The client goes away: a client that times out, a request future that
//! is dropped, a stream client that disconnects. The work goes on
//! detached, is stored, and the retry replays it (or waits for it, or
//! resumes the stream after its last event). The app and its harness are
//! in `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate_engine::MemoryStore;
use idemgate_layer::OnInflight;
use support::app::{App, Harness, config, event_ids, gated_request, last_id, read_events, send};

#[tokio::test]
async fn a_client_that_times_out_does_not_cancel_the_work() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let gone = h
        .abandoned("slow", ("x-gate", "1"), Duration::from_millis(100))
        .await;
    assert!(gone, "the client gave up");
    h.until_runs(1).await;
    h.open_gate();
    h.until_settled().await;
    let retry = send(h.post("/json", Some("slow"), "{}")).await;
    retry.assert_replay(StatusCode::CREATED, Some("true"));
    assert_eq!(retry.json()["execution"], 1);
    let again = send(h.post("/json", Some("slow"), "{}")).await;
    assert_eq!(again.body, retry.body);
    assert_eq!(h.executions(), 1);
}

/// The request's future is dropped while its work runs (a server that
/// cuts the connection, a timeout in front of the layer): the work moves
/// to a task of its own, finishes and is stored, and the retry replays.
#[tokio::test]
async fn a_dropped_request_does_not_cancel_the_work() {
    let app = App::new(Arc::new(MemoryStore::new()), config(OnInflight::Reject));
    let dropped =
        tokio::time::timeout(Duration::from_millis(100), app.call(gated_request(true))).await;
    assert!(dropped.is_err(), "the request was still running");
    assert_eq!(app.executions(), 1);
    assert_eq!(app.layer.detached(), 1, "the work went on as a task");
    app.gate.send_replace(true);
    let mut replayed = None;
    for _ in 0..2000 {
        let retry = app.call(gated_request(false)).await;
        // 409 while the work still runs.
        if retry.status() == StatusCode::CREATED {
            replayed = Some(retry);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retry = replayed.expect("the dropped request's work never finished");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions(), 1);
}

#[tokio::test]
async fn a_retry_while_the_abandoned_work_runs_waits_for_it() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let gone = h
        .abandoned("slow", ("x-gate", "1"), Duration::from_millis(100))
        .await;
    assert!(gone);
    let retry = tokio::spawn(send(h.post("/json", Some("slow"), "{}")));
    h.until_runs(1).await;
    h.open_gate();
    let retry = retry.await.unwrap();
    retry.assert_replay(StatusCode::CREATED, Some("true"));
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_stream_client_that_drops_resumes_with_last_event_id() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let mut owner = h.post("/sse", Some("resume"), "{}").send().await.unwrap();
    let first_part = read_events(&mut owner, 3).await;
    drop(owner);
    h.until_settled().await;
    let ids = event_ids(&first_part);
    let k = *ids.last().unwrap();
    let rest = send(
        h.post("/sse", Some("resume"), "{}")
            .header("last-event-id", last_id(&first_part)),
    )
    .await;
    assert!(!rest.headers.contains_key("idempotent-stream-restarted"));
    assert_eq!(rest.replayed(), Some("true"));
    assert_eq!(
        event_ids(&rest.body),
        ((k + 1)..=8).collect::<Vec<_>>(),
        "only the events after {k}"
    );
    let full = send(h.post("/sse", Some("resume"), "{}")).await;
    let mut stitched = first_part.clone();
    stitched.extend_from_slice(&rest.body);
    assert_eq!(full.body, stitched, "the replay is the original transcript");
    assert_eq!(h.executions(), 1);
}
