//! The layer over real HTTP, one test per outcome a keyed request can
//! have: first run and replay, a mismatching body, a duplicate in flight
//! (rejected, waiting, attached to the live stream, on another replica), a
//! wait that runs out, and an operation to poll (`Prefer: respond-async`).
//! The app and its harness are in `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate_engine::{MemoryStore, Store};
use idemgate_layer::OnInflight;
use support::app::{Harness, config, event_ids, read_events, read_to_end, run_of, send};

#[tokio::test]
async fn first_request_runs_and_a_retry_replays_byte_for_byte() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = send(h.post("/json", Some("k-1"), r#"{"a":1}"#)).await;
    first.assert_replay(StatusCode::CREATED, Some("false"));
    assert_eq!(
        first.json()["key_seen"],
        "k-1",
        "the key reaches the inner service"
    );

    // Same key (quoted sf-string form), same JSON with other whitespace.
    let retry = send(h.post("/json", Some("\"k-1\""), r#"{ "a" : 1 }"#)).await;
    retry.assert_replay(StatusCode::CREATED, Some("true"));
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers["content-type"], "application/json");
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_replayed_202_keeps_where_the_job_is() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = send(h.post("/json", Some("job"), "{}").header("x-accepted", "1")).await;
    let replay = send(h.post("/json", Some("job"), "{}").header("x-accepted", "1")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(
        (first.replayed(), replay.replayed()),
        (Some("false"), Some("true"))
    );
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert_eq!(replay.headers["location"], "/jobs/1");
    assert_eq!(replay.headers["operation-location"], "/jobs/1/status");
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn same_key_with_another_body_is_refused_with_422() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    send(h.post("/json", Some("k"), r#"{"a":1}"#)).await;
    let other = send(h.post("/json", Some("k"), r#"{"a":2}"#)).await;
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "key-mismatch");
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_duplicate_in_flight_is_rejected_with_409_and_retry_headers() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until_runs(1).await;
    let dup = send(h.post("/json", Some("k"), "{}")).await;
    dup.assert_problem(StatusCode::CONFLICT, "in-flight");
    assert!(dup.headers.contains_key("retry-after"));
    assert_eq!(dup.headers["x-should-retry"], "true");
    // A mismatching duplicate in flight is a mismatch, not a conflict.
    let other = send(h.post("/json", Some("k"), r#"{"b":1}"#)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    h.open_gate();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn a_waiting_duplicate_gets_the_result() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_secs(20)))).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until_runs(1).await;
    let dup = tokio::spawn(send(h.post("/json", Some("k"), "{}")));
    h.open_gate();
    let (first, dup) = (first.await.unwrap(), dup.await.unwrap());
    assert_eq!(first.replayed(), Some("false"));
    dup.assert_replay(StatusCode::CREATED, Some("true"));
    assert_eq!(dup.body, first.body);
    assert_eq!(h.executions(), 1);
}

#[tokio::test]
async fn an_attached_duplicate_joins_the_live_stream() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(20)))).await;
    let mut owner = h.gated_stream("s", &[]).await;
    assert_eq!(owner.headers()["idempotent-replayed"], "false");
    let mut owner_bytes = read_events(&mut owner, 3).await;
    assert_eq!(h.layer.live_streams(), 1);

    // One attacher from the start, one resuming after event 2.
    let mut full = h.post("/sse", Some("s"), "{}").send().await.unwrap();
    let resumed = h
        .post("/sse", Some("s"), "{}")
        .header("last-event-id", format!("{}-2", run_of(&owner_bytes)))
        .send()
        .await
        .unwrap();
    assert!(
        resumed
            .headers()
            .get("idempotent-stream-restarted")
            .is_none()
    );
    assert_eq!(full.headers()["idempotent-replayed"], "true");
    assert_eq!(full.headers()["content-type"], "text/event-stream");
    let mut full_bytes = read_events(&mut full, 3).await;
    h.open_gate();
    read_to_end(&mut owner, &mut owner_bytes).await;
    read_to_end(&mut full, &mut full_bytes).await;
    let resumed_bytes = resumed.bytes().await.unwrap();
    assert_eq!(full_bytes, owner_bytes);
    assert_eq!(event_ids(&owner_bytes), (1..=8).collect::<Vec<_>>());
    assert_eq!(event_ids(&resumed_bytes), (3..=8).collect::<Vec<_>>());
    assert!(owner_bytes.ends_with(&resumed_bytes));
    assert!(!String::from_utf8_lossy(&owner_bytes).contains("up-"));
    assert_eq!(h.executions(), 1);

    // Once DONE, the same key replays the whole transcript.
    let replay = send(h.post("/sse", Some("s"), "{}")).await;
    assert_eq!(replay.body, owner_bytes);
    assert_eq!(h.layer.live_streams(), 0);

    // A follower gets the head a replay gets: the stored headers only.
    assert_eq!(owner.headers()["set-cookie"], "session=owner-only");
    let head = |h: &reqwest::header::HeaderMap| {
        let mut names: Vec<String> = h
            .keys()
            .map(|n| n.as_str().to_owned())
            .filter(|n| !matches!(n.as_str(), "date" | "transfer-encoding" | "content-length"))
            .collect();
        names.sort();
        names
    };
    assert!(full.headers().get("set-cookie").is_none());
    assert_eq!(head(full.headers()), head(&replay.headers));
}

#[tokio::test]
async fn attaching_on_another_replica_waits_for_done_and_replays() {
    // Two replicas (two layers, two servers) sharing one store: the second
    // has no live entry for the stream, so it waits for DONE.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mode = config(OnInflight::Attach(Duration::from_secs(20)));
    let a = Harness::start_with(Arc::clone(&store), mode.clone()).await;
    let b = Harness::start_with(store, mode).await;
    let mut owner = a.gated_stream("x", &[]).await;
    let mut owner_bytes = read_events(&mut owner, 3).await;
    let other = tokio::spawn(send(b.post("/sse", Some("x"), "{}")));
    a.open_gate();
    read_to_end(&mut owner, &mut owner_bytes).await;
    let other = other.await.unwrap();
    assert_eq!(other.replayed(), Some("true"));
    assert_eq!(other.body, owner_bytes);
    assert_eq!((a.executions(), b.executions()), (1, 0));
}

#[tokio::test]
async fn a_wait_that_runs_out_answers_409() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_millis(50)))).await;
    let first = tokio::spawn(send(h.post("/json", Some("k"), "{}").header("x-gate", "1")));
    h.until_runs(1).await;
    let dup = send(h.post("/json", Some("k"), "{}")).await;
    dup.assert_problem(StatusCode::CONFLICT, "in-flight");
    h.open_gate();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(h.executions(), 1);
}

