//! A stream that breaks on a charging route keeps its partial result, on
//! every store the gateway opens (memory, SQLite, Redis, PostgreSQL):
//! `serve` on 127.0.0.1:0 in front of the simulated upstream, whose
//! `x-sim-fail: reset-after:N` cuts a stream after N tokens.
//!
//! The key's answer is the events relayed before the break, then one
//! terminal error event naming `outcome-unknown`, the events relayed and
//! the tokens received. Every reader gets those same bytes: the owner's
//! client (its stream ends cleanly once the answer is stored), duplicates
//! that attached to the live stream (in the process, and through Redis on
//! another replica), replays, and `Last-Event-ID` resumptions, which get
//! the events after theirs and then the terminal event. The upstream runs
//! once. A store that cannot be opened fails the suite (no silent skip).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute};
use idemgate_llm_sim::{SimConfig, SimHandle};
use serde_json::Value;
use support::TestGateway;

const REDIS: &str = "redis://127.0.0.1:6379";

fn postgres_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn tag() -> String {
    format!("igsp{:08x}", rand::random::<u32>())
}

fn config(store: &str, upstream: &str) -> GatewayConfig {
    let charged = RawRoute {
        id: Some("partial".into()),
        prefix: Some("/v1".into()),
        upstream: Some(upstream.into()),
        key: Some(RawKeyMode::Require),
        charges: Some(true),
        on_inflight: Some(RawInflightMode::Attach),
        inflight_wait: Some("30s".into()),
        timeouts: Some(support::timeouts("1s", "10s", "5s", "30s")),
        ..RawRoute::default()
    };
    GatewayConfig::from_raw(RawConfig {
        store: Some(store.into()),
        shutdown_grace: Some("5s".into()),
        routes: vec![charged],
        ..RawConfig::default()
    })
    .unwrap_or_else(|e| panic!("config: {e}"))
}

/// A replica on `store` (see [`support::replica_on`]).
async fn replica(store: &str, upstream: &str) -> TestGateway {
    support::replica_on(store, config(store, upstream)).await
}

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn body_for(path: &str, key: &str, stream: bool) -> String {
    let text = format!("tell me about {key}");
    if path == MESSAGES {
        serde_json::json!({
            "model": "sim-claude-small",
            "max_tokens": 64,
            "stream": stream,
            "messages": [{"role": "user", "content": text}],
        })
        .to_string()
    } else {
        support::chat_body(stream, &text)
    }
}

/// The request for `key` on `path`, with the upstream's `fault` (the
/// fault header goes on every request of the key: the fingerprint does
/// not cover it, and the upstream runs only once anyway).
fn request(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    stream: bool,
    fault: &str,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        .header("x-sim-fail", fault)
        .header("x-sim-token-interval-ms", "100")
        .body(body_for(path, key, stream))
}

/// What a client got.
#[derive(Debug)]
struct Got {
    status: u16,
    replayed: Option<String>,
    body: Vec<u8>,
    broke: bool,
}

async fn read(res: reqwest::Response) -> Got {
    let status = res.status().as_u16();
    let replayed = support::header(&res, "idempotent-replayed");
    let (body, broke) = support::body_until_break(res).await;
    Got {
        status,
        replayed,
        body,
        broke,
    }
}

/// Sends `req` and reads what the client got.
async fn send(req: reqwest::RequestBuilder) -> Got {
    read(req.send().await.expect("send the request")).await
}

/// The events of an SSE body (the simulator and the gateway end lines
/// with `\n`), each with its blank line.
fn events(body: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
        out.push(rest[..end + 2].to_vec());
        rest = &rest[end + 2..];
    }
    assert!(rest.is_empty(), "an unfinished event: {rest:?}");
    out
}

fn field<'a>(event: &'a str, name: &str) -> Option<&'a str> {
    event
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

/// The run the body's events name, and checks they are `RUN-1 … RUN-n`.
fn run_of(body: &[u8]) -> String {
    let all = events(body);
    let first = String::from_utf8_lossy(&all[0]).into_owned();
    let run = field(&first, "id")
        .and_then(|id| id.split_once('-'))
        .map(|(run, _)| run.to_owned())
        .expect("the first event names its run");
    for (i, e) in all.iter().enumerate() {
        let e = String::from_utf8_lossy(e);
        assert_eq!(field(&e, "id"), Some(format!("{run}-{}", i + 1).as_str()));
    }
    run
}

/// The terminal event's name and JSON data.
fn terminal(body: &[u8]) -> (Option<String>, Value) {
    let all = events(body);
    let last = String::from_utf8_lossy(all.last().expect("events")).into_owned();
    let data = field(&last, "data").expect("the terminal event has data");
    (
        field(&last, "event").map(str::to_owned),
        serde_json::from_str(data).expect("JSON data"),
    )
}

