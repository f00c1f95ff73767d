//! A stream that breaks upstream on a charging route: the gateway keeps
//! the events relayed before the break, then one terminal event naming
//! `outcome-unknown`, as the key's answer. The client hands out those
//! events, then ends the stream with [`Error::OutcomeUnknown`] (never the
//! terminal event as an ordinary one, never a resumption that would run
//! the generation again); a second call with the same key gets the same
//! events and the same error, from the one upstream execution.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use idemgate_client::{Client, Error, Event, IdempotencyKey};
use idemgate_gateway::config::RawInflightMode;
use support::{chat_to, gateway, sim};

/// Events until the stream's end; the error it ended with, if any.
async fn read(
    client: &Client,
    key: &IdempotencyKey,
    text: &str,
) -> (Vec<Event>, Option<Error>, bool) {
    let mut stream = chat_to(client, true, text)
        .idempotency_key(key.clone())
        .header("x-sim-tokens", "12")
        .header("x-sim-token-interval-ms", "10")
        .header("x-sim-fail", "reset-after:4")
        .send_stream()
        .await
        .expect("the stream opens");
    let replayed = stream.replayed();
    let mut events = Vec::new();
    let mut error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => events.push(event),
            Err(e) => {
                error = Some(e);
                assert!(stream.next().await.is_none(), "nothing after the error");
                break;
            }
        }
    }
    (events, error, replayed)
}

#[tokio::test]
async fn a_stream_broken_upstream_on_a_charging_route_ends_in_outcome_unknown() {
    let sim = sim().await;
    let gw = gateway(&sim.url(), RawInflightMode::Attach, |r| {
        r.charges = Some(true);
    })
    .await;
    let client = Client::builder(&gw.base)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .build()
        .unwrap();
    let key = IdempotencyKey::new("partial-stream-1").unwrap();
    let text = "a generation that breaks after four tokens";

    let (events, error, replayed) = read(&client, &key, text).await;
    assert!(!replayed, "the first call ran the generation");
    assert!(
        !events.is_empty(),
        "the events before the break are handed out"
    );
    assert!(
        events.iter().all(|e| !e.data.contains("outcome-unknown")),
        "the terminal event is not handed out as an event: {events:?}"
    );
    match &error {
        Some(Error::OutcomeUnknown {
            key: k,
            delivered,
            tokens,
            message,
        }) => {
            assert_eq!(k, &key);
            assert_eq!(*delivered, events.len() as u64);
            assert!(tokens.is_some_and(|t| t >= 1), "tokens counted: {tokens:?}");
            assert!(message.contains("Outcome unknown"), "{message}");
        }
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }

    let (again, error_again, replayed) = read(&client, &key, text).await;
    assert!(
        replayed,
        "the second call is answered from the stored answer"
    );
    let datas = |es: &[Event]| es.iter().map(|e| e.data.clone()).collect::<Vec<_>>();
    assert_eq!(datas(&again), datas(&events), "the same partial answer");
    assert!(
        matches!(error_again, Some(Error::OutcomeUnknown { delivered, .. }) if delivered == events.len() as u64),
        "{error_again:?}"
    );
    assert_eq!(sim.executions_for(key.as_str()), 1, "never generated again");
    gw.stop().await.expect("the gateway stops cleanly");
}
