//! "Never a failure replayed as the answer", through the whole gateway:
//! `serve` on 127.0.0.1:0 in front of the simulated upstream, on every
//! store the gateway opens (memory, SQLite, Redis, PostgreSQL).
//!
//! A 200 stream that ends in an error event, or without its dialect's
//! terminal event, releases the key: the retry runs again and its good
//! answer is the one stored. Compressed upstream answers are stored, relayed
//! and replayed plain, so their usage is read. Headers that arrive only when
//! a long generation ends are an ordinary answer.

mod support;

use support::TestGateway;

use std::time::Duration;

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::RawRoute;
use idemgate_testkit::postgres_server;

const REDIS: &str = "redis://127.0.0.1:6379";

fn tag() -> String {
    format!("igso{:08x}", rand::random::<u32>())
}

fn config(store: &str, route: &str, upstream: &str) -> GatewayConfig {
    let plain = RawRoute {
        id: Some(route.into()),
        done_ttl: Some("10m".into()),
        ..TestGateway::route(upstream)
    };
    // The same upstream on a charging route: `/charged/v1/…`.
    let charged = RawRoute {
        id: Some(format!("{route}-charged")),
        prefix: Some("/charged".into()),
        strip_prefix: Some(true),
        charges: Some(true),
        ..plain.clone()
    };
    TestGateway::builder(upstream)
        .store(store)
        .route(|r| *r = plain)
        .and_route(charged)
        .into_config()
}

/// A client that sends no `Accept-Encoding` and decodes nothing: it sees
/// the bytes the gateway sends.
fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_gzip()
        .no_brotli()
        .no_deflate()
        .build()
        .expect("build a client")
}

fn chat_body(stream: bool) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "tell me a story"}],
    })
    .to_string()
}

fn messages_body(stream: bool) -> String {
    serde_json::json!({
        "model": "sim-claude-small",
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "tell me a story"}],
    })
    .to_string()
}

fn responses_body(stream: bool) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "tell me a story"}]}],
    })
    .to_string()
}

/// What a client got: status, replay marker, content encoding, body, and
/// whether the body broke before its end.
struct Got {
    status: u16,
    replayed: Option<String>,
    encoding: Option<String>,
    body: Vec<u8>,
    broke: bool,
}

impl Got {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn send(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    body: String,
    headers: &[(&str, &str)],
) -> Got {
    let mut b = client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = b.send().await.expect("send the request");
    let (status, replayed, encoding) = (
        r.status().as_u16(),
        support::header(&r, "idempotent-replayed"),
        support::header(&r, "content-encoding"),
    );
    let (body, broke) = support::body_until_break(r).await;
    Got {
        status,
        replayed,
        encoding,
        body,
        broke,
    }
}

/// The sum of the samples of `name` whose labels hold every fragment.
async fn metric(client: &reqwest::Client, gw: &TestGateway, name: &str, labels: &[&str]) -> f64 {
    let text = support::metrics(gw, client).await;
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// The scenarios, on one store. Keys are unique per run (`run`), so shared
/// servers need no cleaning between runs.
async fn suite(store: &str) {
    let sim = support::sim().await;
    let route = "outcome";
    let gw = TestGateway::start(config(store, route, &sim.url())).await;
    // `serve` opens the store before it answers; a failure ends the task.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !gw.task.is_finished(),
        "the store at {store} is not available (start it with `bash scripts/services.sh`)"
    );
    let client = plain_client();
    let run = tag();
    let base = gw.base.as_str();
    let chat = "/v1/chat/completions";
    let route_label = format!("route=\"{route}\"");

    // 1. An OpenAI error event after a 200: the client sees it, the key is
    // released, the retry runs again, and the good answer is stored.
    let key = format!("{run}-error-event");
    let first = send(
        &client,
        base,
        chat,
        &key,
        chat_body(true),
        &[("x-sim-fail", "error-after:2")],
    )
    .await;
    assert_eq!(first.status, 200);
    assert!(first.text().contains("\"error\""), "{}", first.text());
    assert!(!first.text().contains("[DONE]"));
    let retry = send(&client, base, chat, &key, chat_body(true), &[]).await;
    assert_eq!(retry.replayed.as_deref(), Some("false"), "the retry ran");
    assert!(retry.text().contains("data: [DONE]"), "{}", retry.text());
    assert!(!retry.broke);
    assert_eq!(sim.executions_for(&key), 2);
    let replay = send(&client, base, chat, &key, chat_body(true), &[]).await;
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, retry.body, "the good answer is the stored one");
    assert_eq!(sim.executions_for(&key), 2);
    let released = ["reason=\"error_event\"", &route_label];
    assert_eq!(
        metric(&client, &gw, "idempotency_released_total", &released).await,
        1.0
    );

