//! Malformed requests against a running gateway, over raw TCP so that any
//! bytes can be sent (reqwest refuses invalid header values).
//!
//! A few hundred requests from a fixed seed mix garbled `Idempotency-Key`,
//! `Last-Event-ID`, `Prefer` and `Content-Type` headers, repeated and huge
//! keys, and bodies that are invalid JSON, JSON with duplicate keys,
//! random bytes or over the body limit, and JSON of shapes far beyond the
//! usual (thousands of levels deep, a thousand members wide, numbers of
//! thousands of digits, hostile escapes). Whatever arrives, the gateway must
//! answer without a 5xx of its own (the simulated upstream is never asked
//! to fail, so any 5xx would be the gateway's), keep serving, and store
//! nothing for a request it refused: every record in the store belongs to
//! a request the upstream saw.

mod support;

use support::TestGateway;

use std::path::Path;
use std::time::Duration;

use idemgate_engine::{ClientKey, ScopedKey};
use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawInflightMode, RawKeyMode, RawRoute, RawSize};
use idemgate_llm_sim::SimConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SEED: u64 = 0x1de_9a7e;
const REQUESTS: usize = 300;
const BODY_LIMIT: usize = 16 * 1024;
const CREDENTIAL: &str = "fuzz-credential";

/// One request as sent, and what is known about its key.
struct Sent {
    bytes: Vec<u8>,
    /// The key it carried, when that is a valid key sent once.
    key: Option<ClientKey>,
}

/// A response as read off the wire; `None` status when the connection
/// closed without one.
#[derive(Debug)]
struct Received {
    status: Option<u16>,
    problem: bool,
}

/// Bytes for a header value: printable, obs-text, controls or nothing.
fn header_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max);
    let flavour = rng.random_range(0..4);
    (0..len)
        .map(|_| match flavour {
            0 => rng.random_range(0x20..0x7f),
            1 => rng.random_range(0x80..=0xff),
            // Any byte but the line breaks that end a header on the wire.
            _ => loop {
                let b: u8 = rng.random();
                if b != b'\r' && b != b'\n' {
                    break b;
                }
            },
        })
        .collect()
}

/// The `Idempotency-Key` header lines of request `i`, and its key when it
/// is a valid one sent once. Valid keys start with `fz{i}-`, so no two
/// requests share one.
fn key_lines(rng: &mut StdRng, i: usize) -> (Vec<Vec<u8>>, Option<ClientKey>) {
    let unique = format!("fz{i}-");
    let value: Vec<u8> = match rng.random_range(0..8) {
        0 => return (Vec::new(), None),
        1 => {
            let mut v = unique.into_bytes();
            v.extend(header_bytes(rng, 40));
            v
        }
        2 => format!("\"{unique}{}\"", rng.random_range(0..1000)).into_bytes(),
        3 => {
            let mut v = unique.into_bytes();
            v.resize(rng.random_range(256..12_000), b'k');
            v
        }
        4 => header_bytes(rng, 20),
        5 => format!("\"{unique}\\x\"").into_bytes(),
        _ => format!("{unique}{}", rng.random_range(0..1_000_000)).into_bytes(),
    };
    let key = ClientKey::parse_bytes(&value).ok();
    if rng.random_range(0..10) == 0 {
        let again = format!("fz{i}-again").into_bytes();
        return (vec![value, again], None);
    }
    (vec![value], key)
}

