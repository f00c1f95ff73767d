//! The client against a hostile server: real sockets on 127.0.0.1:0, a
//! raw HTTP/1.1 server writing what a well-behaved one never would. No
//! delay a server asks for is waited past the policy's cap, no redirect
//! carries the request (or its credentials) elsewhere, and no error body
//! is held in memory past its cap. Every claim is checked on the attempt
//! log, the error or what the servers received, never on elapsed time.

mod support;

use std::time::Duration;

use idemgate_client::{Client, ClientBuilder, Delay, DelaySource, Error, MAX_ERROR_BODY, Rejected};
use support::{RawServer, Reply, chat_to};

/// The cap the tests use, so that a capped wait is short.
const CAP: Duration = Duration::from_millis(50);

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// A client of `url` with the settings `tweak` makes.
fn client_of(url: &str, tweak: impl FnOnce(ClientBuilder) -> ClientBuilder) -> Client {
    tweak(Client::builder(url))
        .build()
        .expect("build the client")
}

#[tokio::test]
async fn a_delay_of_decades_in_any_header_form_is_cut_to_max_server_delay() {
    let forms = [
        ("retry-after", "1000000000", DelaySource::RetryAfterSeconds),
        (
            "retry-after",
            "99999999999999999999999",
            DelaySource::RetryAfterSeconds,
        ),
        (
            "retry-after",
            "Fri, 31 Dec 9999 23:59:59 GMT",
            DelaySource::RetryAfterDate,
        ),
        ("retry-after-ms", "1000000000000", DelaySource::RetryAfterMs),
        ("retry-after-ms", "1e300", DelaySource::RetryAfterMs),
    ];
    for (name, value, source) in forms {
        let server = RawServer::start(move |n, _| match n {
            0 => Reply::answer(503, &[(name, value)], b"{}"),
            _ => Reply::ok(),
        })
        .await;
        let client = client_of(&server.url, |b| b.max_server_delay(CAP));
        let response = chat_to(&client, false, "wait for it")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name}: {value}: {e}"));
        let attempts = response.attempts();
        assert_eq!(attempts.len(), 2, "{name}: {value}: {attempts:?}");
        assert_eq!(
            attempts[0].delay,
            Some(Delay::capped(CAP, source)),
            "{name}: {value}"
        );
        let heads = server.heads();
        assert_eq!(heads.len(), 2, "{name}: {value}: retried once");
        assert_eq!(
            header(&heads[0], "idempotency-key"),
            header(&heads[1], "idempotency-key"),
            "the retry is the same operation"
        );
    }
}

/// Sends the chat about `text` through `client`, which must end rejected
/// (`Error::Rejected`, not retried): the rejection, and the error's
/// message.
async fn rejected_chat(client: &Client, text: &str) -> (Rejected, String) {
    let err = chat_to(client, false, text)
        .send()
        .await
        .expect_err("a rejection is not a success");
    let message = err.to_string();
    let Error::Rejected(rejected) = err else {
        panic!("not a rejection: {message}");
    };
    (*rejected, message)
}

