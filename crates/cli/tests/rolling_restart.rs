//! A rolling restart never charges twice: real `idemgate serve` processes
//! on one SQLite file, the simulated upstream in this process.
//!
//! A SIGTERM with a short `shutdown_grace` arrives while the upstream is
//! mid-answer (a JSON generation, or a stream between two events). On a
//! `charges = true` route the request was sent, so its outcome is unknown:
//! the key is kept as `outcome-unknown` (a stream: the events it relayed,
//! then an `outcome-unknown` error event), and the retry sent to the
//! restarted gateway gets that answer replayed; the upstream ran once.
//! On a route without `charges` the key is released, and the retry runs
//! again (twice upstream), as documented.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use tokio::process::{Child, Command};

mod support;
use support::{free_port, route_toml, sim, spawn_quiet, wait_admin};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// One gateway with a charging route `/charged` and a plain one `/plain`.
struct Gw {
    child: Child,
    port: u16,
}

impl Gw {
    async fn start(dir: &Path, upstream: &str) -> Self {
        let (port, admin) = (free_port().await, free_port().await);
        let route = |name: &str, charges: bool| {
            route_toml(
                name,
                upstream,
                &format!(
                    r#"on_inflight = "wait"
charges = {charges}
timeouts = {{ connect = "1s", first_byte = "30s", idle = "30s", total = "60s" }}
"#
                ),
            )
        };
        let file = dir.join(format!("gateway-{port}.toml"));
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nstore = \"sqlite:{}\"\nshutdown_grace = \"1s\"\n{}{}",
                dir.join("keys.db").display(),
                route("charged", true),
                route("plain", false),
            ),
        )
        .unwrap();
        let log = dir.join(format!("stderr-{port}.log"));
        let mut child = spawn_quiet(
            Command::new(BIN)
                .args(["serve", "--config"])
                .arg(&file)
                .current_dir(dir),
            std::fs::File::create(&log).unwrap(),
        );
        wait_admin(admin, "/healthz", &mut child).await;
        Self { child, port }
    }

    fn url(&self, route: &str) -> String {
        format!("http://127.0.0.1:{}/{route}/v1/chat/completions", self.port)
    }

    /// SIGTERM, then waits for the process to exit.
    async fn terminate(mut self) {
        let pid = self.child.id().unwrap().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the gateway exits after SIGTERM")
            .unwrap();
    }
}

fn request(url: &str, key: &str, stream: bool) -> reqwest::RequestBuilder {
    let body = serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": format!("charge {key}")}],
    });
    let req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        .timeout(Duration::from_secs(60))
        .body(body.to_string());
    if stream {
        // 40 tokens, 200 ms apart: the stream runs for 8 s.
        req.header("x-sim-tokens", "40")
            .header("x-sim-token-interval-ms", "200")
    } else {
        // The answer takes 6 s.
        req.header("x-sim-latency-ms", "6000")
    }
}

/// The first request goes to a gateway (in front of a fresh simulator, on
/// a file in a fresh directory) that is stopped (SIGTERM) once the
/// upstream has started it; the retry goes to a gateway started again on
/// the same file. Returns the retry's status, `Idempotent-Replayed` and
/// problem slug (if any; for a stream, the `error.code` of its last
/// event), and the upstream's executions of the key.
async fn sigterm_mid_answer(
    route: &str,
    key: &str,
    stream: bool,
) -> (u16, String, Option<String>, u64) {
    let sim = sim().await;
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path();
    let gw = Gw::start(dir, &sim.url()).await;
    let first = tokio::spawn({
        let req = request(&gw.url(route), key, stream);
        async move {
            // The first client may see its answer, a problem or a cut:
            // only what the retry gets is asserted.
            if let Ok(r) = req.send().await {
                let _ = r.bytes().await;
            }
        }
    });
    for _ in 0..300 {
        if sim.executions_for(key) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sim.executions_for(key), 1, "the upstream started the work");
    // Mid-answer: a stream has sent a few events, a JSON answer is still
    // being generated.
    tokio::time::sleep(Duration::from_millis(600)).await;
    gw.terminate().await;
    let _ = first.await;

    let gw = Gw::start(dir, &sim.url()).await;
    let retry = request(&gw.url(route), key, stream).send().await.unwrap();
    let status = retry.status().as_u16();
    let replayed = retry
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = retry.bytes().await.unwrap();
    let slug = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => v["type"]
            .as_str()
            .and_then(|t| t.rsplit('/').next().map(str::to_owned)),
        // A stream: the code of the error its last event carries.
        Err(_) => String::from_utf8_lossy(&body)
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("data: "))
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned)),
    };
    gw.terminate().await;
    (status, replayed, slug, sim.executions_for(key))
}

/// [`sigterm_mid_answer`] on the charging route: the upstream ran `key`
/// once, and the retry is replayed with `status` and names
/// `outcome-unknown`.
async fn charging_key_stays_outcome_unknown(key: &str, stream: bool, status: u16) {
    let (got, replayed, slug, executions) = sigterm_mid_answer("charged", key, stream).await;
    assert_eq!(executions, 1, "a rolling restart must not charge twice");
    assert_eq!(got, status);
    assert_eq!(replayed, "true");
    assert_eq!(slug.as_deref(), Some("outcome-unknown"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_json_answer_keeps_a_charging_key_outcome_unknown() {
    charging_key_stays_outcome_unknown("json-charge", false, 502).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_keeps_a_charging_key_outcome_unknown() {
    // The partial stream, ended by its outcome-unknown event.
    charging_key_stays_outcome_unknown("sse-charge", true, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_answer_releases_a_key_that_does_not_charge() {
    let (status, replayed, _, executions) = sigterm_mid_answer("plain", "json-plain", false).await;
    assert_eq!(status, 200);
    assert_eq!(replayed, "false", "the released key runs again");
    assert_eq!(executions, 2);
}
