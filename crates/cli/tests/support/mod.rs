//! Helpers shared by the tests that run `idemgate serve` as a process.
#![allow(dead_code, unreachable_pub)]

pub mod replicas;

use std::time::Duration;

use tokio::process::Child;

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
