//! The admin dashboard as a person sees it: the real gateway after a
//! scripted workload (replays, a key retried five times, a slow request
//! still in flight and a duplicate refused while it runs), the page in
//! headless Chromium driven as a person would (typing the admin token,
//! clicking rows, typing a credential into the lookup), and assertions on
//! what the page shows: the figures, the hit ratio against the alert's
//! threshold, the recent-keys table, and the timelines the clicks open.
//!
//! Needs Debian's `chromium` (or `CHROMIUM=/path`). Under `CI=true` a
//! missing browser fails the test; elsewhere the test says so and skips.
//! One test in this binary: the metrics recorder is process-wide.

mod support;

use support::TestGateway;

use std::path::PathBuf;
use std::time::Duration;

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::element::Element;
use chromiumoxide::page::{Page, ScreenshotParams};
use futures_util::StreamExt;
use idemgate_gateway::config::RawInflightMode;
use idemgate_llm_sim::SimConfig;

const CREDENTIAL: &str = "Bearer sk-dashboard-credential-41aa";
const ADMIN_TOKEN: &str = "dashboard-admin-token-6c1d";

/// The browser, if there is one.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|n| dir.join(n)))
        .find(|p| p.is_file())
}

/// The value of a JavaScript expression evaluated in the page.
async fn js<T: serde::de::DeserializeOwned>(page: &Page, expr: &str) -> T {
    page.evaluate(expr)
        .await
        .unwrap_or_else(|e| panic!("evaluate {expr}: {e}"))
        .into_value()
        .unwrap_or_else(|e| panic!("value of {expr}: {e}"))
}

/// The text the element with `id` shows.
async fn text(page: &Page, id: &str) -> String {
    js::<String>(
        page,
        &format!("document.getElementById({id:?}).textContent.trim()"),
    )
    .await
}

/// Waits until `expr` is true in the page (the page polls every 2 s).
async fn until(page: &Page, expr: &str) {
    for _ in 0..300 {
        if js::<bool>(page, expr).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dom = page.content().await.unwrap_or_default();
    panic!("the page never showed `{expr}`:\n{dom}");
}

/// The cells of every row of the table `selector` matches, as shown.
async fn rows(page: &Page, selector: &str) -> Vec<Vec<String>> {
    js(
        page,
        &format!(
            "Array.from(document.querySelectorAll({selector:?})).map(tr => \
             Array.from(tr.cells).map(td => td.textContent.trim()))"
        ),
    )
    .await
}

/// Sends one chat completion with `key` and the tenant's credential.
async fn send(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    content: &str,
    extra: Option<(&str, &str)>,
) -> reqwest::Response {
    let body = serde_json::json!({
        "model": "sim-1",
        "messages": [{"role": "user", "content": content}],
    })
    .to_string();
    let mut req = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", CREDENTIAL)
        .header("idempotency-key", key)
        .body(body);
    if let Some((name, value)) = extra {
        req = req.header(name, value);
    }
    req.send().await.expect("send the request")
}

/// The tokens a 200 answer's `usage` says were billed.
async fn tokens(r: reqwest::Response) -> u64 {
    assert_eq!(r.status(), 200);
    let v: serde_json::Value =
        serde_json::from_slice(&r.bytes().await.expect("read the response body"))
            .expect("valid JSON");
    v["usage"]["total_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"))
}

/// GET on the admin listener with the token, as JSON.
async fn admin_json(client: &reqwest::Client, url: String) -> serde_json::Value {
    serde_json::from_slice(
        &client
            .get(url)
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .send()
            .await
            .expect("send the request")
            .bytes()
            .await
            .expect("read the response body"),
    )
    .expect("valid JSON")
}

