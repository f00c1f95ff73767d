//! The client's retries against a real gateway on 127.0.0.1:0 in front of
//! the simulated LLM (or a scripted upstream, for headers the simulator
//! does not send). Every claim is checked with the upstream's own counters,
//! never with elapsed time.

mod support;

use idemgate_gateway::config::RawInflightMode;
use std::time::Duration;

use idemgate_client::{
    AttemptEnd, Client, ClientBuilder, Delay, DelaySource, Error, GiveUpReason, IdempotencyKey,
    Jitter, KEY_MISMATCH,
};
use reqwest::StatusCode;
use support::{
    Canned, Scripted, chat, chat_to, executed_then_stop, gateway, sim, sim_behind_gateway,
};

/// A client of `base` making up to `attempts` attempts, `backoff` apart
/// unless the server says otherwise (no jitter).
fn steady_client(base: &str, attempts: u32, backoff: Duration) -> Client {
    Client::builder(base)
        .attempts(attempts)
        .backoff(backoff, backoff)
        .jitter(Jitter::None)
        .build()
        .expect("build the client")
}

/// (a) The client's attempt timeout is shorter than the generation. The
/// first attempt times out; the retries carry the same key; the gateway
/// keeps the one upstream call going and a retry gets its stored answer.
#[tokio::test]
async fn a_timeout_shorter_than_the_generation_is_retried_with_the_same_key_and_runs_once() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Wait).await;
    let client = Client::builder(&gw.base)
        .bearer_auth("sk-test")
        .attempt_timeout(Duration::from_millis(300))
        .attempts(20)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .unwrap();

    let request = chat_to(&client, false, "write the report").header("x-sim-latency-ms", "1200");
    let key = request.key().clone();
    let response = request.send().await.unwrap();

    let attempts = response.attempts();
    assert!(attempts.len() >= 2, "{attempts:?}");
    assert_eq!(attempts[0].end, AttemptEnd::Timeout);
    assert_eq!(
        attempts.last().map(|a| &a.end),
        Some(&AttemptEnd::Status(StatusCode::OK))
    );
    assert_eq!(
        response.key(),
        &key,
        "the key minted before the first attempt"
    );
    assert!(
        response.replayed(),
        "the stored answer of the first attempt's execution"
    );
    assert!(response.text().unwrap().contains("chat.completion"));
    // Every attempt reached the gateway with one key: one execution, one bill.
    assert_eq!(sim.executions_for(key.as_str()), 1);
    let stats = sim.stats();
    assert_eq!(stats.executions, 1, "{stats:?}");
    assert_eq!(stats.requests, 1, "only the first attempt was forwarded");
    gw.stop().await.expect("the gateway ended without error");
}

/// (b) On a `reject` route a key in flight is a 409 with `Retry-After` and
/// `x-should-retry: true`; the client waits the server's delay and retries
/// with the same key until the stored answer is there.
#[tokio::test]
async fn a_409_for_a_key_in_flight_is_retried_after_the_servers_delay() {
    let sim = sim().await;
    // A 2 s lease, renewed while the call runs: the 409 advises a poll in
    // 1 s (`retry-after-ms: 1000`, which wins over `Retry-After`), the floor
    // of the route's latency-based interval and never past the lease.
    let gw = gateway(&sim.url(), RawInflightMode::Reject, |r| {
        r.pending_ttl = Some("2s".into());
    })
    .await;
    let key = IdempotencyKey::new("report-b").unwrap();
    let body = chat(false, "the report, once");

    // Another worker is already running this operation.
    let other = {
        let client = Client::new(&gw.base).unwrap();
        let request = client
            .post("/v1/chat/completions")
            .idempotency_key(key.clone())
            .header("x-sim-latency-ms", "1500")
            .json(&body);
        tokio::spawn(request.send())
    };
    let stats = sim.stats_handle();
    for _ in 0..400 {
        if stats.snapshot().executions == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stats.snapshot().executions, 1, "the other worker started");

    // A backoff far from the server's delay: the log shows which won.
    let client = steady_client(&gw.base, 10, Duration::from_secs(30));
    let response = client
        .post("/v1/chat/completions")
        .idempotency_key(key.clone())
        .header("x-sim-latency-ms", "1500")
        .json(&body)
        .send()
        .await
        .unwrap();

    let attempts = response.attempts();
    let conflicts: Vec<_> = attempts
        .iter()
        .filter(|a| a.end == AttemptEnd::Status(StatusCode::CONFLICT))
        .collect();
    assert!(!conflicts.is_empty(), "{attempts:?}");
    assert_eq!(attempts[0].end, AttemptEnd::Status(StatusCode::CONFLICT));
    for a in &conflicts {
        assert_eq!(
            a.delay,
            Some(Delay::new(
                Duration::from_secs(1),
                DelaySource::RetryAfterMs
            )),
            "{a:?}"
        );
    }
    assert_eq!(attempts.len(), conflicts.len() + 1);
    assert!(response.replayed());
    let first = other.await.unwrap().unwrap();
    assert!(!first.replayed(), "the other worker executed it");
    assert_eq!(response.bytes(), first.bytes(), "the same answer");
    executed_then_stop(&sim, key.as_str(), 1, gw).await;
}

