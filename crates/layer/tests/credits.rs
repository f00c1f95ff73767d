//! The credits example over real HTTP: duplicate charges move the balance once.
#![allow(clippy::unwrap_used)] // test helpers: failing loudly is their job

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/credits.rs"]
mod credits;

use std::sync::Arc;

use credits::{OPENING_BALANCE, Receipt, SharedLedger};
use idemgate_engine::{Engine, MemoryStore};

async fn start() -> (String, SharedLedger) {
    let ledger = SharedLedger::default();
    let app = credits::app(
        Engine::new(Arc::new(MemoryStore::new())),
        Arc::clone(&ledger),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, ledger)
}

fn charge(client: &reqwest::Client, base: &str, key: &str, amount: i64) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/charge"))
        .header("idempotency-key", key)
        .header("authorization", "Bearer shop-1")
        .header("content-type", "application/json")
        .body(format!(r#"{{"account":"alice","amount":{amount}}}"#))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_duplicate_charges_move_the_balance_once() {
    let (base, ledger) = start().await;
    let client = reqwest::Client::new();
    for (round, key) in ["order-1", "order-2", "order-3"].iter().enumerate() {
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let req = charge(&client, &base, key, 10);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let res = req.send().await.unwrap();
                    let status = res.status().as_u16();
                    let replayed = res.headers()["idempotent-replayed"]
                        .to_str()
                        .unwrap()
                        .to_owned();
                    (status, replayed, res.bytes().await.unwrap())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert!(
            answers
                .iter()
                .all(|(s, _, b)| *s == 201 && *b == answers[0].2)
        );
        assert_eq!(answers.iter().filter(|(_, r, _)| r == "false").count(), 1);
        let receipt: Receipt = serde_json::from_slice(&answers[0].2).unwrap();
        let expected = OPENING_BALANCE - 10 * (round as i64 + 1);
        assert_eq!(receipt.balance, expected);
        let l = ledger.lock().unwrap();
        assert_eq!(l.rows.len(), round + 1, "one ledger row per operation");
        assert_eq!(l.balances["alice"], expected);
    }
    let balance: i64 = client
        .get(format!("{base}/balance/alice"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(balance, OPENING_BALANCE - 30);
}

#[tokio::test]
async fn a_refused_charge_is_final_and_a_missing_key_is_refused() {
    let (base, ledger) = start().await;
    let client = reqwest::Client::new();
    let too_much = charge(&client, &base, "big", 1000).send().await.unwrap();
    assert_eq!(too_much.status().as_u16(), 402);
    let again = charge(&client, &base, "big", 1000).send().await.unwrap();
    assert_eq!(again.status().as_u16(), 402);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let no_key = client
        .post(format!("{base}/charge"))
        .header("content-type", "application/json")
        .body(r#"{"account":"alice","amount":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status().as_u16(), 400);
    assert!(ledger.lock().unwrap().rows.is_empty());
}