#[tokio::test]
async fn the_dashboard_shows_recent_keys_the_alert_threshold_and_timelines() {
    let Some(browser_path) = chromium() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("chromium is not installed (apt-get install -y chromium)");
        }
        eprintln!("SKIPPED: chromium is not installed (apt-get install -y chromium)");
        return;
    };
    let sim = idemgate_llm_sim::spawn(SimConfig::default())
        .await
        .expect("spawn the process");
    let dir = tempfile::tempdir().expect("create a temp dir");
    // On a fresh SQLite file; the route keeps the gateway's default timeouts.
    let gw = TestGateway::builder(&sim.url())
        .on_inflight(RawInflightMode::Reject)
        .route(|r| {
            r.id = Some("chat".into());
            r.timeouts = None;
        })
        .config(|c| {
            c.shutdown_grace = Some("1s".into());
            c.admin_token = Some(ADMIN_TOKEN.into());
        })
        .start()
        .await;
    let (base, admin_url) = (gw.base.clone(), gw.admin.clone());
    let client = reqwest::Client::new();
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());

    // 4 keys x 3 sends and one key sent 5 times: 5 executions, 12 replays.
    let mut saved = 0u64;
    for k in 0..4 {
        let content = "dashboard ".repeat(k + 1);
        let key = format!("dash-key-{k}");
        let first = tokens(send(&client, &base, &key, &content, None).await).await;
        for _ in 0..2 {
            assert_eq!(
                tokens(send(&client, &base, &key, &content, None).await).await,
                first
            );
            saved += first;
        }
    }
    let first = tokens(send(&client, &base, "dash-retried", "retried", None).await).await;
    for _ in 0..4 {
        tokens(send(&client, &base, "dash-retried", "retried", None).await).await;
        saved += first;
    }
    assert_eq!(sim.stats().executions, 5);
    // Two requests without a key: the optional route forwards them
    // unprotected, and the page shows the route's protected share.
    for _ in 0..2 {
        let unkeyed = client
            .post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("authorization", CREDENTIAL)
            .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"no key"}]}"#)
            .send()
            .await
            .expect("send the request");
        assert_eq!(unkeyed.status(), 200);
    }

    // A slow generation (a minute) stays in flight; its duplicate is
    // refused with 409 meanwhile: one in-flight conflict.
    let slow_client = client.clone();
    let slow_base = base.clone();
    let slow = tokio::spawn(async move {
        send(
            &slow_client,
            &slow_base,
            "dash-slow",
            "slow",
            Some(("x-sim-latency-ms", "60000")),
        )
        .await
    });
    for _ in 0..300 {
        let recent = admin_json(&client, format!("{admin_url}/admin/recent")).await;
        if recent["inflight"].as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dup = send(&client, &base, "dash-slow", "slow", None).await;
    assert_eq!(dup.status(), 409);

    // The replays' timeline entries are gathered and written in the
    // background: wait until the API accounts for all five attempts (an
    // entry may stand for several) before the page looks.
    for _ in 0..200 {
        let v = admin_json(
            &client,
            format!("{admin_url}/admin/keys/dash-retried/timeline?tenant={tenant}"),
        )
        .await;
        let counted: u64 = v["attempts"].as_array().map_or(0, |a| {
            a.iter().map(|e| e["count"].as_u64().unwrap_or(1)).sum()
        });
        if counted >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let profile = dir.path().join("chromium-profile");
    let (mut browser, mut handler) = Browser::launch(
        BrowserConfig::builder()
            .chrome_executable(&browser_path)
            .no_sandbox()
            .user_data_dir(&profile)
            .window_size(1280, 1500)
            .viewport(None)
            .args(["disable-gpu", "disable-quic"])
            .build()
            .expect("a browser configuration"),
    )
    .await
    .expect("launch chromium");
    let events = tokio::spawn(async move { while handler.next().await.is_some() {} });

    // A person opens the page and types the admin token.
    let page = browser
        .new_page(format!("{admin_url}/"))
        .await
        .expect("open the dashboard");
    click(&page, "#f-token", "the token field")
        .await
        .type_str(ADMIN_TOKEN)
        .await
        .expect("type the token");
    until(
        &page,
        "document.querySelectorAll('tr.recent-row').length >= 7",
    )
    .await;
    until(
        &page,
        "document.getElementById('status').textContent.startsWith('updated')",
    )
    .await;

    // The figures: 12 hits of 18 keyed requests (the 409 counts, the slow
    // request not yet).
    assert_eq!(text(&page, "hit-ratio").await, "66.7%");
    assert_eq!(text(&page, "hits").await, "12");
    assert_eq!(text(&page, "requests").await, "18");
    assert_eq!(text(&page, "tokens-saved").await, saved.to_string());
    assert_eq!(text(&page, "conflicts").await, "1");
    assert_eq!(text(&page, "per-key-p50").await, "3");
    // 18 keyed requests and 2 unkeyed on the one route: 90% protected.
    assert_eq!(
        rows(&page, "#routes tbody tr").await,
        vec![vec!["chat", "20", "90.0%", "2", "0"]]
    );
    assert!(
        js::<bool>(
            &page,
            "document.querySelector('#spark-hit-ratio polyline') !== null"
        )
        .await
    );

    // The hit ratio against the alert: a new process has no baseline yet
    // (the rule's is the hour that ended 15 minutes ago), and the threshold
    // is the shipped rule's: twice the baseline, at least 2%.
    let baseline = text(&page, "hit-baseline").await;
    assert!(
        baseline == "in 15 min" || baseline == "in 14 min",
        "{baseline}"
    );
    assert_eq!(
        text(&page, "hit-threshold").await,
        "2× baseline, at least 2.0%"
    );
    let state = text(&page, "alert-state").await;
    assert!(
        state.starts_with("IdempotencyHitRatioSurge: no baseline yet"),
        "{state}"
    );

    // The recent keys: why, key, route, tenant, requests, last outcome, when.
    let table = rows(&page, "tr.recent-row").await;
    let shown: Vec<(&str, &str)> = table
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            ("in flight", "dash-slow"),
            ("conflict", "dash-slow"),
            ("retried", "dash-retried"),
            ("retried", "dash-key-3"),
            ("retried", "dash-key-2"),
            ("retried", "dash-key-1"),
            ("retried", "dash-key-0"),
        ],
        "{table:?}"
    );
    assert_eq!(table[0][5], "running", "{table:?}");
    assert!(table[0][6].starts_with("running for "), "{table:?}");
    assert_eq!(table[1][5], "conflict", "the duplicate's outcome");
    assert_eq!(table[2][4], "5", "requests of the retried key");
    assert_eq!(table[2][5], "replayed");
    assert!(table.iter().all(|r| r[2] == "/v1"));
    assert!(
        table
            .iter()
            .all(|r| tenant.starts_with(r[3].trim_end_matches('…'))),
        "the tenant id, never the credential: {table:?}"
    );

    // Clicking the in-flight row opens that key's timeline: still running.
    click(
        &page,
        "tr.recent-row[data-kind='inflight']",
        "the in-flight row",
    )
    .await;
    let summary = timeline_summary(&page, "dash-slow", None).await;
    assert!(summary.contains("state: pending (running)"), "{summary}");

    // Clicking the retried row: five attempts, the first one executed.
    click(
        &page,
        "tr.recent-row[data-key='dash-retried']",
        "the retried row",
    )
    .await;
    let summary = timeline_summary(&page, "dash-retried", Some(5)).await;
    assert!(summary.contains("state: done (status 200)"), "{summary}");
    assert!(summary.contains(&format!("tenant {tenant}")), "{summary}");
    let attempts = rows(&page, "tr.attempt").await;
    assert_eq!(
        expanded(&attempts),
        ["executed", "replayed", "replayed", "replayed", "replayed"]
    );
    assert_eq!(attempts[0][3], "200");
    assert!(
        attempts
            .iter()
            .all(|r| r[4].ends_with(" ms") && !r[1].is_empty())
    );

    // The lookup by credential: key typed, tenant left empty, the client's
    // credential typed; it goes in a header, never in the page's URL.
    for (field, value) in [("#f-key", "dash-key-1"), ("#f-credential", CREDENTIAL)] {
        js::<bool>(
            &page,
            &format!("(document.querySelector({field:?}).value = '', true)"),
        )
        .await;
        click(&page, field, "a lookup field")
            .await
            .type_str(value)
            .await
            .expect("type");
    }
    js::<bool>(
        &page,
        "(document.getElementById('f-tenant').value = '', true)",
    )
    .await;
    click(&page, "#lookup button[type='submit']", "the lookup button").await;
    let summary = timeline_summary(&page, "dash-key-1", Some(3)).await;
    assert!(summary.contains(&format!("tenant {tenant}")), "{summary}");
    let attempts = rows(&page, "tr.attempt").await;
    assert_eq!(expanded(&attempts), ["executed", "replayed", "replayed"]);
    let url = page.url().await.expect("the page URL").unwrap_or_default();
    assert!(!url.contains("sk-dashboard"), "{url}");

    // Neither the token nor the credential is shown anywhere on the page.
    let dom = page.content().await.expect("the page");
    assert!(!dom.contains(ADMIN_TOKEN));
    assert!(!dom.contains("sk-dashboard-credential"));

    // A screenshot for people (kept in the test's temporary directory).
    let png = page
        .screenshot(ScreenshotParams::builder().full_page(true).build())
        .await
        .expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Some(keep) = std::env::var_os("IDEMGATE_DASHBOARD_PNG") {
        std::fs::write(keep, &png).expect("write the screenshot");
    }

    browser.close().await.expect("close chromium");
    browser.wait().await.expect("chromium exits");
    events.abort();
    slow.abort();
    gw.stop().await.expect("stop cleanly");
}