    // 2. An Anthropic `event: error` (overloaded_error) after a 200.
    let key = format!("{run}-anthropic-error");
    let first = send(
        &client,
        base,
        "/v1/messages",
        &key,
        messages_body(true),
        &[("x-sim-fail", "error-after:1")],
    )
    .await;
    assert_eq!(first.status, 200);
    assert!(first.text().contains("event: error"), "{}", first.text());
    assert!(first.text().contains("overloaded_error"));
    let retry = send(
        &client,
        base,
        "/v1/messages",
        &key,
        messages_body(true),
        &[],
    )
    .await;
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert!(
        retry.text().contains("event: message_stop"),
        "{}",
        retry.text()
    );
    assert_eq!(sim.executions_for(&key), 2);
    assert_eq!(
        metric(&client, &gw, "idempotency_released_total", &released).await,
        2.0
    );

    // 3. A stream that ends cleanly but without `[DONE]`: released; the
    // client's stream is cut, so it knows.
    let key = format!("{run}-unterminated");
    let first = send(
        &client,
        base,
        chat,
        &key,
        chat_body(true),
        &[("x-sim-fail", "end-after:3")],
    )
    .await;
    assert_eq!(first.status, 200);
    assert!(first.broke, "the client sees an unfinished stream");
    let retry = send(&client, base, chat, &key, chat_body(true), &[]).await;
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert_eq!(sim.executions_for(&key), 2);
    let unterminated = ["reason=\"unterminated_stream\"", &route_label];
    assert_eq!(
        metric(&client, &gw, "idempotency_released_total", &unterminated).await,
        1.0
    );

    // 4. A good stream is stored; the replay is identical.
    let key = format!("{run}-good");
    let first = send(&client, base, chat, &key, chat_body(true), &[]).await;
    assert!(!first.broke);
    let replay = send(&client, base, chat, &key, chat_body(true), &[]).await;
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(sim.executions_for(&key), 1);

