//! Real servers on 127.0.0.1:0, in this process: the simulated LLM, the
//! gateway (the gateway crate's own `TestGateway`, feature `test-util`), a
//! scripted upstream for headers the simulator does not send, a TCP relay
//! that cuts a connection mid-stream, and a raw HTTP/1.1 server that writes
//! whatever bytes a hostile test needs.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate_client::Event;
use idemgate_gateway::config::{RawInflightMode, RawRoute};
pub(crate) use idemgate_gateway::test_util::TestGateway;
use idemgate_llm_sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The simulated LLM with its default pacing.
pub(crate) async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process")
}

/// A gateway on the memory store with one `/v1` route to `upstream`:
/// keys optional, `on_inflight` as given, generous upstream timeouts.
pub(crate) async fn gateway(
    upstream: &str,
    on_inflight: RawInflightMode,
    tweak: impl FnOnce(&mut RawRoute),
) -> TestGateway {
    TestGateway::builder(upstream)
        .store("memory:")
        .on_inflight(on_inflight)
        .route(tweak)
        .start()
        .await
}

/// The simulated LLM and a plain [`gateway`] to it with `on_inflight`.
pub(crate) async fn sim_behind_gateway(on_inflight: RawInflightMode) -> (SimHandle, TestGateway) {
    let sim = sim().await;
    let gw = gateway(&sim.url(), on_inflight, |_| {}).await;
    (sim, gw)
}

/// Asserts that the simulator ran the work of `key` `executions` times,
/// then stops the gateway, which must end without error.
pub(crate) async fn executed_then_stop(
    sim: &SimHandle,
    key: &str,
    executions: u64,
    gw: TestGateway,
) {
    assert_eq!(sim.executions_for(key), executions);
    gw.stop().await.expect("the gateway ended without error");
}

/// An OpenAI chat request body.
pub(crate) fn chat(stream: bool, text: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "sim-gpt-small",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
}

/// A chat request about `text` through `client`, streamed when `stream`.
pub(crate) fn chat_to(
    client: &idemgate_client::Client,
    stream: bool,
    text: &str,
) -> idemgate_client::RequestBuilder {
    client
        .post("/v1/chat/completions")
        .json(&chat(stream, text))
}

/// The numbers of `events`' ids, in order: the gateway's `RUN-N` or a bare
/// number (panics on an event without one).
pub(crate) fn ids(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            e.id.as_deref()
                .map(|id| id.rsplit('-').next().unwrap_or(id))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("event without a numeric id: {e:?}"))
        })
        .collect()
}

/// Opens a streamed chat about `text` through `client`, the simulator
/// told to send `tokens` tokens `interval_ms` apart.
pub(crate) async fn paced_stream(
    client: &idemgate_client::Client,
    text: &str,
    tokens: &str,
    interval_ms: &str,
) -> idemgate_client::EventStream {
    client
        .post("/v1/chat/completions")
        .header("x-sim-tokens", tokens)
        .header("x-sim-token-interval-ms", interval_ms)
        .json(&chat(true, text))
        .send_stream()
        .await
        .expect("the stream opens")
}

/// Reads a stream to its end; panics on an error.
pub(crate) async fn drain(stream: &mut idemgate_client::EventStream) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(event) = stream.next().await {
        out.push(event.unwrap_or_else(|e| panic!("stream failed: {e}")));
    }
    out
}

// --------------------------------------------------------------------------
// A scripted upstream.

/// One canned answer.
#[derive(Clone, Debug)]
pub(crate) struct Canned {
    /// Status.
    pub(crate) status: u16,
    /// Headers.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// JSON body.
    pub(crate) body: String,
}