/// Finds the element `selector` (`what` it is, for the failure message)
/// and clicks it (which also focuses a field); returns it.
async fn click(page: &Page, selector: &str, what: &str) -> Element {
    let element = page
        .find_element(selector)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    element.click().await.expect("click it");
    element
}

/// Waits until the timeline panel shows `key` (and, when given, that many
/// attempts); returns its summary text.
async fn timeline_summary(page: &Page, key: &str, attempts: Option<usize>) -> String {
    until(
        page,
        &format!("document.getElementById('timeline-summary').textContent.includes('{key}')"),
    )
    .await;
    if let Some(n) = attempts {
        until(page, &attempts_shown(n)).await;
    }
    text(page, "timeline-summary").await
}

/// A page condition: the timeline rows account for `n` attempts (a row of
/// gathered replays reads "replayed ×N").
fn attempts_shown(n: usize) -> String {
    format!(
        "Array.from(document.querySelectorAll('tr.attempt')).reduce((sum, r) => {{ \
           const m = r.cells[2].textContent.match(/ ×(\\d+)$/); \
           return sum + (m ? Number(m[1]) : 1); }}, 0) === {n}"
    )
}

/// The outcomes of timeline rows, a gathered row counted as its attempts.
fn expanded(rows: &[Vec<String>]) -> Vec<String> {
    rows.iter()
        .flat_map(|r| match r[2].split_once(" ×") {
            Some((outcome, n)) => {
                vec![outcome.to_owned(); n.parse::<usize>().expect("a count")]
            }
            None => vec![r[2].clone()],
        })
        .collect()
}
