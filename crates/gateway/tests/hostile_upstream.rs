//! Upstreams that answer what must never be stored: a compressed answer
//! that decodes far past its size (a decompression bomb), an encoding the
//! gateway cannot decode, a `101 Switching Protocols`. Each is a broken
//! answer: on an ordinary route the key is released (the retry runs
//! again), on a charging route an `outcome-unknown` answer is kept (the
//! retry gets it, and nothing runs twice). The upstream is a raw socket
//! server writing these answers byte for byte, counting its executions.

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawKeyMode, RawRoute};
use support::TestGateway;

type Counts = Arc<Mutex<HashMap<String, usize>>>;

/// 8 MiB of zeros in about 8 KiB of gzip: a thousand to one.
fn gzip_bomb() -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 8 * 1024 * 1024]).expect("compress");
    gz.finish().expect("compress")
}

/// The answer for the last segment of the path.
fn answer(what: &str, bomb: &[u8]) -> Vec<u8> {
    let head = |status: &str, extra: &str, len: usize| {
        format!("HTTP/1.1 {status}\r\n{extra}Content-Length: {len}\r\nConnection: close\r\n\r\n")
            .into_bytes()
    };
    match what {
        "bomb" => {
            let mut out = head(
                "200 OK",
                "Content-Type: application/json\r\nContent-Encoding: gzip\r\n",
                bomb.len(),
            );
            out.extend_from_slice(bomb);
            out
        }
        "zstd" => {
            let mut out = head(
                "200 OK",
                "Content-Type: application/json\r\nContent-Encoding: zstd\r\n",
                4,
            );
            out.extend_from_slice(b"\x28\xb5\x2f\xfd");
            out
        }
        "switch" => {
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                .to_vec()
        }
        _ => {
            let mut out = head("200 OK", "Content-Type: application/json\r\n", 11);
            out.extend_from_slice(b"{\"ok\":true}");
            out
        }
    }
}

/// A raw upstream: reads one request per connection, answers by path.
async fn hostile_upstream() -> (String, Counts) {
    let counts: Counts = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    let bomb: Arc<[u8]> = gzip_bomb().into();
    let seen = Arc::clone(&counts);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (seen, bomb) = (Arc::clone(&seen), Arc::clone(&bomb));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&buf).into_owned();
                let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
                let what = path.rsplit('/').next().unwrap_or("").to_owned();
                *seen.lock().expect("not poisoned").entry(path).or_default() += 1;
                let _ = tcp.write_all(&answer(&what, &bomb)).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    (url, counts)
}

fn config(upstream: &str) -> GatewayConfig {
    let route = |prefix: &str, charges: bool| RawRoute {
        prefix: Some(prefix.into()),
        upstream: Some(upstream.into()),
        key: Some(RawKeyMode::Require),
        charges: Some(charges),
        ..RawRoute::default()
    };
    GatewayConfig::from_raw(RawConfig {
        store: Some("memory:".into()),
        shutdown_grace: Some("1s".into()),
        routes: vec![route("/v1", false), route("/pay", true)],
        ..RawConfig::default()
    })
    .unwrap_or_else(|e| panic!("config: {e}"))
}

async fn post(base: &str, path: &str, key: &str) -> (u16, Option<String>, String) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("authorization", "Bearer k")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("the gateway answers");
    let status = resp.status().as_u16();
    let replayed = idemgate_testkit::http::replayed(&resp);
    (status, replayed, resp.text().await.expect("a body"))
}

#[tokio::test]
async fn answers_that_cannot_be_stored_are_broken_answers() {
    let (upstream, counts) = hostile_upstream().await;
    let gw = TestGateway::start(config(&upstream)).await;
    for what in ["bomb", "zstd", "switch"] {
        // An ordinary route: released, so the retry runs again.
        let path = format!("/v1/{what}");
        for _ in 0..2 {
            let (status, _, body) = post(&gw.base, &path, &format!("plain-{what}")).await;
            assert_eq!(status, 502, "{what}: {body}");
            assert!(
                !body.contains("\u{0}"),
                "{what}: nothing decoded is relayed"
            );
        }
        assert_eq!(counts.lock().expect("not poisoned")[&path], 2, "{what}");

        // A charging route: kept as outcome-unknown, never run twice.
        let path = format!("/pay/{what}");
        let (status, replayed, body) = post(&gw.base, &path, &format!("pay-{what}")).await;
        assert_eq!(status, 502, "{what}: {body}");
        assert_eq!(replayed.as_deref(), Some("false"));
        assert!(body.contains("outcome-unknown"), "{what}: {body}");
        let (status, replayed, again) = post(&gw.base, &path, &format!("pay-{what}")).await;
        assert_eq!(status, 502);
        assert_eq!(replayed.as_deref(), Some("true"));
        assert_eq!(again, body);
        assert_eq!(counts.lock().expect("not poisoned")[&path], 1, "{what}");
    }
    // A normal answer still goes through and is stored.
    let (status, _, body) = post(&gw.base, "/v1/fine", "fine").await;
    assert_eq!((status, body.as_str()), (200, "{\"ok\":true}"));
    let (_, replayed, _) = post(&gw.base, "/v1/fine", "fine").await;
    assert_eq!(replayed.as_deref(), Some("true"));
    gw.stop().await.expect("a clean stop");
}
