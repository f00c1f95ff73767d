//! Many gateway replicas, one store: real `idemgate serve` processes sharing
//! Redis or PostgreSQL in front of the simulated LLM upstream.
//!
//! - duplicates split between two processes execute once (wait and attach,
//!   JSON and SSE, many keys);
//! - a process killed with SIGKILL mid-generation: the key is claimable
//!   again after `pending_ttl` and the retry on the other process runs the
//!   work once more (the documented at-least-once window after a crash);
//! - a process paused with SIGSTOP past its lease: the other takes the key
//!   over; the paused one, resumed, is fenced and cannot overwrite;
//! - a private Redis and a private PostgreSQL restarted under load: every
//!   request ends with a definite status, nobody gets another tenant's or
//!   key's result, and (PostgreSQL) no acknowledged DONE is lost.
//!
//! The shared servers (Redis 127.0.0.1:6379 under a random key prefix,
//! PostgreSQL db `test` under a random schema) are never restarted; the
//! restart tests start their own. Under `CI=true` a missing server fails
//! the suite; it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idemgate_testkit::require;
use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_llm_sim::{SimConfig, SimHandle};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
const REDIS: &str = "redis://127.0.0.1:6379";

fn postgres_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn tag() -> String {
    format!("igrep{:08x}", rand::random::<u32>())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `idemgate serve` process with two routes to the simulator:
/// `/wait/…` (`on_inflight = "wait"`) and `/attach/…` (`"attach"`), keys
/// required.
struct Gw {
    child: Child,
    port: u16,
    admin: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gw {
    async fn start(store: &str, upstream: &str, pending_ttl: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (port, admin) = (free_port(), free_port());
        let route = |name: &str| {
            format!(
                r#"
[[routes]]
prefix = "/{name}"
strip_prefix = true
upstream = "{upstream}"
key = "require"
on_inflight = "{name}"
inflight_wait = "20s"
pending_ttl = "{pending_ttl}"
timeouts = {{ connect = "1s", first_byte = "15s", idle = "10s", total = "30s" }}
"#
            )
        };
        let file = dir.path().join("gateway.toml");
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nstore = \"{store}\"\nshutdown_grace = \"2s\"\n{}{}",
                route("wait"),
                route("attach")
            ),
        )
        .unwrap();
        let log = dir.path().join("stderr.log");
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&file)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut gw = Self {
            child,
            port,
            admin,
            log,
            _dir: dir,
        };
        gw.wait_ready(store).await;
        gw
    }

    async fn wait_ready(&mut self, store: &str) {
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                if log.contains("cannot open") {
                    require(&format!("the store at {store} ({log})"), false);
                }
                panic!("gateway exited early ({status}): {log}");
            }
            if let Ok(r) = client
                .get(format!("{}/healthz", self.admin_url()))
                .send()
                .await
                && r.status() == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("gateway never became ready");
    }

    fn url(&self, mode: &str) -> String {
        format!("http://127.0.0.1:{}/{mode}/v1/chat/completions", self.port)
    }

    fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    fn pid(&self) -> String {
        self.child.id().unwrap().to_string()
    }

    async fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid()])
            .status()
            .await
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// The sum of a counter over its label sets in `/metrics`.
    async fn counter(&self, name: &str, filter: &str) -> u64 {
        let text = reqwest::get(format!("{}/metrics", self.admin_url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::from_millis(300),
        first_token_delay: Duration::from_millis(50),
        token_interval: Duration::from_millis(10),
        completion_tokens: 20,
    })
    .await
    .unwrap()
}

fn chat(stream: bool, text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: Option<String>,
    body: Vec<u8>,
}

async fn send(req: reqwest::RequestBuilder) -> Answer {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = r.bytes().await.unwrap().to_vec();
    Answer {
        status,
        replayed,
        body,
    }
}

fn request(
    client: &reqwest::Client,
    url: &str,
    tenant: &str,
    key: &str,
    body: String,
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {tenant}"))
        .header("idempotency-key", key)
        .body(body)
}

