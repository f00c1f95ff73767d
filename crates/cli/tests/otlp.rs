//! OTLP span export of a real `idemgate serve` process (cargo feature
//! `otlp`), against a small OTLP/HTTP receiver in this test: the request
//! span arrives with its idempotency key, the client's trace id and the
//! client's span as its parent, the upstream's `traceparent` names that
//! exported span as its parent (client → gateway → upstream, one trace), the
//! last batch is flushed on SIGTERM, and a collector that is down changes
//! nothing for clients.
#![cfg(feature = "otlp")]

mod support;
use support::{MEMORY_ON_ANY_PORT, read_log, sigterm, sim, spawn_quiet};

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// The trace id of [`TRACEPARENT`], and its 16 bytes as protobuf stores them.
const TRACE_ID: &str = "7d3f0c2a9b8e4f6a1c5d2e3f4a5b6c7d";
const TRACEPARENT: &str = "00-7d3f0c2a9b8e4f6a1c5d2e3f4a5b6c7d-0123456789abcdef-01";

fn trace_id_bytes() -> Vec<u8> {
    (0..TRACE_ID.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&TRACE_ID[i..i + 2], 16).expect("a hex number"))
        .collect()
}

/// The parent span id of [`TRACEPARENT`] as an OTLP `Span` stores it:
/// field 4 (`parent_span_id`, bytes: tag 0x22), length 8, the 8 bytes.
fn parent_span_id_field() -> Vec<u8> {
    let mut v = vec![0x22, 0x08];
    v.extend(0x0123_4567_89ab_cdef_u64.to_be_bytes());
    v
}

/// The trace id of [`TRACEPARENT`] as an OTLP `Span` stores it: field 1
/// (`trace_id`, bytes: tag 0x0a), length 16, the 16 bytes.
fn trace_id_field() -> Vec<u8> {
    let mut v = vec![0x0a, 0x10];
    v.extend(trace_id_bytes());
    v
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// An OTLP/HTTP receiver: records the body of every `POST /v1/traces`
/// and answers 200 with an empty (valid) export response. As an upstream,
/// it records the head of every other request and answers a small chat
/// completion.
#[derive(Clone, Default)]
struct Receiver {
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    heads: Arc<Mutex<Vec<String>>>,
    arrived: Arc<Notify>,
}

const COMPLETION: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

impl Receiver {
    async fn start() -> (Receiver, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let receiver = Receiver::default();
        let r = receiver.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(r.clone().connection(stream));
            }
        });
        (receiver, addr)
    }

    /// Serves HTTP/1.1 requests on one (keep-alive) connection.
    async fn connection(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 8192];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let request_line = head.lines().next().unwrap_or_default().to_owned();
            assert!(
                !head.contains("transfer-encoding: chunked"),
                "chunked bodies are not read here: {head}"
            );
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("a valid literal"));
            while buf.len() < head_end + len {
                let mut chunk = [0u8; 8192];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = buf[head_end..head_end + len].to_vec();
            buf.drain(..head_end + len);
            if request_line.starts_with("post /v1/traces ") {
                assert!(
                    head.contains("content-type: application/x-protobuf"),
                    "{head}"
                );
                self.bodies
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(body);
                self.arrived.notify_waiters();
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                    )
                    .await;
            } else if request_line.starts_with("post /v1/chat/completions ") {
                self.heads
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(head.clone());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{COMPLETION}",
                    COMPLETION.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            } else {
                let _ = stream
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        }
    }

    /// The `traceparent` of each upstream request received so far.
    fn traceparents(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|h| {
                h.lines()
                    .find_map(|l| l.strip_prefix("traceparent:"))
                    .map(|v| v.trim().to_owned())
            })
            .collect()
    }

    /// Every body received so far, concatenated.
    fn received(&self) -> Vec<u8> {
        self.bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .concat()
    }

    /// Waits until the received bodies contain `needle`.
    async fn wait_for(&self, needle: &[u8]) -> Vec<u8> {
        let wait = async {
            loop {
                let arrived = self.arrived.notified();
                let all = self.received();
                if contains(&all, needle) {
                    return all;
                }
                // Bounded: a lost wake-up only costs one poll interval.
                let _ = tokio::time::timeout(Duration::from_millis(200), arrived).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("no exported span contains {needle:?}"))
    }
}

