//! Failures release the key, so the retry runs again: a retryable status,
//! a stream broken midway (for its owner and an attached client), a
//! stream that ends in an error event or in an event that never ends, a
//! panicking handler, work past the completion timeout (on tokio's paused
//! clock); and what is kept instead: a final 4xx, an outcome-unknown
//! answer, a response too large to store delivered but not stored. The app
//! and its harness are in `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate_engine::MemoryStore;
use idemgate_layer::{LayerConfig, OnInflight, OutcomeUnknownMode};
use support::app::{
    App, Harness, config, event_ids, gated_request, last_id, problem, problem_of, read_events,
    read_until_broken, run_of, send,
};

#[tokio::test]
async fn a_retryable_status_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let failed = send(h.post("/json", Some("f"), "{}").header("x-fail", "500")).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.body, "failure 1");
    let retry = send(h.post("/json", Some("f"), "{}")).await;
    retry.assert_replay(StatusCode::CREATED, Some("false"));
    assert_eq!(h.executions(), 2);
    // A 4xx that is not retryable is final: stored and replayed.
    send(h.post("/json", Some("g"), "{}").header("x-fail", "404")).await;
    let replay = send(h.post("/json", Some("g"), "{}")).await;
    replay.assert_replay(StatusCode::NOT_FOUND, Some("true"));
    assert_eq!(h.executions(), 3);
}

#[tokio::test]
async fn a_stream_broken_midway_is_not_stored() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let mut res = h.stream("b", ("x-break-after", "2")).await;
    let (got, broke) = read_until_broken(&mut res).await;
    assert!(broke, "a broken stream must not end cleanly");
    assert_eq!(event_ids(&got), vec![1, 2]);
    h.until_settled().await;
    // Sends key `b` again, resuming after event `last`.
    let resume = |last: String| {
        send(
            h.post("/sse", Some("b"), "{}")
                .header("last-event-id", last),
        )
    };
    // The client resumes after event 2 of the run that broke: a new run
    // starts, and it gets that run whole, told it restarted, never the
    // new run's events 3… after the old run's 1 and 2.
    let retry = resume(last_id(&got)).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(retry.headers["idempotent-stream-restarted"], "true");
    assert_eq!(event_ids(&retry.body), (1..=8).collect::<Vec<_>>());
    assert_ne!(
        run_of(&retry.body),
        run_of(&got),
        "event ids name their run"
    );
    assert_eq!(h.executions(), 2);
    // The same resumption once the new run is stored: whole, restarted.
    let late = resume(last_id(&got)).await;
    assert_eq!(late.replayed(), Some("true"));
    assert_eq!(late.headers["idempotent-stream-restarted"], "true");
    assert_eq!(late.body, retry.body);
    // Resuming the stored run itself gives its events after that one.
    let within = resume(format!("{}-3", run_of(&retry.body))).await;
    assert!(!within.headers.contains_key("idempotent-stream-restarted"));
    assert_eq!(event_ids(&within.body), (4..=8).collect::<Vec<_>>());
    assert_eq!(h.executions(), 2);
}

#[tokio::test]
async fn an_attached_client_sees_the_owner_stream_break() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let mut owner = h.gated_stream("b", &[("x-break-after", "4")]).await;
    read_events(&mut owner, 3).await;
    let mut attached = h.post("/sse", Some("b"), "{}").send().await.unwrap();
    read_events(&mut attached, 3).await;
    h.open_gate();
    let (_, broke) = read_until_broken(&mut attached).await;
    assert!(broke, "the attached stream ends with an error");
    h.retry_runs_again("/sse", "b", 2).await;
}

/// A 200 stream that ends in an error event is relayed whole to the owner
/// and to an attached duplicate, then released: the retry runs again and
/// its good stream is the one stored.
#[tokio::test]
async fn an_error_event_reaches_owner_and_attached_then_the_key_is_released() {
    let h = Harness::start(LayerConfig {
        stream_dialect: Some(idemgate_layer::StreamDialect::Openai),
        ..config(OnInflight::Attach(Duration::from_secs(20)))
    })
    .await;
    let mut owner = h.gated_stream("e", &[("x-error-event", "1")]).await;
    read_events(&mut owner, 3).await;
    let mut attached = h.post("/sse", Some("e"), "{}").send().await.unwrap();
    read_events(&mut attached, 3).await;
    h.open_gate();
    for (who, res) in [("owner", &mut owner), ("attached", &mut attached)] {
        let (rest, broke) = read_until_broken(res).await;
        assert!(broke, "{who}: the stream ends with an error");
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            rest.contains("\"error\""),
            "{who}: the error event was relayed: {rest}"
        );
    }
    let retry = h.retry_runs_again("/sse", "e", 2).await;
    let replay = send(h.post("/sse", Some("e"), "{}")).await;
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(h.executions(), 2);
}