/// A 200 event stream with `headers` added, then `rest` (the framing
/// headers, the blank line and the body).
fn stream_reply(headers: &[(&str, &str)], rest: &str) -> Reply {
    let mut head = String::from("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    Reply::Bytes(format!("{head}{rest}").into_bytes())
}

/// A stream that sends `events` as one chunk, then breaks inside its
/// chunked body.
fn cut_stream(headers: &[(&str, &str)], events: &str) -> Reply {
    let len = events.len();
    let rest = format!("transfer-encoding: chunked\r\n\r\n{len:x}\r\n{events}\r\n");
    stream_reply(headers, &rest)
}

/// A stream that sends `events` whole and closes.
fn whole_stream(headers: &[(&str, &str)], events: &str) -> Reply {
    let len = events.len();
    let rest = format!("content-length: {len}\r\nconnection: close\r\n\r\n{events}");
    stream_reply(headers, &rest)
}

#[tokio::test]
async fn a_streams_retry_field_of_centuries_is_cut_to_max_server_delay() {
    let server = RawServer::start(|n, _| {
        match n {
            // One event with a reconnection time of about 3,000 years,
            // then the connection breaks inside its chunked body.
            0 => cut_stream(&[], "retry: 99999999999999\nid: 1\ndata: one\n\n"),
            _ => whole_stream(&[], "id: 2\ndata: [DONE]\n\n"),
        }
    })
    .await;
    let client = client_of(&server.url, |b| b.max_server_delay(CAP));
    let mut stream = chat_to(&client, true, "a stream that asks for patience")
        .send_stream()
        .await
        .expect("the stream starts");
    let events = support::drain(&mut stream).await;
    assert_eq!(support::ids(&events), [1, 2]);
    let waits: Vec<Delay> = stream.attempts().iter().filter_map(|a| a.delay).collect();
    assert_eq!(waits, [Delay::capped(CAP, DelaySource::StreamRetry)]);
    let heads = server.heads();
    assert_eq!(heads.len(), 2);
    assert_eq!(header(&heads[1], "last-event-id"), Some("1"));
}

/// A resumption answered with another execution's stream, whole (the one
/// read broke and another request ran the key again), is reported, never
/// stitched onto the events already delivered.
#[tokio::test]
async fn another_executions_stream_is_not_stitched_on() {
    let server = RawServer::start(|n, _| match n {
        0 => cut_stream(
            &[("idempotent-replayed", "false")],
            "id: 5-1\ndata: first run\n\n",
        ),
        _ => whole_stream(
            &[
                ("idempotent-replayed", "true"),
                ("idempotent-stream-restarted", "true"),
            ],
            "id: 6-1\ndata: second run\n\nid: 6-2\ndata: [DONE]\n\n",
        ),
    })
    .await;
    let client = client_of(&server.url, |b| {
        b.backoff(Duration::from_millis(1), Duration::from_millis(1))
    });
    let mut stream = chat_to(&client, true, "a stream whose run breaks")
        .send_stream()
        .await
        .expect("the stream starts");
    let first = stream
        .next()
        .await
        .expect("an event")
        .expect("the first event");
    assert_eq!(first.data, "first run");
    let err = stream
        .next()
        .await
        .expect("an error, not an end")
        .expect_err("the second run is not the first's sequel");
    assert!(
        matches!(
            err,
            Error::StreamRestarted {
                reason: idemgate_client::RestartReason::OtherExecution,
                delivered: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(header(&server.heads()[1], "last-event-id"), Some("5-1"));
}

#[tokio::test]
async fn redirects_are_returned_not_followed_and_the_other_host_receives_nothing() {
    let elsewhere = RawServer::start(|_, _| Reply::ok()).await;
    let to = format!("http://localhost:{}/v1/collect", elsewhere.port);
    for status in [301u16, 302, 303, 307, 308] {
        let location = to.clone();
        let server = RawServer::start(move |_, _| {
            Reply::answer(status, &[("location", location.as_str())], b"")
        })
        .await;
        let client = client_of(&server.url, |b| {
            b.bearer_auth("sk-secret-bearer")
                .header("x-api-key", "secret-x-api-key")
                .header("api-key", "secret-api-key")
                .header("x-goog-api-key", "secret-goog-key")
        });
        let (rejected, message) = rejected_chat(&client, "the prompt").await;
        assert_eq!(rejected.response.status.as_u16(), status);
        assert_eq!(
            rejected
                .response
                .headers
                .get("location")
                .and_then(|v| v.to_str().ok()),
            Some(to.as_str())
        );
        assert!(message.contains("not followed"), "{status}: {message}");
        assert_eq!(server.heads().len(), 1, "{status}: sent once");
    }
    assert_eq!(
        elsewhere.heads(),
        Vec::<String>::new(),
        "no request, body or key reached the other host"
    );

    // What the default prevents: a reqwest client that follows redirects
    // takes the API keys to the other host.
    let server =
        RawServer::start(move |_, _| Reply::answer(307, &[("location", to.as_str())], b"")).await;
    let client = client_of(&server.url, |b| {
        b.header("x-api-key", "secret-x-api-key")
            .http_client(reqwest::Client::new())
    });
    let followed = chat_to(&client, false, "the prompt")
        .send()
        .await
        .expect("followed to a 200");
    assert_eq!(followed.status().as_u16(), 200);
    let leaked = elsewhere.heads();
    assert_eq!(leaked.len(), 1);
    assert_eq!(header(&leaked[0], "x-api-key"), Some("secret-x-api-key"));
}

#[tokio::test]
async fn an_error_body_of_megabytes_is_read_up_to_the_cap() {
    let big = vec![b'e'; 8 * 1024 * 1024];
    let server = RawServer::start(move |_, _| {
        Reply::answer(400, &[("content-type", "application/json")], &big)
    })
    .await;
    let client = Client::new(&server.url).expect("build the client");
    let err = chat_to(&client, false, "x")
        .send()
        .await
        .expect_err("a 400 is final");
    let response = err.response().expect("the 400 is carried");
    assert_eq!(response.status.as_u16(), 400);
    assert_eq!(response.body.len(), MAX_ERROR_BODY);
    assert!(response.truncated);
    assert_eq!(response.problem, None);

    // A small one is read whole.
    let server = RawServer::start(|_, _| {
        Reply::answer(
            400,
            &[("content-type", "application/json")],
            br#"{"error":{"message":"small"}}"#,
        )
    })
    .await;
    let err = Client::new(&server.url)
        .expect("build the client")
        .post("/v1/x")
        .send()
        .await
        .expect_err("a 400 is final");
    let response = err.response().expect("the 400 is carried");
    assert_eq!(&response.body[..], br#"{"error":{"message":"small"}}"#);
    assert!(!response.truncated);
}

#[tokio::test]
async fn an_endless_error_body_is_cut_at_the_cap_not_read_to_the_timeout() {
    let server = RawServer::start(|_, _| {
        Reply::Endless(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
             transfer-encoding: chunked\r\n\r\n"
                .to_owned(),
        )
    })
    .await;
    // Read whole, the body would run into this timeout: the attempt would
    // end as a timeout and be retried instead of being a final 400.
    let client = client_of(&server.url, |b| {
        b.attempt_timeout(Duration::from_secs(60)).attempts(1)
    });
    let (rejected, _) = rejected_chat(&client, "x").await;
    assert_eq!(rejected.response.status.as_u16(), 400);
    assert_eq!(rejected.response.body.len(), MAX_ERROR_BODY);
    assert!(rejected.response.truncated);
    assert!(
        rejected.response.body.iter().all(|b| *b == b'x'),
        "the body's first bytes"
    );
    assert!(server.written() >= MAX_ERROR_BODY);
}