/// (d) The same key with a different body is a 422 `key-mismatch`: final
/// on the first attempt, reported as a reused key; nothing is forwarded.
/// Another final 4xx (an upstream 400) is not retried either.
#[tokio::test]
async fn a_key_reused_for_a_different_body_is_final_and_says_so() {
    let (sim, gw) = sim_behind_gateway(RawInflightMode::Wait).await;
    let client = Client::builder(&gw.base).attempts(5).build().unwrap();
    let key = IdempotencyKey::new("order-81:summary").unwrap();

    let first = chat_to(&client, false, "summarize order 81")
        .idempotency_key(key.clone())
        .send()
        .await
        .unwrap();
    assert!(!first.replayed());

    let err = chat_to(&client, false, "summarize order 82")
        .idempotency_key(key.clone())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KeyReused(_)), "{err:?}");
    assert_eq!(err.key(), Some(&key));
    assert_eq!(err.attempts().len(), 1, "final: not retried");
    let message = err.to_string();
    assert!(
        message.contains("order-81:summary")
            && message.contains("already used for a different request"),
        "{message}"
    );
    let response = err.response().unwrap();
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        response.problem.as_ref().map(|p| p.slug()),
        Some(KEY_MISMATCH)
    );
    assert_eq!(sim.executions_for(key.as_str()), 1);

    // An upstream's own 400 is final too.
    let err = chat_to(&client, false, "invalid")
        .header("x-sim-fail", "400")
        .send()
        .await
        .unwrap_err();
    let Error::Rejected(rejected) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(rejected.response.status, StatusCode::BAD_REQUEST);
    assert_eq!(rejected.attempts.len(), 1);
    assert!(err.to_string().contains("final, not retried"), "{err}");
    gw.stop().await.expect("the gateway ended without error");
}

/// (e) `retry-after-ms` wins over `Retry-After` and over the backoff, for
/// a 429 and a 503 passed through the gateway (which releases the key on
/// both, so each retry reaches the upstream with the same key).
#[tokio::test]
async fn backoff_honours_retry_after_ms_through_the_gateway() {
    let upstream = Scripted::start(vec![
        Canned::error(429, &[("retry-after-ms", "120"), ("retry-after", "30")]),
        Canned::error(503, &[("retry-after-ms", "80"), ("retry-after", "30")]),
        Canned::ok(),
    ])
    .await;
    let gw = gateway(&upstream.url, RawInflightMode::Reject, |_| {}).await;
    let client = steady_client(&gw.base, 5, Duration::from_secs(10));

    let response = chat_to(&client, false, "rate limited twice")
        .send()
        .await
        .unwrap();

    let seen: Vec<_> = response
        .attempts()
        .iter()
        .map(|a| (a.end.clone(), a.delay))
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                AttemptEnd::Status(StatusCode::TOO_MANY_REQUESTS),
                Some(Delay::new(
                    Duration::from_millis(120),
                    DelaySource::RetryAfterMs
                ))
            ),
            (
                AttemptEnd::Status(StatusCode::SERVICE_UNAVAILABLE),
                Some(Delay::new(
                    Duration::from_millis(80),
                    DelaySource::RetryAfterMs
                ))
            ),
            (AttemptEnd::Status(StatusCode::OK), None),
        ]
    );
    let key = response.key().as_str().to_owned();
    assert_eq!(
        upstream.keys(),
        vec![key.clone(); 3],
        "one key, every attempt"
    );
    assert!(!response.replayed());

    // The operation is now DONE: sending it again is a replay.
    let again = chat_to(&client, false, "rate limited twice")
        .idempotency_key(response.key().clone())
        .send()
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(again.attempts().len(), 1);
    assert_eq!(upstream.keys().len(), 3);
    gw.stop().await.expect("the gateway ended without error");
}

