//! Helpers shared by the tests that run `idemgate serve` as a process.
#![allow(dead_code, unreachable_pub)]

pub mod replicas;

use std::process::Stdio;
use std::time::Duration;

use idemgate_llm_sim::{SimConfig, SimHandle};
use tokio::process::{Child, Command};

/// The simulated LLM with its default configuration, for a test's
/// gateway to stand in front of.
pub async fn sim() -> SimHandle {
    idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the simulated LLM")
}

/// A store URL for the shared Redis, under a fresh key prefix that starts
/// with `tag`.
pub fn fresh_redis(tag: &str) -> String {
    format!(
        "redis://127.0.0.1:6379/?prefix={tag}{:08x}",
        rand::random::<u32>()
    )
}

/// A store URL for the shared PostgreSQL, in a fresh schema whose name
/// starts with `tag`.
pub fn fresh_postgres(tag: &str) -> String {
    format!(
        "postgres://postgres@127.0.0.1:5432/test?schema={tag}{:08x}",
        rand::random::<u32>()
    )
}

/// Two multi-threaded tests of the async fn `$run` (given a store URL):
/// `$redis` on the shared Redis ([`fresh_redis`]) and `$postgres` on the
/// shared PostgreSQL ([`fresh_postgres`]), their prefix or schema named
/// from `$tag`.
#[allow(unused_macros)]
macro_rules! on_fresh_stores {
    ($run:ident($tag:literal): $redis:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            $run($crate::support::fresh_redis($tag)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $run($crate::support::fresh_postgres($tag)).await;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_fresh_stores;

/// `serve` arguments for a gateway on the memory store whose proxy and
/// admin listeners take any free loopback port (read back from its log).
pub const MEMORY_ON_ANY_PORT: [&str; 6] = [
    "--store",
    "memory:",
    "--listen",
    "127.0.0.1:0",
    "--admin-listen",
    "127.0.0.1:0",
];

/// Starts `cmd` (an `idemgate` command line) with its stdout discarded and
/// its stderr sent to `stderr`; the process is killed when its handle is
/// dropped.
pub fn spawn_quiet(cmd: &mut Command, stderr: impl Into<Stdio>) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the gateway")
}

/// Waits (as [`wait_ready`]) until the admin listener on `admin_port`
/// answers 200 at `path` (`/readyz`, `/healthz`); returns a client for the
/// rest of the test.
pub async fn wait_admin(admin_port: u16, path: &str, child: &mut Child) -> reqwest::Client {
    let client = reqwest::Client::new();
    wait_ready(
        &client,
        &format!("http://127.0.0.1:{admin_port}{path}"),
        child,
    )
    .await;
    client
}

/// A temporary directory (removed when dropped) holding one file `name`
/// with `contents`; returns the directory and the file's path.
pub fn temp_file(name: &str, contents: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let file = dir.path().join(name);
    std::fs::write(&file, contents).expect("write the file");
    (dir, file)
}

/// One `[[routes]]` table for a gateway config: `/{name}` (the prefix
/// stripped) to `upstream`, keys required, followed by `rest` (more TOML
/// lines of the same table).
pub fn route_toml(name: &str, upstream: &str, rest: &str) -> String {
    format!(
        "\n[[routes]]\nprefix = \"/{name}\"\nstrip_prefix = true\nupstream = \"{upstream}\"\nkey = \"require\"\n{rest}"
    )
}

/// A loopback port free at the time of asking.
pub async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    l.local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// POSTs the chat completion `body` with `key` to the gateway's proxy
/// listener on `port`; panics if it cannot be sent.
pub async fn post_chat(
    client: &reqwest::Client,
    port: u16,
    key: &str,
    body: &'static str,
) -> reqwest::Response {
    client
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body)
        .send()
        .await
        .expect("send the request")
}

/// Sends `req` and asserts the answer's status is `status`.
pub async fn expect_status(req: reqwest::RequestBuilder, status: u16) -> reqwest::Response {
    let r = req.send().await.expect("send the request");
    assert_eq!(r.status(), status);
    r
}

/// Sends SIGTERM to `child` (a graceful shutdown) and checks it was
/// delivered.
pub async fn sigterm(child: &Child) {
    let pid = child.id().expect("a running child has a pid");
    let kill = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .expect("a status");
    assert!(kill.success());
}

/// Output bytes as text, for messages.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that a command succeeded and said `expected` on stdout.
pub fn assert_says(out: &std::process::Output, expected: &str) {
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains(expected),
        "{}",
        text(&out.stdout)
    );
}

/// Asserts that a command exited with `code` and said `expected` on
/// stderr.
pub fn assert_exit_says(out: &std::process::Output, code: i32, expected: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(expected),
        "{}",
        text(&out.stderr)
    );
}

/// Reads `child`'s log (its stderr, piped) on a plain thread as it is
/// written, until the pipe closes. Returns the "gateway started" line once
/// it is written (the bound addresses are in it; panics if it does not come
/// within 30 s) and the thread, which returns the whole log.
pub async fn read_log(child: &mut Child) -> (String, std::thread::JoinHandle<String>) {
    use std::io::BufRead;
    let pipe = child
        .stderr
        .take()
        .unwrap_or_else(|| panic!("no stderr"))
        .into_owned_fd()
        .expect("an owned fd");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<String>();
    let log = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut started = Some(started_tx);
        for line in std::io::BufReader::new(std::fs::File::from(pipe)).lines() {
            let Ok(line) = line else { break };
            if line.contains("gateway started")
                && let Some(tx) = started.take()
            {
                let _ = tx.send(line.clone());
            }
            all.push(line);
        }
        all.join("\n")
    });
    let started = tokio::time::timeout(Duration::from_secs(30), started_rx)
        .await
        .unwrap_or_else(|_| panic!("gateway did not start"))
        .unwrap_or_else(|_| panic!("gateway exited before starting"));
    (started, log)
}

/// Polls `url` until it answers 200, or the process exits, or 30 s pass.
pub async fn wait_ready(client: &reqwest::Client, url: &str, child: &mut Child) {
    for _ in 0..300 {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("gateway exited early: {status}");
        }
        if let Ok(r) = client.get(url).send().await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gateway never became ready at {url}");
}