// ---------------------------------------------------------------- respond-async

#[tokio::test]
async fn respond_async_returns_an_operation_to_poll() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    let accepted = send(
        h.post("/json", Some("op"), "{}")
            .header("prefer", "respond-async")
            .header("x-gate", "1"),
    )
    .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let location = accepted.headers["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/idemgate/operations/"));
    let url = format!("{}{location}", h.base);
    let auth = |b: reqwest::RequestBuilder| b.header("authorization", "Bearer tenant-a");
    let pending = send(auth(h.client.get(&url))).await;
    assert_eq!(pending.status, StatusCode::ACCEPTED);
    // A duplicate asking for async while it runs gets the same operation.
    let dup = send(
        h.post("/json", Some("op"), "{}")
            .header("prefer", "respond-async"),
    )
    .await;
    assert_eq!(dup.status, StatusCode::ACCEPTED);
    assert_eq!(dup.headers["location"], location.as_str());
    h.open_gate();
    h.until_settled().await;
    let done = send(auth(h.client.get(&url))).await;
    done.assert_replay(StatusCode::CREATED, Some("true"));
    assert_eq!(done.json()["execution"], 1);
    let stranger = send(
        h.client
            .get(&url)
            .header("authorization", "Bearer tenant-b"),
    )
    .await;
    stranger.assert_problem(StatusCode::NOT_FOUND, "operation-not-found");
    // An id naming the key but not the request that made it finds nothing:
    // reading needs what a replay needs.
    let id = location.trim_start_matches("/idemgate/operations/");
    let op = idemgate_layer::operations::parse_operation_id(id).unwrap();
    let forged = idemgate_layer::operations::operation_id(
        &op.namespace,
        &op.key,
        &idemgate_engine::Fingerprint::from_bytes([0; 32]),
    );
    let forged = send(auth(
        h.client
            .get(format!("{}/idemgate/operations/{forged}", h.base)),
    ))
    .await;
    assert_eq!(forged.status, StatusCode::NOT_FOUND);
    let garbage = send(auth(
        h.client.get(format!("{}/idemgate/operations/%%%", h.base)),
    ))
    .await;
    assert_eq!(garbage.status, StatusCode::NOT_FOUND);
    assert_eq!(h.executions(), 1);
}