/// `x-should-retry` overrides the status, both ways, through the gateway.
#[tokio::test]
async fn x_should_retry_overrides_the_status() {
    let upstream = Scripted::start(vec![
        Canned::error(400, &[("x-should-retry", "true"), ("retry-after-ms", "10")]),
        Canned::error(503, &[("x-should-retry", "false")]),
    ])
    .await;
    // The gateway stores a final 400 by default; here 400 is released like
    // a retryable status so that the retry reaches the upstream again.
    let gw = gateway(&upstream.url, RawInflightMode::Reject, |r| {
        r.retryable_statuses = Some(vec![400, 503]);
    })
    .await;
    let client = Client::builder(&gw.base).attempts(5).build().unwrap();
    let err = chat_to(&client, false, "x-should-retry")
        .send()
        .await
        .unwrap_err();
    let Error::Rejected(rejected) = &err else {
        panic!("{err:?}");
    };
    let outcomes: Vec<_> = rejected.attempts.iter().map(|a| a.end.clone()).collect();
    assert_eq!(
        outcomes,
        vec![
            AttemptEnd::Status(StatusCode::BAD_REQUEST),
            AttemptEnd::Status(StatusCode::SERVICE_UNAVAILABLE),
        ],
        "a 400 retried because the server said so; a 503 final because it said not to"
    );
    assert_eq!(rejected.response.should_retry, Some(false));
    assert!(err.to_string().contains("x-should-retry: false"), "{err}");
    assert_eq!(upstream.keys().len(), 2);
    gw.stop().await.expect("the gateway ended without error");
}

/// `Retry-After` in seconds and as an HTTP date, and the deadline, on
/// tokio's paused clock: a 10 s delay costs no real time. Straight to a
/// scripted server (no timers of its own, no attempt timeout), so the
/// clock only moves for the client's own waits.
#[tokio::test(start_paused = true)]
async fn retry_after_seconds_dates_and_the_deadline() {
    let upstream = Scripted::start(vec![Canned::error(503, &[("retry-after", "10")])]).await;
    // No pooled idle connections: their idle timer would move the paused
    // clock on its own.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    // Sends a chat about `text` to `upstream` through a client on `http`,
    // without an attempt timeout, with the settings `tweak` makes.
    let send = |upstream: &Scripted, text: &str, tweak: fn(ClientBuilder) -> ClientBuilder| {
        let builder = Client::builder(&upstream.url).http_client(http.clone());
        let client = tweak(builder.attempt_timeout(None)).build().unwrap();
        let request = client.post("/v1/x").json(&chat(false, text));
        async move { request.send().await }
    };
    let err = send(&upstream, "busy", |b| {
        b.attempts(10).deadline(Duration::from_secs(25))
    })
    .await
    .unwrap_err();
    let Error::GaveUp(gave_up) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        gave_up.reason,
        GiveUpReason::Deadline(Duration::from_secs(25))
    );
    let delays: Vec<_> = gave_up.attempts.iter().map(|a| a.delay).collect();
    let ten = Some(Delay::new(
        Duration::from_secs(10),
        DelaySource::RetryAfterSeconds,
    ));
    // At 0 s and 10 s a 10 s wait fits; at 20 s it would end after 25 s.
    assert_eq!(delays, vec![ten, ten, None]);
    assert_eq!(
        gave_up.last_response.as_ref().map(|r| r.status),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(upstream.keys(), vec![gave_up.key.as_str().to_owned(); 3]);

    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3));
    let upstream = Scripted::start(vec![
        Canned::error(429, &[("retry-after", &date)]),
        Canned::ok(),
    ])
    .await;
    let response = send(&upstream, "later", |b| b).await.unwrap();
    let delay = response.attempts()[0].delay.unwrap();
    assert_eq!(delay.source, DelaySource::RetryAfterDate);
    // The date has whole seconds: 3 s from when it was written, at most.
    assert!(delay.duration <= Duration::from_secs(3), "{delay:?}");
    assert!(delay.duration > Duration::from_secs(1), "{delay:?}");
}
