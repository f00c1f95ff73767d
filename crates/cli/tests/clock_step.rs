//! A wall-clock step does not expire a live lease: `idemgate serve` on its
//! embedded SQLite store runs under libfaketime, whose offset the test
//! moves forward by an hour while a generation is in flight (an NTP
//! correction, a VM resumed). The duplicate that arrives after the step
//! still finds the key in flight (409), the upstream runs once, and the
//! answer is stored and replayed.
//!
//! The response `Date` header shows the gateway's wall clock really moved.
//! Needs Debian's `faketime` (scripts/setup.sh installs it); under
//! `CI=true` its absence fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use idemgate_testkit::require;
use tokio::process::Command;

mod support;
use support::{free_port, sim, spawn_quiet, wait_admin};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

async fn send(port: u16, key: &str, latency_ms: u64) -> reqwest::Response {
    let body = serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": "a long generation"}],
    });
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        .header("x-sim-latency-ms", latency_ms.to_string())
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// Seconds between the response's `Date` and this process's wall clock.
fn date_skew(r: &reqwest::Response) -> i64 {
    let date = r.headers()["date"].to_str().unwrap();
    let at = httpdate::parse_http_date(date).unwrap();
    let secs = |t: SystemTime| {
        i64::try_from(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()).unwrap()
    };
    secs(at) - secs(SystemTime::now())
}

fn set_offset(file: &Path, offset: &str) {
    std::fs::write(file, offset).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_wall_clock_step_does_not_expire_a_live_lease() {
    require("libfaketime", Path::new(LIBFAKETIME).exists());
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    set_offset(&offset, "+0");
    let (port, admin) = (free_port().await, free_port().await);
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
store = "sqlite:{db}"
[[routes]]
prefix = "/v1"
upstream = "{upstream}"
key = "require"
on_inflight = "reject"
pending_ttl = "6s"
timeouts = {{ connect = "1s", first_byte = "20s", idle = "10s", total = "30s" }}
"#,
            db = dir.path().join("idemgate.db").display(),
            upstream = sim.url(),
        ),
    )
    .unwrap();
    let mut gw = spawn_quiet(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&config)
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &offset)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        Stdio::null(),
    );
    wait_admin(admin, "/readyz", &mut gw).await;

    let key = format!("step-{:08x}", rand::random::<u32>());
    let first = tokio::spawn({
        let key = key.clone();
        async move { send(port, &key, 4000).await }
    });
    for _ in 0..200 {
        if sim.executions_for(&key) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sim.executions_for(&key), 1, "the generation started");

    // The gateway's wall clock jumps an hour ahead, far past the lease.
    set_offset(&offset, "+1h");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let duplicate = send(port, &key, 4000).await;
    let skew = date_skew(&duplicate);
    assert!(
        (3500..=3700).contains(&skew),
        "the gateway's clock did not move: skew {skew} s"
    );
    assert_eq!(
        duplicate.status(),
        409,
        "the live lease expired with the wall clock: the duplicate took the key"
    );
    assert_eq!(sim.executions_for(&key), 1);

    let first = first.await.unwrap();
    assert_eq!(first.status(), 200);
    let body = first.bytes().await.unwrap();
    let retry = send(port, &key, 4000).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.bytes().await.unwrap(), body);
    assert_eq!(sim.executions_for(&key), 1, "the upstream ran once");
    gw.kill().await.unwrap();
}
