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