fn body(rng: &mut StdRng) -> (Vec<u8>, Option<Vec<u8>>) {
    let chat = |extra: &str| {
        format!(r#"{{"model":"sim-1",{extra}"messages":[{{"role":"user","content":"fuzz"}}]}}"#)
            .into_bytes()
    };
    match rng.random_range(0..13) {
        0 | 1 => (chat(""), Some(b"application/json".to_vec())),
        2 => (
            chat(r#""stream":true,"#),
            Some(b"application/json".to_vec()),
        ),
        3 => (
            chat(r#""model":"again","#),
            Some(b"application/json".to_vec()),
        ),
        4 => {
            let mut b = chat(r#""n":"#);
            // Cut the JSON anywhere.
            b.truncate(rng.random_range(0..b.len()));
            (b, Some(b"application/json".to_vec()))
        }
        5 => {
            let len = rng.random_range(0..2_000);
            ((0..len).map(|_| rng.random()).collect(), None)
        }
        6 => (
            vec![b'x'; rng.random_range(BODY_LIMIT + 1..BODY_LIMIT * 3)],
            None,
        ),
        7 => (
            b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx\r\n--b--\r\n".to_vec(),
            Some(b"multipart/form-data; boundary=b".to_vec()),
        ),
        8 => (
            br#"{"a":{"b":1,"b":2}}"#.to_vec(),
            Some(b"application/json".to_vec()),
        ),
        // Shapes far beyond the usual: deep arrays, deep objects, wide
        // objects, huge numbers and hostile strings, each within the body
        // limit so it reaches the canonicaliser.
        9 => {
            let depth = rng.random_range(100..BODY_LIMIT / 2);
            let mut b = vec![b'['; depth];
            b.extend(std::iter::repeat_n(b']', depth));
            (b, Some(b"application/json".to_vec()))
        }
        10 => {
            let depth = rng.random_range(100..BODY_LIMIT / 6);
            let mut b = br#"{"model":"sim-1","x":"#.to_vec();
            for _ in 0..depth {
                b.extend_from_slice(br#"{"a":"#);
            }
            b.push(b'1');
            b.extend(std::iter::repeat_n(b'}', depth + 1));
            (b, Some(b"application/json".to_vec()))
        }
        11 => {
            let members = rng.random_range(100..1_200);
            let wide: Vec<String> = (0..members).map(|i| format!("\"k{i}\":{i}")).collect();
            (
                format!(r#"{{"model":"sim-1","w":{{{}}}}}"#, wide.join(",")).into_bytes(),
                Some(b"application/json".to_vec()),
            )
        }
        _ => {
            let digits = "9".repeat(rng.random_range(1..4_000));
            (
                format!(
                    r#"{{"model":"sim-1","n":{digits}e99999,"m":-0.{digits},"s":"\u0000\ud800\udfff\\\"{}"}}"#,
                    r"\u00e9".repeat(rng.random_range(0..500))
                )
                .into_bytes(),
                Some(b"application/json".to_vec()),
            )
        }
    }
}

fn request(rng: &mut StdRng, i: usize) -> Sent {
    let (keys, key) = key_lines(rng, i);
    let (body, content_type) = body(rng);
    let mut head =
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n".to_vec();
    let mut line = |name: &[u8], value: &[u8]| {
        head.extend_from_slice(name);
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    };
    line(b"x-api-key", CREDENTIAL.as_bytes());
    for k in &keys {
        line(b"idempotency-key", k);
    }
    match rng.random_range(0..3) {
        0 => line(b"last-event-id", &header_bytes(rng, 30)),
        1 => line(b"last-event-id", rng.random::<u64>().to_string().as_bytes()),
        _ => {}
    }
    match rng.random_range(0..4) {
        0 => line(b"prefer", &header_bytes(rng, 40)),
        1 => line(b"prefer", b"respond-async, wait=1"),
        _ => {}
    }
    match (rng.random_range(0..4), content_type) {
        (0, _) => line(b"content-type", &header_bytes(rng, 60)),
        (1, _) => line(b"content-type", b"multipart/form-data; boundary=\"\""),
        (_, Some(ct)) => line(b"content-type", &ct),
        (_, None) => {}
    }
    line(b"content-length", body.len().to_string().as_bytes());
    head.extend_from_slice(b"\r\n");
    head.extend_from_slice(&body);
    Sent { bytes: head, key }
}

/// Sends raw bytes and reads the answer until the server closes.
async fn exchange(addr: &str, bytes: &[u8]) -> Received {
    let mut conn = TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    // The server may answer (413, 400) and close before reading it all.
    let _ = conn.write_all(bytes).await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the gateway answers every request");
    let text = String::from_utf8_lossy(&out);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    Received {
        status,
        problem: head.contains("content-type: application/problem+json"),
    }
}

fn config(upstream: &str, db: &Path) -> GatewayConfig {
    GatewayConfig::from_raw(RawConfig {
        store: Some(format!("sqlite:{}", db.display())),
        shutdown_grace: Some("5s".into()),
        routes: vec![RawRoute {
            prefix: Some("/v1".into()),
            upstream: Some(upstream.into()),
            key: Some(RawKeyMode::Require),
            on_inflight: Some(RawInflightMode::Reject),
            body_limit: Some(RawSize::Bytes(BODY_LIMIT as u64)),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })
    .unwrap_or_else(|e| panic!("config: {e}"))
}

fn count(db: &rusqlite::Connection, sql: &str) -> i64 {
    db.query_row(sql, [], |row| row.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_never_crash_the_gateway_or_leave_records() {
    let sim = idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::from_millis(1),
        first_token_delay: Duration::from_millis(1),
        token_interval: Duration::ZERO,
        completion_tokens: 4,
    })
    .await
    .expect("spawn the simulator");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db_path = dir.path().join("fuzz.db");
    let gw = TestGateway::start(config(&sim.url(), &db_path)).await;
    let addr = gw.base.trim_start_matches("http://").to_owned();

    let mut rng = StdRng::seed_from_u64(SEED);
    let mut refused_keys = Vec::new();
    let (mut refused, mut answered) = (0, 0);
    for i in 0..REQUESTS {
        let sent = request(&mut rng, i);
        let got = exchange(&addr, &sent.bytes).await;
        if let Some(status) = got.status {
            assert!(status < 500, "request {i} got {status}: {got:?}");
            if got.problem {
                assert!((400..500).contains(&status), "request {i}: {got:?}");
                refused += 1;
                if let Some(key) = sent.key {
                    refused_keys.push(key);
                }
            } else {
                answered += 1;
            }
        }
    }
    // The mix really exercised both paths.
    assert!(refused >= REQUESTS / 4, "refused {refused}");
    assert!(answered >= REQUESTS / 10, "answered {answered}");
    assert!(!refused_keys.is_empty());

    // Still serving: a normal request runs once, then replays.
    let client = reqwest::Client::new();
    for expected in ["false", "true"] {
        let r = client
            .post(format!("{}/v1/chat/completions", gw.base))
            .header("idempotency-key", "after-the-fuzz")
            .header("content-type", "application/json")
            .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"still there?"}]}"#)
            .send()
            .await
            .expect("the gateway still answers");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["idempotent-replayed"], expected);
    }

    // Asynchronous executions (`Prefer: respond-async`) finish on their own.
    let db = rusqlite::Connection::open(&db_path).expect("open the store file");
    for _ in 0..200 {
        if count(&db, "SELECT count(*) FROM records WHERE done = 0") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&db, "SELECT count(*) FROM records WHERE done = 0"), 0);
    // No record for any refused request; every record is one the upstream
    // was asked for (each forwarded request had its own key).
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    for key in refused_keys {
        let id = ScopedKey::new(tenant.clone(), "/v1", key).storage_id();
        let n: i64 = db
            .query_row("SELECT count(*) FROM records WHERE id = ?1", [&id], |r| {
                r.get(0)
            })
            .expect("query the store");
        assert_eq!(n, 0, "a refused request left a record: {id}");
    }
    let records = count(&db, "SELECT count(*) FROM records");
    let forwarded = i64::try_from(sim.stats().requests).expect("a small count");
    assert_eq!(records, forwarded, "one record per forwarded request");

    gw.stop().await.expect("serve returns Ok");
}
