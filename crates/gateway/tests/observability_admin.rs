//! The admin listener's data: a key's timeline (off without an admin
//! token, refused without the right one, the attempts in order, a running
//! key as PENDING), and which admin endpoints need the token.
//!
//! The real gateway (`serve` on 127.0.0.1:0) runs in front of the simulated
//! LLM upstream; the shared helpers are in `support/observability.rs`.

mod support;

use std::time::Duration;

use idemgate_llm_sim::LATENCY_HEADER;
use support::TestGateway;
use support::observability::*;

const ADMIN_TOKEN: &str = "admin-token-for-tests-3b9e";

/// A key's timeline from the admin listener, with `token` as the bearer
/// token and a raw `credential` in `X-Idemgate-Credential` when given;
/// returns the status and the JSON body.
async fn timeline(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    query: &str,
    token: Option<&str>,
    credential: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut b = client.get(format!("{}/admin/keys/{key}/timeline?{query}", gw.admin));
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    if let Some(c) = credential {
        b = b.header("x-idemgate-credential", c);
    }
    let r = b.send().await.expect("send the request");
    let status = r.status().as_u16();
    let bytes = r.bytes().await.expect("read the response body");
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

fn outcomes(v: &serde_json::Value) -> Vec<String> {
    v["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Without a configured admin token the timeline is off: 403 with a
/// problem saying how to turn it on, whatever the request sends.
#[tokio::test]
async fn timeline_is_disabled_without_an_admin_token() {
    let (_sim, gw, client) = sim_and_gateway(None, |_| {}).await;
    for token in [None, Some(ADMIN_TOKEN), Some("")] {
        let (status, v) = timeline(&client, &gw, "any-key", "", token, None).await;
        assert_eq!(status, 403);
        assert_eq!(v["type"], "https://idemgate.dev/problems/admin-disabled");
        assert!(
            v["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("admin_token"),
            "{v}"
        );
    }
    gw.stop().await.expect("stop cleanly");
}

/// With a token configured: 401 without it, with a wrong one, or with
/// another scheme; nothing about the key is revealed.
#[tokio::test]
async fn timeline_refuses_missing_and_wrong_tokens() {
    let (_sim, gw, client) = sim_and_gateway(Some(ADMIN_TOKEN), |_| {}).await;
    exchange(&client, &gw, "tl-secret", chat(false, "hidden"), 200).await;
    let wrong = format!("{ADMIN_TOKEN}x");
    for token in [None, Some(wrong.as_str()), Some("admin"), Some("")] {
        let (status, v) = timeline(&client, &gw, "tl-secret", "", token, None).await;
        assert_eq!(status, 401, "{token:?}");
        assert_eq!(v["type"], "https://idemgate.dev/problems/unauthorized");
        assert!(v.get("attempts").is_none());
    }
    let basic = client
        .get(format!("{}/admin/keys/tl-secret/timeline", gw.admin))
        .header("authorization", format!("Basic {ADMIN_TOKEN}"));
    let r = expect_status(basic, 401).await;
    assert!(r.headers().contains_key("www-authenticate"));
    gw.stop().await.expect("stop cleanly");
}

/// Execute, replay, mismatch: the timeline lists the three attempts in
/// order with replica, status and latency; the record is DONE with the
/// upstream's status. The tenant is given as an id or as the credential;
/// another tenant sees nothing.
#[tokio::test]
async fn timeline_lists_execute_replay_and_mismatch() {
    let (_sim, gw, client) = sim_and_gateway(Some(ADMIN_TOKEN), |_| {}).await;
    let key = "tl-key-1";
    for (body, expected) in [
        (chat(false, "timeline"), 200),
        (chat(false, "timeline"), 200),
        (chat(false, "a different payload"), 422),
    ] {
        exchange(&client, &gw, key, body, expected).await;
    }
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    // A store may record replays and mismatches in the background (best
    // effort, batched): wait until the third attempt is visible.
    let first = format!("tenant={tenant}&namespace=obs");
    for _ in 0..200 {
        let (_, v) = timeline(&client, &gw, key, &first, Some(ADMIN_TOKEN), None).await;
        if outcomes(&v).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for (query, credential) in [
        (first.clone(), None),
        (format!("tenant={tenant}"), None),
        ("namespace=%2Fv1".to_owned(), Some(CREDENTIAL)),
    ] {
        let (status, v) = timeline(&client, &gw, key, &query, Some(ADMIN_TOKEN), credential).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["key"], key);
        assert_eq!(v["tenant"], tenant.as_str());
        assert_eq!(v["namespace"], "obs");
        assert_eq!(v["state"], "done");
        assert_eq!(v["status"], 200);
        assert_eq!(outcomes(&v), ["executed", "replayed", "mismatch"], "{v}");
        let attempts = v["attempts"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(attempts[0]["status"], 200);
        for a in attempts {
            assert!(!a["replica"].as_str().unwrap_or_default().is_empty(), "{a}");
            assert!(a["latency_us"].is_u64(), "{a}");
            assert!(a["at"].as_str().unwrap_or_default().ends_with('Z'), "{a}");
        }
        // The credential is never echoed.
        assert!(!v.to_string().contains("sk-observability"));
    }
    // Another tenant (here: no credential) has no such key.
    let (status, v) = timeline(&client, &gw, key, "", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, 200);
    assert_eq!(v["tenant"], "anonymous");
    assert_eq!(v["state"], "absent");
    assert_eq!(outcomes(&v), Vec::<String>::new());
    // Bad requests: unknown namespace, both tenant forms, a malformed key.
    let (status, v) = timeline(
        &client,
        &gw,
        key,
        &format!("tenant={tenant}&namespace=nope"),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404, "{v}");
    let (status, _) = timeline(
        &client,
        &gw,
        key,
        &format!("tenant={tenant}"),
        Some(ADMIN_TOKEN),
        Some("x"),
    )
    .await;
    assert_eq!(status, 400);
    // A credential in the URL is refused, with the header named.
    let query = format!("credential={}", url_encode(CREDENTIAL));
    let (status, v) = timeline(&client, &gw, key, &query, Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("X-Idemgate-Credential"),
        "{v}"
    );
    assert!(!v.to_string().contains("sk-observability"), "{v}");
    let long = "k".repeat(300);
    let (status, _) = timeline(&client, &gw, &long, "", Some(ADMIN_TOKEN), None).await;
    assert_eq!(status, 400);
    gw.stop().await.expect("stop cleanly");
}

/// A key whose execution is running shows as PENDING.
#[tokio::test]
async fn timeline_shows_a_running_key_as_pending() {
    let (sim, gw, client) = sim_and_gateway(Some(ADMIN_TOKEN), |r| {
        r.timeouts = Some(patient_timeouts());
    })
    .await;
    let slow = tokio::spawn(
        post(&client, &gw, "tl-pending", chat(false, "slow"))
            .header(LATENCY_HEADER, "60000")
            .send(),
    );
    while sim.stats().requests == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, v) = timeline(
        &client,
        &gw,
        "tl-pending",
        "",
        Some(ADMIN_TOKEN),
        Some(CREDENTIAL),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["state"], "pending", "{v}");
    assert!(v["lease_expires_at_ms"].is_u64());
    gw.stop().await.expect("stop cleanly");
    let _ = slow.await;
}

/// The status of the answer to `req`.
async fn status_of(req: reqwest::RequestBuilder) -> u16 {
    req.send()
        .await
        .expect("send the request")
        .status()
        .as_u16()
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Only the probes and the scrape endpoint are open; the dashboard page is
/// static (no data), and its data endpoints need the token like every
/// `/admin/` endpoint.
#[tokio::test]
async fn admin_data_endpoints_need_the_token_probes_and_metrics_do_not() {
    let (sim, gw, client) = sim_and_gateway(Some(ADMIN_TOKEN), |_| {}).await;
    for open in ["/healthz", "/readyz", "/metrics", "/"] {
        let r = client.get(format!("{}{open}", gw.admin));
        assert_eq!(status_of(r).await, 200, "{open}");
    }
    let page = client.get(format!("{}/", gw.admin)).send().await.unwrap();
    assert!(!page.text().await.unwrap().contains("requests_total\":"));
    for data in ["/admin/stats", "/admin/recent"] {
        let url = format!("{}{data}", gw.admin);
        assert_eq!(status_of(client.get(&url)).await, 401, "{data}");
        let wrong = client.get(&url).bearer_auth("wrong");
        assert_eq!(status_of(wrong).await, 401, "{data}");
        let r = client
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{data}");
        let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        if data == "/admin/stats" {
            assert!(v["requests_total"].is_u64(), "{v}");
            // The alert it mirrors: the shipped rule without `alert_rules`.
            let alert = &v["hit_ratio_alert"];
            assert_eq!(alert["alert"], "IdempotencyHitRatioSurge", "{v}");
            assert_eq!(alert["factor"], 2.0, "{v}");
            assert_eq!(alert["floor"], 0.01, "{v}");
            assert_eq!(alert["source"], "shipped", "{v}");
        } else {
            assert!(
                v["inflight"].is_array() && v["most_retried"].is_array(),
                "{v}"
            );
            assert_eq!(v["capacity"], 500, "{v}");
        }
    }
    gw.stop().await.expect("stop cleanly");

    // Without a configured token the data endpoints are off, never open.
    let gw = start_with(&sim.url(), None, |_| {}).await;
    for data in ["/admin/stats", "/admin/recent"] {
        let r = client.get(format!("{}{data}", gw.admin));
        assert_eq!(status_of(r).await, 403, "{data}");
    }
    gw.stop().await.expect("stop cleanly");
}