    // 5. Compressed upstream answers (a CDN that compresses whatever it is
    // asked): a client that accepts no encoding gets plain bytes, live and
    // on replay, and the replay's saved tokens are counted.
    for (encoding, stream) in [("gzip", false), ("br", false), ("gzip", true), ("br", true)] {
        let key = format!("{run}-{encoding}-{stream}");
        let forced = [("x-sim-encoding", encoding)];
        let first = send(&client, base, chat, &key, chat_body(stream), &forced).await;
        assert_eq!(first.status, 200, "{encoding}");
        assert_eq!(
            first.encoding, None,
            "{encoding}: nothing the client did not accept"
        );
        let replay = send(&client, base, chat, &key, chat_body(stream), &forced).await;
        assert_eq!(
            replay.replayed.as_deref(),
            Some("true"),
            "{encoding} {stream}"
        );
        assert_eq!(replay.encoding, None);
        assert_eq!(replay.body, first.body, "{encoding} {stream}");
        if stream {
            assert!(first.text().contains("data: [DONE]"), "{}", first.text());
        } else {
            let v: serde_json::Value =
                serde_json::from_slice(&first.body).expect("a plain JSON answer");
            assert!(v["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0, "{v}");
        }
        assert_eq!(sim.executions_for(&key), 1);
    }
    let saved = metric(
        &client,
        &gw,
        "idempotency_tokens_saved_total",
        &[&route_label],
    )
    .await;
    assert!(saved > 0.0, "usage read from decoded answers: {saved}");

    // 6. Headers that come only when a long non-streaming generation ends.
    let key = format!("{run}-late-headers");
    let late = [("x-sim-latency-ms", "400")];
    let first = send(&client, base, chat, &key, chat_body(false), &late).await;
    assert_eq!(first.status, 200);
    let replay = send(&client, base, chat, &key, chat_body(false), &late).await;
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(sim.executions_for(&key), 1);

    // 7. The connection closed after the request was read, before any
    // response: the outcome is unknown, the key is released (for now, on
    // every route), and the retry runs again.
    let key = format!("{run}-closed");
    let first = send(
        &client,
        base,
        chat,
        &key,
        chat_body(false),
        &[("x-sim-fail", "close")],
    )
    .await;
    assert_eq!(first.status, 502, "{}", first.text());
    let retry = send(&client, base, chat, &key, chat_body(false), &[]).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert_eq!(sim.executions_for(&key), 2);

    // 8. The OpenAI Responses API: a `response.failed` event after a 200
    // releases the key; the retry's `response.completed` stream is stored
    // and replayed as it was.
    let responses = "/v1/responses";
    let key = format!("{run}-responses-failed");
    let first = send(
        &client,
        base,
        responses,
        &key,
        responses_body(true),
        &[("x-sim-fail", "error-after:2")],
    )
    .await;
    assert_eq!(first.status, 200);
    assert!(
        first.text().contains("event: response.failed"),
        "{}",
        first.text()
    );
    let retry = send(&client, base, responses, &key, responses_body(true), &[]).await;
    assert_eq!(retry.replayed.as_deref(), Some("false"), "the retry ran");
    assert!(
        retry.text().contains("event: response.completed"),
        "{}",
        retry.text()
    );
    assert_eq!(sim.executions_for(&key), 2);
    let replay = send(&client, base, responses, &key, responses_body(true), &[]).await;
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(sim.executions_for(&key), 2);
    // A Responses stream cut before `response.completed` is unterminated.
    let key = format!("{run}-responses-cut");
    let first = send(
        &client,
        base,
        responses,
        &key,
        responses_body(true),
        &[("x-sim-fail", "end-after:2")],
    )
    .await;
    assert!(first.broke, "the client sees an unfinished stream");
    let retry = send(&client, base, responses, &key, responses_body(true), &[]).await;
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert_eq!(sim.executions_for(&key), 2);

    // 9. A charging route: a stream that breaks after its head (a reset, or
    // a clean end before the terminal event) may have been generated and
    // billed. The key keeps the partial stream, ended by an outcome-unknown
    // error event, as its answer; the retry gets it and nothing runs again
    // (tests/stream_partial.rs has the rest). An error event is the
    // provider saying it failed: released as on any route.
    let charged = "/charged/v1/chat/completions";
    for fault in ["reset-after:3", "end-after:3"] {
        let key = format!("{run}-charged-{fault}");
        let first = send(
            &client,
            base,
            charged,
            &key,
            chat_body(true),
            &[("x-sim-fail", fault)],
        )
        .await;
        assert_eq!(first.status, 200, "{fault}");
        assert!(
            !first.broke,
            "{fault}: the partial answer is read to its end"
        );
        assert!(first.text().contains("outcome-unknown"), "{}", first.text());
        let retry = send(&client, base, charged, &key, chat_body(true), &[]).await;
        assert_eq!(retry.status, 200, "{fault}: {}", retry.text());
        assert_eq!(retry.replayed.as_deref(), Some("true"), "{fault}");
        assert_eq!(retry.body, first.body, "{fault}: the stored partial");
        assert_eq!(sim.executions_for(&key), 1, "{fault}: nothing ran twice");
    }
    let key = format!("{run}-charged-error-event");
    let first = send(
        &client,
        base,
        charged,
        &key,
        chat_body(true),
        &[("x-sim-fail", "error-after:2")],
    )
    .await;
    assert_eq!(first.status, 200);
    let retry = send(&client, base, charged, &key, chat_body(true), &[]).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert_eq!(sim.executions_for(&key), 2);
    let charged_label = format!("route=\"{route}-charged\"");
    assert_eq!(
        metric(
            &client,
            &gw,
            "idempotency_outcome_unknown_total",
            &[&charged_label]
        )
        .await,
        2.0
    );

    gw.stop().await.expect("stop cleanly");
}

#[tokio::test]
async fn memory_store() {
    suite("memory:").await;
}

#[tokio::test]
async fn sqlite_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    suite(&format!(
        "sqlite:{}",
        dir.path().join("outcome.db").display()
    ))
    .await;
}

#[tokio::test]
async fn redis_store() {
    suite(&format!("{REDIS}/?prefix={}", tag())).await;
}

#[tokio::test]
async fn postgres_store() {
    let schema = tag();
    suite(&format!(
        "{}?schema={schema}&pool=4",
        postgres_server::shared_url()
    ))
    .await;
    drop_schema(&schema).await;
}

/// Removes the test schema (psql, if installed; leftovers are harmless).
async fn drop_schema(schema: &str) {
    let _ = tokio::process::Command::new("psql")
        .args([&postgres_server::shared_url(), "-q", "-c"])
        .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .output()
        .await;
}