/// An event that never ends is not buffered past the stored-body limit:
/// the events before it are relayed, the stream breaks, the key is
/// released.
#[tokio::test]
async fn an_event_that_never_ends_breaks_the_stream_at_the_limit() {
    let h = Harness::rejecting_with(|c| c.max_stored_body = 16 * 1024).await;
    let mut res = h.stream("x", ("x-endless-event", "1")).await;
    let (got, broke) = read_until_broken(&mut res).await;
    assert!(broke, "the stream ends with an error");
    assert_eq!(event_ids(&got), (1..=6).collect::<Vec<_>>());
    h.retry_runs_again("/sse", "x", 2).await;
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_releases_the_key() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let a = send(h.post("/json", Some("p"), "{}").header("x-panic", "1")).await;
    a.assert_problem(StatusCode::INTERNAL_SERVER_ERROR, "internal");
    h.until_settled().await;
    for _ in 0..2000 {
        if h.record("p").await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retry = send(h.post("/json", Some("p"), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(h.executions(), 2);
}

/// The app of a paused-clock test whose completion timeout is 30 s,
/// keeping outcome-unknown answers when `charging`: its first request,
/// held at the gate, has timed out with problem `slug`, and the gate is
/// open.
async fn timed_out(charging: bool, slug: &str) -> App {
    let mut config = LayerConfig {
        completion_timeout: Duration::from_secs(30),
        ..config(OnInflight::Reject)
    };
    if charging {
        config.on_outcome_unknown = OutcomeUnknownMode::Store;
    }
    let app = App::new(Arc::new(MemoryStore::new()), config);
    let a = app.call(gated_request(true)).await;
    assert_eq!(a.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(problem_of(a).await, problem(slug));
    app.gate.send_replace(true);
    app
}

/// The retry of a [`timed_out`] app's request: not held at the gate.
/// Asserts its status and `Idempotent-Replayed` header.
async fn retried(app: &App, status: StatusCode, replayed: &str) -> axum::response::Response {
    let retry = app.call(gated_request(false)).await;
    assert_eq!(retry.status(), status);
    assert_eq!(retry.headers()["idempotent-replayed"], replayed);
    retry
}

/// On tokio's paused clock: the 30 s completion timeout elapses at once,
/// exactly, while the handler still waits on its gate.
#[tokio::test(start_paused = true)]
async fn work_past_the_completion_timeout_is_abandoned_and_released() {
    let app = timed_out(false, "upstream-timeout").await;
    // The abandoned attempt released the key: the retry runs again.
    retried(&app, StatusCode::CREATED, "false").await;
    assert_eq!(app.executions(), 2);
}

/// The same timeout on a charging configuration: the handler was called,
/// so the work may have run. The key keeps an outcome-unknown answer and
/// the retry gets it; nothing runs twice.
#[tokio::test(start_paused = true)]
async fn a_charging_completion_timeout_keeps_outcome_unknown() {
    let app = timed_out(true, "outcome-unknown").await;
    let retry = retried(&app, StatusCode::GATEWAY_TIMEOUT, "true").await;
    assert_eq!(problem_of(retry).await, problem("outcome-unknown"));
    assert_eq!(app.executions(), 1);
}

#[tokio::test]
async fn a_response_too_large_to_store_is_delivered_but_not_stored() {
    let h = Harness::rejecting_with(|c| c.max_stored_body = 1024).await;
    let a = send(h.post("/json", Some("big"), "{}").header("x-pad", "1")).await;
    a.assert_replay(StatusCode::CREATED, Some("false"));
    assert_eq!(a.json()["padding"].as_str().unwrap().len(), 4096);
    let retry = send(h.post("/json", Some("big"), "{}").header("x-pad", "1")).await;
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(h.executions(), 2);
}
