//! Liveness and readiness on the admin listener, over real HTTP: `/healthz`
//! says the process serves and never asks the store; `/readyz` says the
//! store answers and the gateway is not draining. The store is a real
//! Redis behind a fault proxy, so "unreachable" is a refused connection
//! and "hanging" a stalled one.

mod support;

use support::TestGateway;

use idemgate_gateway::GatewayConfig;
use idemgate_testkit::FaultProxy;

const REDIS: &str = "127.0.0.1:6379";

/// A gateway on `store` (its proxy is not used here).
fn config(store: &str) -> GatewayConfig {
    support::closed_upstream_config(store, "/v1", |_| {})
}

async fn status(client: &reqwest::Client, url: String) -> u16 {
    client
        .get(url)
        .send()
        .await
        .expect("send the request")
        .status()
        .as_u16()
}

#[tokio::test]
async fn readyz_follows_the_store_and_healthz_never_does() {
    let up = tokio::net::TcpStream::connect(REDIS).await.is_ok();
    idemgate_testkit::require("Redis on 127.0.0.1:6379", up);
    let proxy = FaultProxy::start(REDIS.parse().expect("a socket address"))
        .await
        .expect("start the fault proxy");
    let prefix = format!("health-{}", rand::random::<u64>());
    let gw = TestGateway::start(config(&format!(
        "redis://{}/?prefix={prefix}",
        proxy.addr()
    )))
    .await;
    let client = reqwest::Client::new();
    assert_eq!(status(&client, format!("{}/healthz", gw.admin)).await, 200);
    assert_eq!(status(&client, format!("{}/readyz", gw.admin)).await, 200);

    // The store becomes unreachable: not ready, still alive.
    proxy.set_refusing(true);
    proxy.cut().await;
    assert_eq!(status(&client, format!("{}/readyz", gw.admin)).await, 503);
    assert_eq!(status(&client, format!("{}/healthz", gw.admin)).await, 200);

    // It comes back: ready again (the connection manager reconnects).
    proxy.heal();
    let mut ready = false;
    for _ in 0..50 {
        if status(&client, format!("{}/readyz", gw.admin)).await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "/readyz never recovered");

    // A store that accepts but never answers: not ready either.
    proxy.stall(true);
    assert_eq!(status(&client, format!("{}/readyz", gw.admin)).await, 503);
    assert_eq!(status(&client, format!("{}/healthz", gw.admin)).await, 200);
    proxy.stall(false);

    gw.stop().await.expect("stop cleanly");
}