/// A running gateway and the thread collecting its log.
struct Gateway {
    child: Child,
    listen: String,
    log: std::thread::JoinHandle<String>,
}

impl Gateway {
    /// A gateway in front of `upstream` exporting its spans to `endpoint`
    /// (`--otlp-endpoint`), a batch every `delay_ms` milliseconds.
    async fn exporting_to(upstream: &str, endpoint: &str, delay_ms: &str) -> Gateway {
        Self::start(
            upstream,
            &["--otlp-endpoint", endpoint],
            &[("OTEL_BSP_SCHEDULE_DELAY", delay_ms)],
        )
        .await
    }

    async fn start(upstream: &str, extra_args: &[&str], env: &[(&str, &str)]) -> Gateway {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--upstream", upstream])
            .args(MEMORY_ON_ANY_PORT)
            .args(extra_args)
            .env_remove("IDEMGATE_LOG")
            .env_remove("RUST_LOG");
        for var in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SERVICE_NAME",
            "OTEL_BSP_SCHEDULE_DELAY",
        ] {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = spawn_quiet(&mut cmd, Stdio::piped());
        let (started, log) = read_log(&mut child).await;
        let pat = "\"listen\":\"";
        let at = started.find(pat).unwrap_or_else(|| panic!("{started}")) + pat.len();
        let len = started[at..]
            .find('"')
            .unwrap_or_else(|| panic!("{started}"));
        Gateway {
            child,
            listen: started[at..at + len].to_owned(),
            log,
        }
    }

    /// A keyed chat completion through the gateway; returns its status.
    async fn keyed(&self, key: &str) -> u16 {
        let r = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", self.listen))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .header("traceparent", TRACEPARENT)
            .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"hello"}]}"#)
            .send()
            .await
            .expect("send the request");
        let status = r.status().as_u16();
        let _ = r.bytes().await.expect("read the response body");
        status
    }

    /// SIGTERM, then the exit status and the whole log.
    async fn stop(mut self) -> (std::process::ExitStatus, String) {
        sigterm(&self.child).await;
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("gateway did not exit after SIGTERM"))
            .expect("wait for the process");
        let log = tokio::task::spawn_blocking(move || self.log.join())
            .await
            .expect("the blocking task did not panic")
            .unwrap_or_else(|_| panic!("log reader panicked"));
        (status, log)
    }
}

#[tokio::test]
async fn request_span_is_exported_with_key_and_client_trace_id() {
    let (receiver, addr) = Receiver::start().await;
    let sim = sim().await;
    let gw = Gateway::exporting_to(&sim.url(), &format!("http://{addr}/"), "100").await;
    let key = "otlp-key-5b1d9e";
    assert_eq!(gw.keyed(key).await, 200);
    let body = receiver.wait_for(key.as_bytes()).await;
    assert!(contains(&body, b"idempotency_key"));
    assert!(contains(&body, b"idempotency"), "span name");
    assert!(contains(&body, b"service.name"));
    assert!(contains(&body, b"idemgate"));
    // The exported span is in the client's trace, a child of its span.
    assert!(contains(&body, &trace_id_field()), "trace id {TRACE_ID}");
    assert!(
        contains(&body, &parent_span_id_field()),
        "parent span id of {TRACEPARENT}"
    );
    // Logs keep working beside the export.
    let (status, log) = gw.stop().await;
    assert!(status.success(), "exit {status:?}: {log}");
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("\"idempotency_key\":\"{key}\""))),
        "{log}"
    );
}

