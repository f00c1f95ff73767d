//! A private Redis and a private PostgreSQL restarted under load: every
//! request ends with a definite status, nobody gets another tenant's or
//! key's result, and (PostgreSQL) no acknowledged DONE is lost. The
//! servers restarted are this file's own, never the shared ones.
//!
//! Real `idemgate serve` processes share Redis or PostgreSQL in front of
//! the simulated LLM upstream; the shared helpers are in
//! `support/replicas.rs`. The shared servers (Redis 127.0.0.1:6379 under a
//! random key prefix, PostgreSQL db `test` under a random schema) are never
//! restarted. Under `CI=true` a missing server fails the suite; it never
//! skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use idemgate_testkit::require;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use idemgate_llm_sim::SimHandle;
use support::replicas::*;
use tokio::task::JoinSet;

/// What the simulator answers for `text` (its content is a function of the
/// conversation): the marker a gateway answer for that request must carry.
async fn expected_content(sim: &SimHandle, text: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sim.url()))
        .header("content-type", "application/json")
        .body(chat(false, text))
        .send()
        .await
        .unwrap();
    content_of(&r.bytes().await.unwrap()).unwrap()
}

fn content_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(v["choices"][0]["message"]["content"].as_str()?.to_owned())
}

/// Two tenants × `keys` keys (the same client keys in both tenants).
fn text_of(tenant: &str, key: &str) -> String {
    format!("marker {tenant} {key}")
}