/// One broken stream: the owner's client, duplicates that attach while it
/// runs (on `a`, and on `b` when given: another replica), replays and
/// resumptions all get the same partial answer. Returns the owner's body.
async fn broken_stream(
    sim: &SimHandle,
    a: &TestGateway,
    b: Option<&TestGateway>,
    path: &str,
    key: &str,
    fault: &str,
) -> Vec<u8> {
    let client = reqwest::Client::new();
    let owner = request(&client, &a.base, path, key, true, fault)
        .send()
        .await
        .expect("the owner's request");
    assert_eq!(owner.status(), 200);
    // Duplicates sent while the owner's stream runs (or, if it is over by
    // then, after: the same bytes either way).
    let dup = |base: String, last: Option<String>| {
        let req = request(&client, &base, path, key, true, fault);
        let req = match last {
            Some(id) => req.header("last-event-id", id),
            None => req,
        };
        send(req)
    };
    let mut replicas = vec![a.base.clone()];
    replicas.extend(b.map(|b| b.base.clone()));
    let (owner, followers) = tokio::join!(
        read(owner),
        futures_util::future::join_all(replicas.iter().map(|base| dup(base.clone(), None)))
    );
    assert!(
        !owner.broke,
        "the owner's client reads the stored answer to its end"
    );
    assert_eq!(owner.replayed.as_deref(), Some("false"));
    for f in &followers {
        assert_eq!(f.status, 200);
        assert_eq!(f.replayed.as_deref(), Some("true"));
        assert!(!f.broke);
        assert_eq!(
            String::from_utf8_lossy(&f.body),
            String::from_utf8_lossy(&owner.body),
            "a duplicate got the owner's answer"
        );
    }
    assert_eq!(sim.executions_for(key), 1, "one upstream execution");

    let run = run_of(&owner.body);
    let n = events(&owner.body).len() - 1;
    for base in &replicas {
        let retry = dup(base.clone(), None).await;
        assert_eq!(retry.status, 200);
        assert_eq!(retry.replayed.as_deref(), Some("true"));
        assert!(!retry.broke);
        assert_eq!(
            retry.body, owner.body,
            "the retry's bytes are the stored partial"
        );
        for after in [2, n] {
            let resumed = dup(base.clone(), Some(format!("{run}-{after}"))).await;
            assert_eq!(resumed.status, 200);
            assert!(!resumed.broke);
            let expected: Vec<u8> = events(&owner.body)[after..].concat();
            assert_eq!(
                String::from_utf8_lossy(&resumed.body),
                String::from_utf8_lossy(&expected),
                "Last-Event-ID {run}-{after}: the events after it, then the terminal event"
            );
        }
    }
    assert_eq!(sim.executions_for(key), 1, "nothing ran again");
    owner.body
}

async fn suite(store: &str, second_replica: bool) {
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the simulator");
    let a = replica(store, &sim.url()).await;
    let b = if second_replica {
        Some(replica(store, &sim.url()).await)
    } else {
        None
    };
    let run = tag();

    // OpenAI chat: the role chunk and 5 tokens, then the reset.
    let key = format!("{run}-openai");
    let body = broken_stream(&sim, &a, b.as_ref(), CHAT, &key, "reset-after:5").await;
    assert_eq!(events(&body).len(), 7, "{}", String::from_utf8_lossy(&body));
    let (name, data) = terminal(&body);
    assert_eq!(name, None, "OpenAI writes a stream's error as data alone");
    assert_eq!(data["error"]["code"], "outcome-unknown", "{data}");
    assert_eq!(data["error"]["events"], 6);
    assert_eq!(data["error"]["tokens"], 5);
    assert_eq!(data["error"]["phase"], "stream");
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));

    // Anthropic: message_start, content_block_start, ping and 2 deltas.
    let key = format!("{run}-anthropic");
    let body = broken_stream(&sim, &a, b.as_ref(), MESSAGES, &key, "reset-after:2").await;
    let (name, data) = terminal(&body);
    assert_eq!(name.as_deref(), Some("error"));
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["code"], "outcome-unknown", "{data}");
    assert_eq!(data["error"]["events"], 5);
    assert_eq!(data["error"]["tokens"], 2);

    // A clean end before `[DONE]` is a break too.
    let key = format!("{run}-unterminated");
    let body = broken_stream(&sim, &a, b.as_ref(), CHAT, &key, "end-after:3").await;
    let (_, data) = terminal(&body);
    assert_eq!(data["error"]["events"], 4);
    assert_eq!(data["error"]["tokens"], 3);

    // A JSON answer that breaks stays a 502 problem document.
    let key = format!("{run}-json");
    let client = reqwest::Client::new();
    let json = || request(&client, &a.base, CHAT, &key, false, "reset-after:10");
    let first = send(json()).await;
    assert_eq!(first.status, 502);
    let problem: Value = serde_json::from_slice(&first.body).expect("a problem document");
    assert_eq!(problem["error"]["code"], "outcome-unknown");
    let retry = send(json()).await;
    assert_eq!(retry.status, 502);
    assert_eq!(retry.replayed.as_deref(), Some("true"));
    assert_eq!(retry.body, first.body);
    assert_eq!(sim.executions_for(&key), 1);

    a.stop().await.expect("stop cleanly");
    if let Some(b) = b {
        b.stop().await.expect("stop cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store() {
    suite("memory:", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = format!("sqlite:{}", dir.path().join("partial.db").display());
    // Two replicas on one file: the other one waits for DONE and replays.
    suite(&store, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store() {
    // Two replicas: the other one follows the live stream through Redis.
    suite(&format!("{REDIS}/?prefix={}", tag()), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store() {
    let schema = tag();
    suite(&format!("{}?schema={schema}&pool=4", postgres_url()), true).await;
    let _ = tokio::process::Command::new("psql")
        .args([&postgres_url(), "-q", "-c"])
        .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .output()
        .await;
}