/// The span id of a `traceparent` (its third field), as 8 bytes.
fn parent_id_bytes(traceparent: &str) -> Vec<u8> {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_eq!(fields[2].len(), 16, "{traceparent}");
    (0..16)
        .step_by(2)
        .map(|i| u8::from_str_radix(&fields[2][i..i + 2], 16).expect("a hex number"))
        .collect()
}

#[tokio::test]
async fn upstream_call_is_a_child_of_the_exported_gateway_span() {
    let (collector, collector_addr) = Receiver::start().await;
    let (upstream, upstream_addr) = Receiver::start().await;
    let (upstream_url, collector_url) = (
        format!("http://{upstream_addr}"),
        format!("http://{collector_addr}"),
    );
    let gw = Gateway::exporting_to(&upstream_url, &collector_url, "100").await;
    let key = "otlp-child-key-8e2a";
    assert_eq!(gw.keyed(key).await, 200);
    let sent = upstream.traceparents();
    assert_eq!(sent.len(), 1, "one upstream call: {sent:?}");
    let forwarded = &sent[0];
    // Same trace as the caller's, a new parent: the gateway's span.
    assert!(
        forwarded.starts_with(&format!("00-{TRACE_ID}-")),
        "{forwarded}"
    );
    assert_ne!(
        forwarded, TRACEPARENT,
        "the caller's span is not the parent"
    );
    // The exported request span has that id as its own (OTLP `Span` field
    // 2, `span_id`: tag 0x12, length 8) and the caller's span as parent.
    let mut span_id_field = vec![0x12, 0x08];
    span_id_field.extend(parent_id_bytes(forwarded));
    let body = collector.wait_for(&span_id_field).await;
    assert!(contains(&body, key.as_bytes()));
    assert!(contains(&body, &trace_id_field()));
    assert!(contains(&body, &parent_span_id_field()));
    // A replay calls no upstream.
    assert_eq!(gw.keyed(key).await, 200);
    assert_eq!(upstream.traceparents().len(), 1);
    let (status, log) = gw.stop().await;
    assert!(status.success(), "exit {status:?}: {log}");
}

#[tokio::test]
async fn environment_endpoint_and_last_batch_flushed_on_sigterm() {
    let (receiver, addr) = Receiver::start().await;
    let sim = sim().await;
    // The batch delay is far longer than the test: the span can only
    // arrive through the flush at shutdown.
    let gw = Gateway::start(
        &sim.url(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    )
    .await;
    let key = "otlp-key-flush-41c7";
    assert_eq!(gw.keyed(key).await, 200);
    assert_eq!(gw.keyed(key).await, 200, "replayed");
    let (status, log) = gw.stop().await;
    assert!(status.success(), "exit {status:?}: {log}");
    let body = receiver.received();
    assert!(contains(&body, key.as_bytes()), "span not flushed: {log}");
    assert!(contains(&body, b"idempotency_key"));
}

#[tokio::test]
async fn collector_down_changes_nothing_for_clients() {
    // A port that was just closed: every export is refused.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        l.local_addr().expect("a bound listener has an address")
    };
    let sim = sim().await;
    let gw = Gateway::exporting_to(&sim.url(), &format!("http://{closed}"), "50").await;
    for i in 0..20 {
        let key = format!("otlp-down-{i}");
        assert_eq!(gw.keyed(&key).await, 200);
        assert_eq!(gw.keyed(&key).await, 200, "replayed");
        assert_eq!(sim.executions_for(&key), 1);
        // Let batches be attempted (and fail) between requests.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, log) = gw.stop().await;
    assert!(status.success(), "exit {status:?}: {log}");
    assert!(!log.contains("panicked"), "{log}");
    // The failed exports were logged (by the exporter, as warnings).
    assert!(
        log.lines().any(|l| l.contains("\"target\":\"opentelemetry")
            && (l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))),
        "{log}"
    );
}