struct Load {
    /// (tenant, key, route, answer) of every request. The route is part
    /// of the record's scope: the same key on two routes is two records.
    answers: Vec<(String, String, &'static str, Answer)>,
    expected: HashMap<(String, String), String>,
}

/// Runs requests from 8 workers against two replicas for `duration`, while
/// `outage` (started after 1.5 s) stops and restarts the store's server.
async fn load_through_a_restart(
    sim: &SimHandle,
    a: &Gw,
    b: &Gw,
    duration: Duration,
    outage: impl std::future::Future<Output = ()>,
) -> Load {
    let run = tag();
    let keys: Vec<String> = (0..40).map(|i| format!("{run}-{i}")).collect();
    let tenants = ["tenant-1", "tenant-2"];
    let mut expected = HashMap::new();
    for t in tenants {
        for k in &keys {
            expected.insert(
                (t.to_owned(), k.clone()),
                expected_content(sim, &text_of(t, k)).await,
            );
        }
    }
    let urls = [
        (a.url("attach"), "attach"),
        (b.url("attach"), "attach"),
        (a.url("wait"), "wait"),
        (b.url("wait"), "wait"),
    ];
    let deadline = Instant::now() + duration;
    let mut set = JoinSet::new();
    for w in 0..8u64 {
        let (keys, urls) = (keys.clone(), urls.clone());
        set.spawn(async move {
            let client = client();
            let mut out = Vec::new();
            let mut i = w;
            while Instant::now() < deadline {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = &keys[(i >> 33) as usize % keys.len()];
                let tenant = tenants[(i >> 20) as usize % 2];
                let (url, route) = &urls[(i >> 40) as usize % urls.len()];
                let req = request(
                    &client,
                    url,
                    tenant,
                    key,
                    chat(false, &text_of(tenant, key)),
                )
                .header("x-sim-latency-ms", "50");
                out.push((tenant.to_owned(), key.clone(), *route, send(req).await));
            }
            out
        });
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    outage.await;
    let answers = set.join_all().await.into_iter().flatten().collect();
    Load { answers, expected }
}

/// Every request ended with a definite status and every 200 carries its
/// own (tenant, key)'s marker. Returns the (tenant, key)s that got a fresh
/// 200, with the route.
fn check_answers(load: &Load) -> Vec<(String, String, &'static str)> {
    let mut fresh = Vec::new();
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for (tenant, key, route, ans) in &load.answers {
        *by_status.entry(ans.status).or_default() += 1;
        assert!(
            matches!(ans.status, 200 | 409 | 503),
            "{tenant}/{key}: status {} {}",
            ans.status,
            String::from_utf8_lossy(&ans.body)
        );
        if ans.status == 200 {
            let want = &load.expected[&(tenant.clone(), key.clone())];
            assert_eq!(
                content_of(&ans.body).as_deref(),
                Some(want.as_str()),
                "{tenant}/{key} got another request's result"
            );
            if ans.replayed.as_deref() == Some("false") {
                fresh.push((tenant.clone(), key.clone(), *route));
            }
        }
    }
    eprintln!("statuses under the restart: {by_status:?}");
    assert!(
        by_status.get(&200).copied().unwrap_or(0) > 0,
        "the load made progress"
    );
    fresh
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_redis_restarted_under_load() {
    let server = PrivateRedis::start();
    let sim = sim().await;
    let store = format!("{}/?prefix={}", server.url(), tag());
    let a = Gw::start(&store, &sim.url(), "10s").await;
    let b = Gw::start(&store, &sim.url(), "10s").await;
    let load = load_through_a_restart(&sim, &a, &b, Duration::from_secs(7), async {
        let s = &server;
        tokio::task::block_in_place(|| {
            s.stop();
            std::thread::sleep(Duration::from_millis(1500));
            s.restart();
        });
    })
    .await;
    check_answers(&load);
    // After the restart both replicas serve again, with the right results.
    let client = client();
    for (i, gw) in [&a, &b].into_iter().enumerate() {
        let key = format!("{}-after-{i}", tag());
        let ans = send(request(
            &client,
            &gw.url("wait"),
            "tenant-1",
            &key,
            chat(false, &text_of("tenant-1", &key)),
        ))
        .await;
        assert_eq!(ans.status, 200);
        assert_eq!(
            content_of(&ans.body),
            Some(expected_content(&sim, &text_of("tenant-1", &key)).await)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_postgres_restarted_under_load_keeps_every_acknowledged_done() {
    let server = PrivatePostgres::start();
    let sim = sim().await;
    let store = format!("{}?schema={}&pool=6", server.url(), tag());
    let a = Gw::start(&store, &sim.url(), "10s").await;
    let b = Gw::start(&store, &sim.url(), "10s").await;
    let load = load_through_a_restart(&sim, &a, &b, Duration::from_secs(9), async {
        let s = &server;
        tokio::task::block_in_place(|| {
            // A crash: no checkpoint; recovery replays the WAL.
            s.stop("immediate");
            std::thread::sleep(Duration::from_millis(1500));
            s.start_server();
        });
    })
    .await;
    let fresh = check_answers(&load);
    assert!(!fresh.is_empty());
    // Every fresh 200 whose completion the store acknowledged must replay.
    // The gateway answers a fresh result even when storing it failed (the
    // work ran; the client deserves the answer), so a re-execution is
    // allowed only for completions that failed or were fenced — counted.
    let client = client();
    let mut reexecuted = 0;
    let mut seen = std::collections::HashSet::new();
    for (tenant, key, route) in fresh {
        if !seen.insert((tenant.clone(), key.clone(), route)) {
            continue;
        }
        let ans = send(request(
            &client,
            &a.url(route),
            &tenant,
            &key,
            chat(false, &text_of(&tenant, &key)),
        ))
        .await;
        assert_eq!(ans.status, 200, "{}", String::from_utf8_lossy(&ans.body));
        assert_eq!(
            content_of(&ans.body).as_deref(),
            Some(load.expected[&(tenant.clone(), key.clone())].as_str())
        );
        if ans.replayed.as_deref() == Some("false") {
            reexecuted += 1;
        }
    }
    let mut unstored = 0;
    for gw in [&a, &b] {
        unstored += gw
            .counter("idempotency_store_errors_total", "op=\"complete\"")
            .await;
        unstored += gw.counter("idempotency_fenced_total", "").await;
    }
    eprintln!("re-executed after the restart: {reexecuted}; completions not stored: {unstored}");
    assert!(
        reexecuted <= unstored,
        "{reexecuted} keys re-executed but only {unstored} completions failed: an acknowledged DONE was lost"
    );
}

// ---- private servers (never the shared ones) ----

/// Stops a server when this test process exits (statics and panics
/// included).
fn watchdog(pid: &str, signal: &str) {
    #[allow(clippy::zombie_processes)]
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -{signal} {pid} 2>/dev/null",
            me = std::process::id()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not happen in time");
}

/// A private `redis-server` with an append-only file fsynced on every write.
struct PrivateRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: std::sync::Mutex<Option<std::process::Child>>,
}

impl PrivateRedis {
    fn start() -> Self {
        require(
            "redis-server",
            std::process::Command::new("redis-server")
                .arg("--version")
                .output()
                .is_ok(),
        );
        let s = Self {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: std::sync::Mutex::new(None),
        };
        s.restart();
        s
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pings(&self) -> bool {
        std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "ping"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
    }

    fn restart(&self) {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
            ])
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        watchdog(&child.id().to_string(), "TERM");
        *self.child.lock().unwrap() = Some(child);
        wait_until("redis-server start", || self.pings());
    }

    fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until("redis-server stop", || !self.pings());
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A private PostgreSQL (initdb in a temp dir, its own port).
struct PrivatePostgres {
    port: u16,
    dir: tempfile::TempDir,
}

fn pg_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    versions.sort();
    let bin = versions
        .last()
        .map(|v| v.join("bin").join(name))
        .filter(|p| p.exists());
    require(&format!("PostgreSQL's {name}"), bin.is_some());
    bin.unwrap()
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// initdb and the server refuse to run as root: run them as `postgres`.
fn pg_command(bin: &Path) -> std::process::Command {
    if is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        std::process::Command::new(bin)
    }
}

impl PrivatePostgres {
    fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pg")
            .tempdir()
            .unwrap();
        if is_root() {
            let ok = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown of the private cluster directory failed");
        }
        let out = pg_command(&pg_bin("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = Self {
            port: free_port(),
            dir,
        };
        s.start_server();
        s
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn start_server(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=60",
            self.port,
            self.dir.path().display()
        );
        let ok = pg_command(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-o", &opts, "-w", "-t", "30", "-l"])
            .arg(self.dir.path().join("log"))
            .arg("start")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pg_ctl start failed");
        if let Ok(pidfile) =
            std::fs::read_to_string(self.dir.path().join("data").join("postmaster.pid"))
            && let Some(pid) = pidfile.lines().next()
        {
            watchdog(pid.trim(), "INT");
        }
    }

    fn stop(&self, mode: &str) {
        let _ = pg_command(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", mode, "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop("fast");
    }
}
