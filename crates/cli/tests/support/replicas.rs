//! What the multi-replica tests share: [`Gw`], one `idemgate serve`
//! process with a `/wait/…` and an `/attach/…` route to the simulated LLM;
//! the simulator, requests and their answers; and the cleanup of the
//! shared Redis (a random key prefix) and PostgreSQL (a random schema).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idemgate_testkit::require;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use idemgate_llm_sim::{SimConfig, SimHandle};
use tokio::process::{Child, Command};

/// The `idemgate` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
/// The shared Redis.
pub const REDIS: &str = "redis://127.0.0.1:6379";

/// A random tag: the key prefix, schema and key names of one test.
pub fn tag() -> String {
    format!("igrep{:08x}", rand::random::<u32>())
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `idemgate serve` process with two routes to the simulator:
/// `/wait/…` (`on_inflight = "wait"`) and `/attach/…` (`"attach"`), keys
/// required.
pub struct Gw {
    /// The `idemgate serve` process.
    pub child: Child,
    /// Its proxy port on 127.0.0.1.
    pub port: u16,
    /// Its admin port on 127.0.0.1.
    pub admin: u16,
    /// Its log file.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Gw {
    pub async fn start(store: &str, upstream: &str, pending_ttl: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (port, admin) = (free_port(), free_port());
        let route = |name: &str| {
            super::route_toml(
                name,
                upstream,
                &format!(
                    r#"on_inflight = "{name}"
inflight_wait = "20s"
pending_ttl = "{pending_ttl}"
timeouts = {{ connect = "1s", first_byte = "15s", idle = "10s", total = "30s" }}
"#
                ),
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
        let child = super::spawn_quiet(
            Command::new(BIN)
                .args(["serve", "--config"])
                .arg(&file)
                .current_dir(dir.path()),
            std::fs::File::create(&log).unwrap(),
        );
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

    pub async fn wait_ready(&mut self, store: &str) {
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

    pub fn url(&self, mode: &str) -> String {
        format!("http://127.0.0.1:{}/{mode}/v1/chat/completions", self.port)
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    pub fn pid(&self) -> String {
        self.child.id().unwrap().to_string()
    }

    pub async fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid()])
            .status()
            .await
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// The sum of a counter over its label sets in `/metrics`.
    pub async fn counter(&self, name: &str, filter: &str) -> u64 {
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

/// The simulated LLM: 300 ms to the answer, 20 tokens 10 ms apart.
pub async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig {
        latency: Duration::from_millis(300),
        first_token_delay: Duration::from_millis(50),
        token_interval: Duration::from_millis(10),
        completion_tokens: 20,
    })
    .await
    .unwrap()
}

/// A chat completion request for `text`, streamed or not.
pub fn chat(stream: bool, text: &str) -> String {
    serde_json::json!({
        "model": "sim-1",
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

/// An HTTP client with a 60 s timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[derive(Debug)]
/// What a request got back.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The `idempotent-replayed` header, if any.
    pub replayed: Option<String>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// Sends `req` and reads its whole answer.
pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let replayed = idemgate_testkit::http::replayed(&r);
    let body = r.bytes().await.unwrap().to_vec();
    Answer {
        status,
        replayed,
        body,
    }
}

/// A keyed chat `POST` to `url` as `tenant` (its bearer credential).
pub fn request(
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

// ---- cleanup of the shared servers ----

/// Deletes the keys under `prefix` from the shared Redis.
pub async fn drop_prefix(url: &str, prefix: &str) {
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

/// Two multi-threaded tests of the async fn `$run` (given a store URL):
/// `$redis` on the shared Redis under a fresh key prefix, and `$postgres`
/// on the shared PostgreSQL in a fresh schema with a pool of `$pool`
/// connections; each removes its prefix or schema afterwards.
#[allow(unused_macros)]
macro_rules! on_shared_stores {
    ($run:ident: $redis:ident, $postgres:ident, pool $pool:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            use $crate::support::replicas::{REDIS, drop_prefix, tag};
            let prefix = tag();
            $run(&format!("{REDIS}/?prefix={prefix}")).await;
            drop_prefix(REDIS, &prefix).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            use idemgate_testkit::postgres_server::{drop_schema, shared_url};
            let schema = $crate::support::replicas::tag();
            $run(&format!("{}?schema={schema}&pool={}", shared_url(), $pool)).await;
            drop_schema(&shared_url(), &schema).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_shared_stores;
