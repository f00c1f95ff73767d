//! Event streams through a real gateway: a stream interrupted on the way
//! to the client is resumed with `Last-Event-ID`, and the caller receives
//! every event exactly once, in order, from one upstream execution.

mod support;

use idemgate_gateway::config::RawInflightMode;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idemgate_client::{
    AttemptEnd, Client, Error, Event, EventStream, IdempotencyKey, RequestBuilder, RestartReason,
};
use support::{
    TestGateway, chat, chat_to, cutting_relay, drain, executed_then_stop, ids, paced_stream,
    sim_behind_gateway,
};

fn addr(base: &str) -> SocketAddr {
    base.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{base}: {e}"))
}

/// The whole stored stream of `key`, as a fresh caller replays it.
async fn replay(gw: &TestGateway, key: &idemgate_client::IdempotencyKey, text: &str) -> Vec<Event> {
    let client = Client::new(&gw.base).expect("build the client");
    let mut stream = chat_to(&client, true, text)
        .idempotency_key(key.clone())
        .send_stream()
        .await
        .expect("send stream");
    assert!(stream.replayed());
    drain(&mut stream).await
}

fn assert_whole(events: &[Event]) {
    let got = ids(events);
    let want: Vec<u64> = (1..=got.len() as u64).collect();
    assert_eq!(got, want, "every event once, in order");
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
}

/// (c) The connection between the client and the gateway is cut in the
/// middle of the stream (mid-event, by a relay that closes the socket).
/// The client resumes after the last whole event; the gateway's execution
/// was never interrupted.
#[tokio::test]
async fn a_stream_cut_mid_way_resumes_after_the_last_whole_event() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Attach).await;
    // The head plus a few events, then the cut.
    let (relay, connections) = cutting_relay(addr(&gw.base), 1500).await;
    let client = Client::builder(&relay)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let text = "a stream cut on its way to the client";
    let mut stream = paced_stream(&client, text, "16", "20").await;
    assert!(!stream.replayed(), "this call started the execution");
    let events = drain(&mut stream).await;

    assert_whole(&events);
    assert_eq!(stream.resumes(), 1);
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    let AttemptEnd::StreamBroken { events: before } = stream.attempts()[0].end else {
        panic!("{:?}", stream.attempts());
    };
    assert!(
        before >= 1 && before < events.len() as u64,
        "cut in the middle: {before} of {} events before it",
        events.len()
    );
    // The last id names the run and the last event's number.
    let last = stream.last_event_id().expect("a last event id");
    assert!(last.ends_with(&format!("-{}", events.len())), "{last}");
    // What the caller got is the stored stream, event for event.
    assert_eq!(events, replay(&gw, stream.key(), text).await);
    assert_eq!(sim.executions_for(stream.key().as_str()), 1);
    assert_eq!(sim.stats().executions, 1);
    gw.stop().await.expect("the gateway ended without error");
}

