//! A result is never thrown away because the store blinked: a real gateway
//! whose Redis store (the shared server on 127.0.0.1:6379, under a random
//! key prefix) is reached through a [`FaultProxy`]. The store becomes
//! unreachable while the upstream is generating, so the answer arrives
//! while the completion cannot be written; the store comes back later.
//! The client still gets its answer, the record ends DONE, the retry is a
//! replay, and the upstream ran once. While the result is held, nobody else
//! gets it from memory: a retry on the same gateway is refused 503 (the
//! store is down), and a duplicate that was already waiting keeps waiting
//! and gets the stored answer once the write lands.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use idemgate_gateway::GatewayConfig;
use idemgate_llm_sim::SimConfig;
use idemgate_testkit::FaultProxy;
use idemgate_testkit::http::replayed;
use support::TestGateway;

fn config(store: &str, upstream: &str) -> GatewayConfig {
    support::keyed(store, upstream)
        .route(|r| r.inflight_wait = Some("30s".into()))
        .total_timeout("30s")
        .into_config()
}

fn request(client: &reqwest::Client, base: &str, key: &str) -> reqwest::RequestBuilder {
    let body = serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": format!("tell me about {key}")}],
    });
    client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer tenant-a")
        .header("idempotency-key", key)
        // The answer comes 1.5 s after the request reaches the upstream.
        .header("x-sim-latency-ms", "1500")
        .body(body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_survives_a_store_outage_when_it_arrives() {
    let sim = idemgate_llm_sim::spawn(SimConfig::default()).await.unwrap();
    let proxy = FaultProxy::start("127.0.0.1:6379".parse().unwrap())
        .await
        .expect("start the proxy");
    let prefix = format!("igblink{:08x}", rand::random::<u32>());
    let store = format!("redis://{}/?prefix={prefix}", proxy.addr());
    let gw = TestGateway::start(config(&store, &sim.url())).await;
    let base = gw.base.clone();
    let client = reqwest::Client::new();
    let key = format!("{prefix}-blink");

    let first = {
        let (client, base, key) = (client.clone(), base.clone(), key.clone());
        tokio::spawn(async move { request(&client, &base, &key).send().await })
    };
    // Once the upstream has the request, the store goes away: live
    // connections are cut, new ones refused, until well after the answer.
    let mut reached = false;
    for _ in 0..500 {
        if sim.executions_for(&key) >= 1 {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reached, "the request never reached the upstream");
    // A duplicate meets the key in flight and waits for it.
    let waiter = {
        let (client, base, key) = (client.clone(), base.clone(), key.clone());
        tokio::spawn(async move { request(&client, &base, &key).send().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_refusing(true);
    proxy.cut().await;
    // The answer arrives 1.5 s after the request reached the upstream and
    // cannot be written: it is held by its owner. A retry now, with the
    // store still down, is not answered from memory: it is refused as any
    // request is while the store is down, and nothing runs again.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let during = request(&client, &base, &key).send().await.unwrap();
    assert_eq!(during.status(), 503);
    assert_ne!(replayed(&during).as_deref(), Some("true"));
    let during_body = during.text().await.unwrap();
    assert!(during_body.contains("store-unavailable"), "{during_body}");
    assert!(
        !waiter.is_finished(),
        "the waiting duplicate was answered while nothing was stored"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !first.is_finished(),
        "the client was answered while the result could not be stored"
    );
    proxy.heal();
    proxy.set_refusing(false);

    let first = first.await.unwrap().expect("the first request");
    assert_eq!(first.status(), 200);
    assert_eq!(replayed(&first).as_deref(), Some("false"));
    assert_eq!(first.headers().get("idempotent-stored"), None);
    let first_body = first.bytes().await.unwrap();
    let waiter = waiter.await.unwrap().expect("the waiting duplicate");
    assert_eq!(waiter.status(), 200);
    assert_eq!(replayed(&waiter).as_deref(), Some("true"));
    assert_eq!(waiter.bytes().await.unwrap(), first_body);

    let retry = request(&client, &base, &key).send().await.unwrap();
    assert_eq!(retry.status(), 200);
    assert_eq!(
        replayed(&retry).as_deref(),
        Some("true"),
        "the retry ran the work again"
    );
    assert_eq!(retry.bytes().await.unwrap(), first_body);
    assert_eq!(
        sim.executions_for(&key),
        1,
        "the upstream ran more than once"
    );

    gw.stop().await.expect("stop cleanly");
    sim.shutdown().await;
}