impl Canned {
    /// `status` with `headers` and a small JSON error body.
    pub(crate) fn error(status: u16, headers: &[(&'static str, &str)]) -> Self {
        Self {
            status,
            headers: headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            body: format!(r#"{{"error":{{"message":"scripted {status}"}}}}"#),
        }
    }

    /// A 200 chat completion.
    pub(crate) fn ok() -> Self {
        Self {
            status: 200,
            headers: Vec::new(),
            body: r#"{"id":"chatcmpl-scripted","object":"chat.completion","choices":[]}"#
                .to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct Script {
    answers: Mutex<VecDeque<Canned>>,
    /// The `Idempotency-Key` of every request received ("" if none).
    keys: Mutex<Vec<String>>,
}

/// A real HTTP server that answers from a script, in order (the last
/// answer repeats), and records the key of each request.
pub(crate) struct Scripted {
    /// `http://ADDR`.
    pub(crate) url: String,
    script: Arc<Script>,
    task: JoinHandle<()>,
}

impl Scripted {
    /// Starts it on a free loopback port.
    pub(crate) async fn start(answers: Vec<Canned>) -> Self {
        let script = Arc::new(Script {
            answers: Mutex::new(answers.into()),
            keys: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&script));
        let (listener, url) = idemgate_gateway::test_util::loopback().await;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, script, task }
    }

    /// The key of every request received so far.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.script
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(script): State<Arc<Script>>, headers: HeaderMap, _body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    script
        .keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(key);
    let canned = {
        let mut answers = script
            .answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answers.len() > 1 {
            answers.pop_front()
        } else {
            answers.front().cloned()
        }
    };
    let Some(canned) = canned else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut out = HeaderMap::new();
    out.insert("content-type", HeaderValue::from_static("application/json"));
    for (k, v) in &canned.headers {
        out.insert(
            HeaderName::from_static(k),
            HeaderValue::from_str(v).expect("valid JSON"),
        );
    }
    let status = StatusCode::from_u16(canned.status).expect("a valid status");
    (status, out, canned.body).into_response()
}

// --------------------------------------------------------------------------
// A relay that cuts.

/// A TCP relay to `target`. The first connection is cut (both sides
/// closed) once `cut_after` bytes have gone back to the client; later
/// connections pass untouched. Returns `http://ADDR` and the number of
/// connections accepted.
pub(crate) async fn cutting_relay(
    target: SocketAddr,
    cut_after: usize,
) -> (String, Arc<AtomicUsize>) {
    let (listener, url) = idemgate_gateway::test_util::loopback().await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let limit = (n == 0).then_some(cut_after);
            tokio::spawn(relay(client, target, limit));
        }
    });
    (url, accepted)
}

async fn relay(client: TcpStream, target: SocketAddr, limit: Option<usize>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = tokio::io::copy(&mut client_rx, &mut server_tx);
    let down = async {
        let mut sent = 0usize;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let n = match limit {
                Some(limit) if sent + n >= limit => {
                    let _ = client_tx.write_all(&buf[..limit - sent]).await;
                    return;
                }
                _ => n,
            };
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
            sent += n;
        }
    };
    // Whichever direction ends first ends the connection: both sockets
    // are dropped here, which is the cut.
    tokio::select! {
        _ = up => {}
        () = down => {}
    }
}

// --------------------------------------------------------------------------
// A raw, hostile HTTP/1.1 server.

/// What a [`RawServer`] writes for one request.
pub(crate) enum Reply {
    /// These bytes, then the connection is closed.
    Bytes(Vec<u8>),
    /// This head, then 64 KiB chunks of a chunked body for as long as the
    /// client reads.
    Endless(String),
}

impl Reply {
    /// `status` with `headers`, the body `body` (with its length), and
    /// `connection: close`.
    pub(crate) fn answer(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Self {
        let mut out = format!("HTTP/1.1 {status} Status\r\n").into_bytes();
        for (k, v) in headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(
            format!(
                "content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(body);
        Self::Bytes(out)
    }

    /// A 200 JSON chat completion.
    pub(crate) fn ok() -> Self {
        Self::answer(
            200,
            &[("content-type", "application/json")],
            br#"{"id":"chatcmpl-raw","object":"chat.completion","choices":[]}"#,
        )
    }
}

/// A real HTTP/1.1 server on a free loopback port that answers request
/// number `n` (0-based) with `reply(n, head)` and records every request
/// head, as received.
pub(crate) struct RawServer {
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// Its port.
    pub(crate) port: u16,
    heads: Arc<Mutex<Vec<String>>>,
    /// Body bytes written by [`Reply::Endless`] answers.
    written: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

type ReplyFn = dyn Fn(usize, &str) -> Reply + Send + Sync;

impl RawServer {
    /// Starts it.
    pub(crate) async fn start(
        reply: impl Fn(usize, &str) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener
            .local_addr()
            .expect("a bound listener has an address")
            .port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicUsize::new(0));
        let reply: Arc<ReplyFn> = Arc::new(reply);
        let (h, w) = (Arc::clone(&heads), Arc::clone(&written));
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(raw_connection(
                    conn,
                    Arc::clone(&reply),
                    Arc::clone(&h),
                    Arc::clone(&w),
                ));
            }
        });
        Self {
            url: format!("http://127.0.0.1:{port}"),
            port,
            heads,
            written,
            task,
        }
    }

    /// Every request head received so far (request line and headers).
    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Body bytes written so far by endless answers.
    pub(crate) fn written(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request per connection: read its head and body, record the head,
/// write the reply, close.
async fn raw_connection(
    mut conn: TcpStream,
    reply: Arc<ReplyFn>,
    heads: Arc<Mutex<Vec<String>>>,
    written: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = buf.len() - head_end;
    while body < length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body += n,
        }
    }
    let n = {
        let mut heads = heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        heads.push(head.clone());
        heads.len() - 1
    };
    match reply(n, &head) {
        Reply::Bytes(bytes) => {
            let _ = conn.write_all(&bytes).await;
            let _ = conn.shutdown().await;
        }
        Reply::Endless(head) => {
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut piece = b"10000\r\n".to_vec();
            piece.extend(std::iter::repeat_n(b'x', 0x10000));
            piece.extend_from_slice(b"\r\n");
            while conn.write_all(&piece).await.is_ok() {
                written.fetch_add(0x10000, Ordering::SeqCst);
            }
        }
    }
}