/// Opens the streamed chat about `text` under `key` on a fresh client;
/// `tweak` adds to the request.
async fn keyed_stream(
    gw: &TestGateway,
    key: &IdempotencyKey,
    text: &str,
    tweak: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> EventStream {
    let client = Client::new(&gw.base).expect("a client of the gateway");
    let request = client
        .post("/v1/chat/completions")
        .idempotency_key(key.clone());
    tweak(request)
        .json(&chat(true, text))
        .send_stream()
        .await
        .expect("the stream opens")
}

/// The first `n` events of `stream`, none of them an error.
async fn first_events(stream: &mut EventStream, n: usize) -> Vec<Event> {
    let mut first = Vec::new();
    for _ in 0..n {
        let event = stream.next().await.expect("an event");
        first.push(event.expect("not an error"));
    }
    first
}

/// (c) The caller drops the stream after a few events (the process ends)
/// and a later call resumes it from the saved key and last event id.
#[tokio::test]
async fn a_stream_dropped_by_the_caller_resumes_from_the_saved_id() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Attach).await;
    let text = "a stream its reader abandons";
    let (key, saved, first) = {
        let client = Client::new(&gw.base).unwrap();
        let mut stream = paced_stream(&client, text, "12", "30").await;
        let first = first_events(&mut stream, 3).await;
        let saved = stream.last_event_id().unwrap().to_owned();
        (stream.key().clone(), saved, first)
        // Dropped here, mid-stream.
    };
    assert!(saved.ends_with("-3"), "the third event of its run: {saved}");

    let resume = |r: RequestBuilder| {
        r.last_event_id(saved)
            .header("x-sim-tokens", "12")
            .header("x-sim-token-interval-ms", "30")
    };
    let mut stream = keyed_stream(&gw, &key, text, resume).await;
    assert!(stream.replayed(), "joined or replayed, never run again");
    let rest = drain(&mut stream).await;
    assert_eq!(ids(&rest).first(), Some(&4));

    let mut all = first;
    all.extend(rest);
    assert_whole(&all);
    let whole = replay(&gw, &key, text).await;
    assert_eq!(all, whole);

    // Again, now from the stored stream: its replay comes in one burst, so
    // the client has read ahead of the caller. The saved id is the last
    // event the caller received, not the last one read.
    let (saved, first) = {
        let mut stream = keyed_stream(&gw, &key, text, |r| r).await;
        let first = first_events(&mut stream, 5).await;
        (stream.last_event_id().unwrap().to_owned(), first)
    };
    assert!(saved.ends_with("-5"), "the fifth event of its run: {saved}");
    let mut stream = keyed_stream(&gw, &key, text, |r| r.last_event_id(saved)).await;
    let mut all = first;
    all.extend(drain(&mut stream).await);
    assert_eq!(all, whole);
    executed_then_stop(&sim, key.as_str(), 1, gw).await;
}

/// (c) The client drops a stream that goes silent (its idle timeout is
/// shorter than the gap between tokens) and resumes it, as often as it
/// takes: each resumption that brings new events restarts the attempt
/// count.
#[tokio::test]
async fn a_silent_stream_is_dropped_and_resumed_until_its_end() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Attach).await;
    let client = Client::builder(&gw.base)
        .stream_idle_timeout(Duration::from_millis(60))
        .attempts(8)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .unwrap();
    let text = "a slow stream";
    let mut stream = paced_stream(&client, text, "6", "250").await;
    let events = drain(&mut stream).await;

    assert_whole(&events);
    assert!(stream.resumes() >= 2, "{:?}", stream.attempts());
    assert!(
        stream
            .attempts()
            .iter()
            .any(|a| matches!(a.end, AttemptEnd::StreamIdle { .. })),
        "{:?}",
        stream.attempts()
    );
    assert_eq!(events, replay(&gw, stream.key(), text).await);
    executed_then_stop(&sim, stream.key().as_str(), 1, gw).await;
}

/// A stream that breaks *upstream* cannot be resumed: the gateway released
/// the key, so the resumption starts a new execution
/// (`Idempotent-Replayed: false`) whose events are not the sequel of those
/// delivered. The client says so instead of stitching two generations, and
/// does not go on retrying: two executions, not more.
#[tokio::test]
async fn a_stream_broken_upstream_is_reported_not_stitched() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Attach).await;
    let client = Client::builder(&gw.base)
        .attempts(5)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let mut stream = chat_to(&client, true, "a stream the upstream breaks")
        .header("x-sim-fail", "reset-after:3")
        .header("x-sim-token-interval-ms", "10")
        .send_stream()
        .await
        .unwrap();
    let mut events = Vec::new();
    let err = loop {
        match stream.next().await {
            Some(Ok(e)) => events.push(e),
            Some(Err(e)) => break e,
            None => panic!("the stream cannot end cleanly"),
        }
    };
    assert!(!events.is_empty());
    assert_eq!(ids(&events), (1..=events.len() as u64).collect::<Vec<_>>());
    let Error::StreamRestarted {
        delivered, reason, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*delivered, events.len() as u64);
    assert_eq!(*reason, RestartReason::NewExecution);
    assert!(err.to_string().contains("same key"), "{err}");
    assert!(stream.next().await.is_none(), "the stream is over");
    executed_then_stop(&sim, stream.key().as_str(), 2, gw).await;
}
