//! Connections that attack: over raw sockets against a running gateway,
//! while a well-behaved client keeps sending keyed requests.
//!
//! The suite sends slowloris heads and slow bodies, 100,000 header fields
//! and one 1 MiB header, chunked bodies with absurd chunk sizes, pipelined
//! floods (read and unread), invalid UTF-8 and control bytes in header
//! values, HTTP/1.0 and `Expect: 100-continue`, TLS bytes on the plain
//! port, and thousands of idle connections. Every attack must cost its
//! own connection only: the well-behaved client's requests are each
//! answered, executed upstream exactly once and replayed after, and each
//! within [`GOOD_CLIENT_BOUND`] (a liveness bound: a stalled gateway
//! fails it, a slow machine does not come near it). Every limit that
//! fired is counted in `idemgate_connection_limits_total`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use idemgate_gateway::config::{RawConfig, RawConnections};
use idemgate_llm_sim::SimHandle;
use idemgate_testkit::http::replayed;
use support::TestGateway;
use tokio::net::TcpStream;

/// How long any one request of the well-behaved client may take, attacks
/// or not.
const GOOD_CLIENT_BOUND: Duration = Duration::from_secs(10);

/// The limits under test, short so the suite runs in seconds.
fn limits() -> RawConnections {
    RawConnections {
        header_read_timeout: Some("2s".into()),
        body_idle_timeout: Some("1s".into()),
        body_read_timeout: Some("3s".into()),
        send_timeout: Some("2s".into()),
        ..RawConnections::default()
    }
}

async fn gateway(sim: &SimHandle, connections: RawConnections) -> TestGateway {
    TestGateway::builder(&sim.url())
        .store("memory:")
        .route(|r| r.body_limit = Some(idemgate_gateway::config::RawSize::Bytes(64 * 1024)))
        .config(|c: &mut RawConfig| c.connections = Some(connections))
        .start()
        .await
}

fn addr(gw: &TestGateway) -> String {
    gw.base.trim_start_matches("http://").to_owned()
}

const CHAT: &str = r#"{"model":"sim-1","messages":[{"role":"user","content":"hi"}]}"#;

/// Writes `bytes` (ignoring a write the server refused by closing), then
/// reads until the server closes or `within` passes; returns what arrived.
async fn exchange(addr: &str, bytes: &[u8], within: Duration) -> Vec<u8> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let _ = tcp.write_all(bytes).await;
    read_until_closed(&mut tcp, within).await
}

/// Reads until EOF, a reset, or `within`.
async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    got
}

/// The status of the first answer in `bytes`.
fn status(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().next()?;
    line.split(' ').nth(1)?.parse().ok()
}

/// Whether the server closed `tcp` within `within` (EOF or reset).
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The well-behaved client: keyed requests one after the other until
/// `stop`; each executed once, then replayed. Returns how many it ran.
async fn good_client(gw: &TestGateway, sim: &SimHandle, stop: Arc<AtomicBool>) -> usize {
    let client = reqwest::Client::builder()
        .timeout(GOOD_CLIENT_BOUND)
        .build()
        .expect("a client");
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) || done < 5 {
        let key = format!("good-{done}");
        for attempt in ["false", "true"] {
            let r = client
                .post(format!("{}/v1/chat/completions", gw.base))
                .header("authorization", "Bearer good")
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .body(CHAT)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{key}: not answered within the bound: {e}"));
            assert_eq!(r.status(), 200, "{key}");
            assert_eq!(replayed(&r).as_deref(), Some(attempt), "{key}");
            r.bytes().await.expect("read the answer");
        }
        assert_eq!(sim.executions_for(&key), 1, "{key} ran more than once");
        done += 1;
    }
    done
}