/// ≥ 64 concurrent duplicates per key, alternating between two replicas,
/// for 10 keys in each of wait/attach × JSON/SSE: one execution per key,
/// every answer 200 and identical, exactly one of them fresh.
async fn split_duplicates(store: &str) {
    let sim = Arc::new(sim().await);
    let a = Gw::start(store, &sim.url(), "10s").await;
    let b = Gw::start(store, &sim.url(), "10s").await;
    let client = client();
    let run = tag();
    for mode in ["wait", "attach"] {
        for stream in [false, true] {
            for i in 0..10 {
                let key = format!("{run}-{mode}-{stream}-{i}");
                let mut set = JoinSet::new();
                for j in 0..64 {
                    let url = if j % 2 == 0 { a.url(mode) } else { b.url(mode) };
                    let req = request(&client, &url, "t1", &key, chat(stream, &key));
                    set.spawn(send(req));
                }
                let answers: Vec<Answer> = set.join_all().await;
                executed_once(&sim, &key, &answers);
                if stream {
                    assert!(answers[0].body.ends_with(b"data: [DONE]\n\n"), "{key}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_duplicates_split_between_two_processes_execute_once() {
    let prefix = tag();
    split_duplicates(&format!("{REDIS}/?prefix={prefix}")).await;
    drop_prefix(REDIS, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_duplicates_split_between_two_processes_execute_once() {
    let schema = tag();
    split_duplicates(&format!("{}?schema={schema}&pool=6", postgres_url())).await;
    drop_schema(&postgres_url(), &schema).await;
}

/// The soak: `SOAK_KEYS` fresh keys (default 60), each sent as 8
/// concurrent duplicates spread over two replicas, 16 keys at a time,
/// alternating wait/attach and JSON/SSE. Every key runs upstream exactly
/// once and every answer of a key is identical. `scripts/soak.sh` runs it
/// at full size on every store and prints the figures.
async fn soak(store: &str) {
    const DUPLICATES: usize = 8;
    const KEYS_AT_ONCE: usize = 16;
    let keys: usize = std::env::var("SOAK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let sim = Arc::new(
        idemgate_llm_sim::spawn(SimConfig {
            latency: Duration::from_millis(20),
            first_token_delay: Duration::from_millis(5),
            token_interval: Duration::from_millis(1),
            completion_tokens: 12,
        })
        .await
        .unwrap(),
    );
    let a = Arc::new(Gw::start(store, &sim.url(), "10s").await);
    let b = Arc::new(Gw::start(store, &sim.url(), "10s").await);
    let client = client();
    let run = tag();
    let started = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(KEYS_AT_ONCE));
    let mut set = JoinSet::new();
    for i in 0..keys {
        let permit = Arc::clone(&slots).acquire_owned().await.unwrap();
        let (a, b, client) = (Arc::clone(&a), Arc::clone(&b), client.clone());
        let key = format!("{run}-{i}");
        set.spawn(async move {
            let mode = if i % 2 == 0 { "wait" } else { "attach" };
            let stream = i % 4 >= 2;
            let mut dups = JoinSet::new();
            for j in 0..DUPLICATES {
                let url = if j % 2 == 0 { a.url(mode) } else { b.url(mode) };
                let req = request(&client, &url, "soak", &key, chat(stream, &key));
                dups.spawn(send(req));
            }
            let answers = dups.join_all().await;
            drop(permit);
            (key, answers)
        });
        // Keep the finished ones from piling up.
        while let Some(done) = set.try_join_next() {
            let (key, answers) = done.unwrap();
            executed_once(&sim, &key, &answers);
        }
    }
    while let Some(done) = set.join_next().await {
        let (key, answers) = done.unwrap();
        executed_once(&sim, &key, &answers);
    }
    let secs = started.elapsed().as_secs_f64();
    let executions = sim.stats().executions;
    assert_eq!(executions, keys as u64, "one upstream execution per key");
    eprintln!(
        "soak {}: {keys} keys x {DUPLICATES} duplicates over 2 replicas: {} requests in {secs:.1} s \
         ({:.0} req/s); {executions} upstream executions; every key once, its answers identical",
        store.split(['?', ':']).next().unwrap_or(store),
        keys * DUPLICATES,
        (keys * DUPLICATES) as f64 / secs,
    );
}

/// Every answer of `key` is 200 and identical, exactly one of them fresh,
/// and the upstream ran it once.
fn executed_once(sim: &SimHandle, key: &str, answers: &[Answer]) {
    for ans in answers {
        assert_eq!(
            ans.status,
            200,
            "{key}: {}",
            String::from_utf8_lossy(&ans.body)
        );
        assert_eq!(ans.body, answers[0].body, "{key}: every answer identical");
    }
    let fresh = answers
        .iter()
        .filter(|a| a.replayed.as_deref() == Some("false"))
        .count();
    assert_eq!(fresh, 1, "{key}: exactly one answer is the execution");
    assert_eq!(sim.executions_for(key), 1, "{key}: one upstream execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_redis() {
    let prefix = tag();
    soak(&format!("{REDIS}/?prefix={prefix}")).await;
    drop_prefix(REDIS, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_postgres() {
    let schema = tag();
    soak(&format!("{}?schema={schema}&pool=8", postgres_url())).await;
    drop_schema(&postgres_url(), &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_one_shared_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    soak(&format!(
        "sqlite:{}",
        dir.path().join("shared.db").display()
    ))
    .await;
}

/// Waits until the simulator has started `n` executions of `key`.
async fn executions_reach(sim: &SimHandle, key: &str, n: u64) {
    for _ in 0..200 {
        if sim.executions_for(key) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{key} never reached {n} executions");
}

/// A replica killed mid-generation: the retry on the other replica waits
/// for the dead owner's lease to lapse, then runs the work once more.
async fn killed_mid_generation(store: &str) {
    let sim = sim().await;
    let a = Gw::start(store, &sim.url(), "2s").await;
    let b = Gw::start(store, &sim.url(), "2s").await;
    let client = client();
    let key = format!("{}-killed", tag());
    let body = chat(false, &key);
    let first = tokio::spawn(send_result(
        request(&client, &a.url("attach"), "t1", &key, body.clone())
            .header("x-sim-latency-ms", "5000"),
    ));
    executions_reach(&sim, &key, 1).await;
    a.signal("KILL").await;
    assert!(
        first.await.unwrap().is_err(),
        "the killed replica's client gets no answer"
    );
    // Sent at once: the key is PENDING under the dead owner's lease; the
    // duplicate waits (attach = wait for a JSON response), sees the lease
    // lapse and claims the key.
    let retry = send(request(&client, &b.url("attach"), "t1", &key, body.clone())).await;
    assert_eq!(
        retry.status,
        200,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert_eq!(
        sim.executions_for(&key),
        2,
        "at-least-once after a crash: the work ran again"
    );
    let replay = send(request(&client, &b.url("attach"), "t1", &key, body)).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(sim.executions_for(&key), 2);
}

async fn send_result(req: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let r = req.send().await?;
    let status = r.status().as_u16();
    let body = r.bytes().await?.to_vec();
    Ok(Answer {
        status,
        replayed: None,
        body,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_killed_replicas_key_is_claimable_after_pending_ttl() {
    let prefix = tag();
    killed_mid_generation(&format!("{REDIS}/?prefix={prefix}")).await;
    drop_prefix(REDIS, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_killed_replicas_key_is_claimable_after_pending_ttl() {
    let schema = tag();
    killed_mid_generation(&format!("{}?schema={schema}&pool=4", postgres_url())).await;
    drop_schema(&postgres_url(), &schema).await;
}

/// SSE with Redis: a duplicate on the other replica follows the live
/// stream; when the owner is killed the follower's stream ends with an
/// error (never a clean end), and the client's retry after `pending_ttl`
/// runs the work again and gets a whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_follower_of_a_killed_owners_stream_sees_it_break_and_the_retry_runs_again() {
    let prefix = tag();
    let store = format!("{REDIS}/?prefix={prefix}");
    let sim = sim().await;
    let a = Gw::start(&store, &sim.url(), "2s").await;
    let b = Gw::start(&store, &sim.url(), "2s").await;
    let client = client();
    let key = format!("{prefix}-sse-killed");
    let body = chat(true, &key);
    let slow = |r: reqwest::RequestBuilder| {
        r.header("x-sim-tokens", "200")
            .header("x-sim-token-interval-ms", "50")
    };
    let mut owner = slow(request(&client, &a.url("attach"), "t1", &key, body.clone()))
        .send()
        .await
        .unwrap();
    assert!(owner.chunk().await.unwrap().is_some());
    let mut follower = slow(request(&client, &b.url("attach"), "t1", &key, body.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(follower.status(), 200);
    assert_eq!(
        follower
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let first = follower.chunk().await.unwrap().unwrap();
    // The first event, numbered 1 in the run that produced it.
    let head = String::from_utf8_lossy(&first);
    let id = head.lines().next().and_then(|l| l.strip_prefix("id: "));
    assert!(id.is_some_and(|id| id.ends_with("-1")), "{first:?}");
    a.signal("KILL").await;
    let ended = loop {
        match follower.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(
        ended.is_err(),
        "a stream whose owner died must not end cleanly"
    );
    let retry =
        send(request(&client, &b.url("attach"), "t1", &key, body).header("x-sim-tokens", "10"))
            .await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.replayed.as_deref(), Some("false"));
    assert!(retry.body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(sim.executions_for(&key), 2);
    drop(owner);
    drop_prefix(REDIS, &prefix).await;
}

/// A replica paused past its lease: the other takes the key over and
/// stores its result; the paused one, resumed, is fenced: its late result
/// does not overwrite, and its `/metrics` counts it.
async fn paused_past_the_lease(store: &str) {
    let sim = sim().await;
    let a = Gw::start(store, &sim.url(), "1s").await;
    let b = Gw::start(store, &sim.url(), "1s").await;
    let client = client();
    let key = format!("{}-paused", tag());
    let body = chat(false, &key);
    let stale = tokio::spawn(send(
        request(&client, &a.url("wait"), "t1", &key, body.clone())
            .header("x-sim-latency-ms", "3000"),
    ));
    executions_reach(&sim, &key, 1).await;
    a.signal("STOP").await;
    // Well past the 1 s lease: no heartbeat can run in a stopped process.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let taken = send(request(&client, &b.url("wait"), "t1", &key, body.clone())).await;
    assert_eq!(
        taken.status,
        200,
        "{}",
        String::from_utf8_lossy(&taken.body)
    );
    assert_eq!(
        taken.replayed.as_deref(),
        Some("false"),
        "b took the key over"
    );
    assert_eq!(sim.executions_for(&key), 2);
    a.signal("CONT").await;
    let late = stale.await.unwrap();
    assert_eq!(
        late.status, 200,
        "the paused replica's own client still gets its answer"
    );
    assert_ne!(late.body, taken.body, "two executions, two responses");
    for gw in [&a, &b] {
        let replay = send(request(&client, &gw.url("wait"), "t1", &key, body.clone())).await;
        assert_eq!(replay.status, 200);
        assert_eq!(replay.replayed.as_deref(), Some("true"));
        assert_eq!(
            replay.body, taken.body,
            "the stored result is the new owner's, not the fenced one's"
        );
    }
    assert!(
        a.counter("idempotency_fenced_total", "").await >= 1,
        "the paused replica counted its fenced completion"
    );
    assert_eq!(b.counter("idempotency_fenced_total", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_paused_replica_is_fenced_after_a_takeover() {
    let prefix = tag();
    paused_past_the_lease(&format!("{REDIS}/?prefix={prefix}")).await;
    drop_prefix(REDIS, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_paused_replica_is_fenced_after_a_takeover() {
    let schema = tag();
    paused_past_the_lease(&format!("{}?schema={schema}&pool=4", postgres_url())).await;
    drop_schema(&postgres_url(), &schema).await;
}

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

// ---- cleanup of the shared servers ----

async fn drop_prefix(url: &str, prefix: &str) {
    // Let writes of the just-killed gateways land first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let port = url.rsplit(':').next().unwrap_or("6379");
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "redis-cli -h 127.0.0.1 -p {port} --scan --pattern '{prefix}:*' | xargs -r redis-cli -h 127.0.0.1 -p {port} del"
        ))
        .output()
        .await;
}

async fn drop_schema(url: &str, schema: &str) {
    // The gateways were just killed; their connections may take a moment
    // to go away and release their locks.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let done = Command::new("psql")
            .args([url, "-q", "-c"])
            .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        if done {
            return;
        }
    }
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