/// The value of `idemgate_connection_limits_total{limit="…"}`.
fn limit_count(metrics: &str, limit: &str) -> f64 {
    let prefix = format!("idemgate_connection_limits_total{{limit=\"{limit}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn slowloris_heads(addr: String) {
    // A head byte every 300 ms: never done, never idle for long.
    let mut tasks = Vec::new();
    for i in 0..50 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut tcp = TcpStream::connect(&addr).await.expect("connect");
            let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow-{i}: ");
            let mut got = Vec::new();
            for b in head.bytes().chain(std::iter::repeat(b'a')) {
                if tcp.write_all(&[b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                let read =
                    tokio::time::timeout(Duration::from_millis(1), tcp.read_buf(&mut got)).await;
                if matches!(read, Ok(Ok(0))) {
                    break;
                }
            }
            got.extend(read_until_closed(&mut tcp, Duration::from_secs(1)).await);
            assert_eq!(
                status(&got),
                Some(408),
                "a slow head gets 408: {:?}",
                String::from_utf8_lossy(&got)
            );
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("the server closes a slow head")
            .expect("the task did not panic");
    }
}

async fn slow_bodies(addr: String) {
    // Stalled after the head (idle clock), and trickling (total clock).
    for trickle in [false, true] {
        let mut tcp = TcpStream::connect(&addr).await.expect("connect");
        let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow\r\n\
                    Idempotency-Key: slow-body\r\nContent-Type: application/json\r\n\
                    Content-Length: 1000\r\n\r\n{";
        tcp.write_all(head.as_bytes()).await.expect("send the head");
        let got = if trickle {
            let mut got = Vec::new();
            for _ in 0..100 {
                if tcp.write_all(b" ").await.is_err() {
                    break;
                }
                match tokio::time::timeout(Duration::from_millis(500), tcp.read_buf(&mut got)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) if got.windows(4).any(|w| w == b"\r\n\r\n") => break,
                    _ => {}
                }
            }
            got.extend(read_until_closed(&mut tcp, Duration::from_secs(2)).await);
            got
        } else {
            read_until_closed(&mut tcp, Duration::from_secs(10)).await
        };
        assert_eq!(
            status(&got),
            Some(408),
            "trickle={trickle}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(String::from_utf8_lossy(&got).contains("request-body-timeout"));
    }
}

async fn huge_heads(addr: String) {
    let mut many = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    for i in 0..100_000 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let one_mib = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(1024 * 1024)
    );
    for request in [many, one_mib] {
        let got = exchange(&addr, request.as_bytes(), Duration::from_secs(10)).await;
        // 431, unless the reset of the unread rest overtook it.
        assert!(
            got.is_empty() || status(&got) == Some(431),
            "{:?}",
            String::from_utf8_lossy(&got[..got.len().min(200)])
        );
    }
}

async fn absurd_chunks(addr: String) {
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer c\r\n\
                Idempotency-Key: chunks\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    let bodies: [&[u8]; 4] = [
        // Larger than u64.
        b"FFFFFFFFFFFFFFFFFFFFFFFF\r\nx\r\n0\r\n\r\n",
        // Huge but representable, then more than the body limit.
        b"7FFFFFFFFFFF\r\n",
        // Not a number.
        b"zz\r\nx\r\n0\r\n\r\n",
        // A chunk-size line that never ends.
        b"1;ext=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ];
    for (i, body) in bodies.into_iter().enumerate() {
        let mut request = head.as_bytes().to_vec();
        request.extend_from_slice(body);
        if i == 1 {
            request.extend(std::iter::repeat_n(b'a', 100 * 1024));
        }
        let got = exchange(&addr, &request, Duration::from_secs(10)).await;
        let s = status(&got);
        assert!(
            got.is_empty() || matches!(s, Some(400 | 408 | 413)),
            "chunks #{i}: {:?}",
            String::from_utf8_lossy(&got[..got.len().min(300)])
        );
    }
}

async fn pipelined_floods(addr: String, admin: String) {
    // Read: a thousand requests in one write, a thousand answers back.
    let one = "GET /unrouted HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(one.repeat(1000).as_bytes())
        .await
        .expect("send the flood");
    let mut got = Vec::new();
    let answers = |got: &[u8]| got.windows(12).filter(|w| w == b"HTTP/1.1 404").count();
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 64 * 1024];
        while answers(&got) < 1000 {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert_eq!(answers(&got), 1000, "every pipelined request is answered");

    // Unread: the answers pile up until the send clock closes the
    // connection.
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    let flood = one.repeat(60_000);
    let writer = tokio::spawn(async move {
        let _ = tcp.write_all(flood.as_bytes()).await;
        tcp
    });
    let tcp = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the server keeps reading until its writes stall")
        .expect("the writer did not panic");
    // Still reading nothing: past the send timeout the server gives up on
    // this connection (counted as `send_time`, checked by the caller). On
    // a busy machine the server may still be answering the flood for a
    // while before its writes stall, so wait for the count rather than a
    // fixed time: dropping the socket first would end the connection on a
    // reset instead.
    let client = reqwest::Client::new();
    let counted = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let r = client.get(format!("{admin}/metrics")).send().await;
            if let Ok(r) = r
                && let Ok(text) = r.text().await
                && limit_count(&text, "send_time") >= 1.0
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "the server kept a client that reads nothing"
    );
    drop(tcp);
}

async fn bad_header_bytes(addr: String) {
    let names = [
        "Idempotency-Key",
        "Authorization",
        "Content-Type",
        "Prefer",
        "Last-Event-ID",
        "x-api-key",
        "traceparent",
        "Host",
        "X-Anything",
    ];
    let values: [&[u8]; 5] = [b"\xff\xfe\x80", b"caf\xc3", b"a\x01b", b"a\x7fb", b"a\x00b"];
    for name in names {
        for value in values {
            let mut request =
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer u\r\n"
                    .to_vec();
            request.extend_from_slice(name.as_bytes());
            request.extend_from_slice(b": ");
            request.extend_from_slice(value);
            request.extend_from_slice(
                format!(
                    "\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{CHAT}",
                    CHAT.len()
                )
                .as_bytes(),
            );
            let got = exchange(&addr, &request, Duration::from_secs(10)).await;
            let s = status(&got).unwrap_or_else(|| {
                panic!(
                    "{name}: {value:?}: no answer: {:?}",
                    String::from_utf8_lossy(&got)
                )
            });
            assert!(
                (200..500).contains(&s),
                "{name}: {value:?}: {s}: {}",
                String::from_utf8_lossy(&got)
            );
            if name == "Idempotency-Key" {
                assert_eq!(s, 400, "a key that is not printable ASCII is refused");
            }
        }
    }
}

async fn old_protocols(addr: String, sim: Arc<SimHandle>) {
    let http10 = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer o\r\n\
         Idempotency-Key: http10\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    let got = exchange(&addr, http10.as_bytes(), Duration::from_secs(10)).await;
    assert_eq!(status(&got), Some(200), "{}", String::from_utf8_lossy(&got));
    assert_eq!(sim.executions_for("http10"), 1);

    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer o\r\n\
         Idempotency-Key: expect\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\nConnection: close\r\n\r\n",
        CHAT.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("send the head");
    let mut first = vec![0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut first))
        .await
        .expect("an interim answer")
        .expect("read it");
    assert!(
        first.starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
    tcp.write_all(CHAT.as_bytes()).await.expect("send the body");
    let rest = read_until_closed(&mut tcp, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("HTTP/1.1 200"), "{text}");
    assert_eq!(sim.executions_for("expect"), 1);
}

async fn tls_on_the_plain_port(addr: String) {
    // The start of a TLS 1.2/1.3 ClientHello, then random-looking bytes.
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    hello.extend((0..500u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
    let got = exchange(&addr, &hello, Duration::from_secs(10)).await;
    assert!(
        got.is_empty() || status(&got) == Some(400),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

async fn idle_connections(addr: String, n: usize) {
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // Each is closed by the header clock, silently: nothing was sent.
    for mut tcp in idle {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "an idle connection is closed without an answer: {read:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_cost_their_own_connection_only() {
    let sim = Arc::new(support::quick_sim().await);
    let gw = gateway(&sim, limits()).await;
    let a = addr(&gw);
    let stop = Arc::new(AtomicBool::new(false));

    let attacks = {
        let (a, admin) = (a.clone(), gw.admin.clone());
        let sim = Arc::clone(&sim);
        tokio::spawn(async move {
            tokio::join!(
                slowloris_heads(a.clone()),
                slow_bodies(a.clone()),
                huge_heads(a.clone()),
                absurd_chunks(a.clone()),
                pipelined_floods(a.clone(), admin),
                bad_header_bytes(a.clone()),
                old_protocols(a.clone(), sim),
                tls_on_the_plain_port(a.clone()),
                idle_connections(a.clone(), 2000),
            );
        })
    };
    let good = {
        let stop = Arc::clone(&stop);
        async { good_client(&gw, &sim, stop).await }
    };
    let (ran, attacked) = tokio::join!(good, async {
        let r = attacks.await;
        stop.store(true, Ordering::Relaxed);
        r
    });
    attacked.expect("every attack was met as expected");
    assert!(ran >= 5, "the well-behaved client ran {ran} operations");

    let metrics = support::metrics(&gw, &reqwest::Client::new()).await;
    for limit in [
        "header_read_time",
        "header_size",
        "body_idle_time",
        "body_read_time",
        "send_time",
    ] {
        assert!(
            limit_count(&metrics, limit) >= 1.0,
            "{limit} not counted:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("connection"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    gw.stop().await.expect("the gateway stops cleanly");
}

#[tokio::test]
async fn connections_over_the_limit_get_503_until_others_close() {
    let sim = support::quick_sim().await;
    let gw = gateway(
        &sim,
        RawConnections {
            max: Some(20),
            ..limits()
        },
    )
    .await;
    let a = addr(&gw);
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(TcpStream::connect(&a).await.expect("connect"));
    }
    // Give the loop time to accept all twenty before the next one.
    let client = reqwest::Client::new();
    let mut refused = None;
    for _ in 0..50 {
        let got = exchange(
            &a,
            b"GET /unrouted HTTP/1.1\r\nHost: x\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        if status(&got) == Some(503) {
            refused = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refused.expect("a connection over the limit gets 503");
    let text = String::from_utf8_lossy(&refused).to_ascii_lowercase();
    assert!(text.contains("retry-after: 1"), "{text}");
    // The header clock closes the idle ones; then connections are served.
    for tcp in &mut held {
        assert!(closed_within(tcp, Duration::from_secs(20)).await);
    }
    let r = client
        .post(format!("{}/v1/chat/completions", gw.base))
        .header("authorization", "Bearer k")
        .header("content-type", "application/json")
        .header("idempotency-key", "after")
        .body(CHAT)
        .send()
        .await
        .expect("served again once the idle connections closed");
    assert_eq!(r.status(), 200);
    let metrics = support::metrics(&gw, &client).await;
    assert!(limit_count(&metrics, "connections") >= 1.0, "{metrics}");
    gw.stop().await.expect("the gateway stops cleanly");
}
