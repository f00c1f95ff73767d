//! The admin dashboard as a person sees it: the real gateway after a small
//! workload, the page rendered by headless Chromium, and assertions on the
//! rendered DOM (hit ratio, tokens saved, a key's timeline rows).
//!
//! Needs Debian's `chromium` (or `CHROMIUM=/path`). Under `CI=true` a
//! missing browser fails the test; elsewhere the test says so and skips.
//! One test in this binary: the metrics recorder is process-wide.

mod support;

use support::TestGateway;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use idemgate_gateway::GatewayConfig;
use idemgate_gateway::config::{RawConfig, RawRoute};
use idemgate_llm_sim::SimConfig;
use tokio::process::Command;

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

/// Runs headless Chromium on `url` with `mode` (`--dump-dom` or
/// `--screenshot=…`) and returns its stdout.
async fn browse(browser: &Path, profile: &Path, url: &str, mode: &str) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,1100",
                "--virtual-time-budget=8000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(mode)
            .arg(url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("chromium did not finish"))
    .unwrap_or_else(|e| panic!("cannot run chromium: {e}"));
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text inside the element with `id` (tags inside it removed).
fn text_of(dom: &str, id: &str) -> String {
    let pat = format!("id=\"{id}\"");
    let at = dom
        .find(&pat)
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let open_end = at
        + dom[at..]
            .find('>')
            .unwrap_or_else(|| panic!("#{id} unclosed"));
    let tag_start = dom[..at]
        .rfind('<')
        .unwrap_or_else(|| panic!("#{id} no tag"));
    let tag: String = dom[tag_start + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let close = format!("</{tag}>");
    let inner_end = open_end
        + dom[open_end..]
            .find(&close)
            .unwrap_or_else(|| panic!("#{id} not closed"));
    strip_tags(&dom[open_end + 1..inner_end])
}

fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.trim().to_owned()
}

/// The cells of each `<tr class="attempt">` row.
fn timeline_rows(dom: &str) -> Vec<Vec<String>> {
    dom.split("<tr class=\"attempt\"")
        .skip(1)
        .map(|row| {
            let row = &row[..row.find("</tr>").unwrap_or(row.len())];
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let body = &cell[cell.find('>').map_or(0, |i| i + 1)..];
                    strip_tags(&body[..body.find("</td>").unwrap_or(body.len())])
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_dashboard_shows_hit_ratio_tokens_saved_and_a_timeline() {
    let Some(browser) = chromium() else {
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
    let config = GatewayConfig::from_raw(RawConfig {
        store: Some(format!("sqlite:{}", dir.path().join("dash.db").display())),
        shutdown_grace: Some("1s".into()),
        admin_token: Some(ADMIN_TOKEN.into()),
        routes: vec![RawRoute {
            id: Some("chat".into()),
            prefix: Some("/v1".into()),
            upstream: Some(sim.url()),
            key: Some("optional".into()),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })
    .expect("it succeeds");
    let gw = TestGateway::start(config).await;
    let (base, admin_url) = (gw.base.clone(), gw.admin.clone());

    // 4 keys x 3 sends: 4 executions, 8 replays; a hit ratio of 8/12.
    let client = reqwest::Client::new();
    let mut saved = 0u64;
    for k in 0..4 {
        let body = serde_json::json!({
            "model": "sim-1",
            "messages": [{"role": "user", "content": "dashboard ".repeat(k + 1)}],
        })
        .to_string();
        let mut first_usage = None;
        for _ in 0..3 {
            let r = client
                .post(format!("{base}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", CREDENTIAL)
                .header("idempotency-key", format!("dash-key-{k}"))
                .body(body.clone())
                .send()
                .await
                .expect("send the request");
            assert_eq!(r.status(), 200);
            let v: serde_json::Value =
                serde_json::from_slice(&r.bytes().await.expect("read the response body"))
                    .expect("valid JSON");
            let total = v["usage"]["total_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("{v}"));
            match first_usage {
                None => first_usage = Some(total),
                Some(u) => saved += u,
            }
        }
    }
    assert_eq!(sim.stats().executions, 4);

    // The replays' timeline entries are gathered and written in the
    // background: wait until the API accounts for all three attempts
    // before the page looks.
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    for _ in 0..200 {
        let v: serde_json::Value = serde_json::from_slice(
            &client
                .get(format!(
                    "{admin_url}/admin/keys/dash-key-0/timeline?tenant={tenant}"
                ))
                .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                .send()
                .await
                .expect("send the request")
                .bytes()
                .await
                .expect("read the response body"),
        )
        .expect("it succeeds");
        let counted: u64 = v["attempts"]
            .as_array()
            .map_or(0, |a| a.iter().filter_map(|e| e["count"].as_u64()).sum());
        if counted >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let page =
        format!("{admin_url}/?key=dash-key-0&tenant={tenant}&namespace=%2Fv1&token={ADMIN_TOKEN}");
    let profile = dir.path().join("chromium-profile");
    let dom = browse(&browser, &profile, &page, "--dump-dom").await;

    assert_eq!(text_of(&dom, "hit-ratio"), "66.7%", "{dom}");
    assert_eq!(text_of(&dom, "hits"), "8");
    assert_eq!(text_of(&dom, "requests"), "12");
    assert_eq!(text_of(&dom, "tokens-saved"), saved.to_string());
    assert_eq!(text_of(&dom, "conflicts"), "0");
    assert_eq!(text_of(&dom, "per-key-p50"), "3");
    // The sparklines were drawn from the polled history.
    assert!(dom.contains("<polyline"), "{dom}");

    let summary = text_of(&dom, "timeline-summary");
    assert!(summary.contains("dash-key-0"), "{summary}");
    assert!(summary.contains("state: done (status 200)"), "{summary}");
    assert!(summary.contains("3 attempts"), "{summary}");
    let rows = timeline_rows(&dom);
    // Replays gathered in one flush share a row: "replayed ×2".
    let mut outcomes: Vec<&str> = Vec::new();
    for r in &rows {
        match r[2].split_once(" ×") {
            Some((o, n)) => {
                let n: usize = n.parse().expect("a count");
                outcomes.extend(std::iter::repeat_n(o, n));
            }
            None => outcomes.push(r[2].as_str()),
        }
    }
    assert_eq!(outcomes, ["executed", "replayed", "replayed"], "{dom}");
    assert_eq!(rows[0][3], "200");
    assert!(
        rows.iter()
            .all(|r| r[4].ends_with(" ms") && !r[1].is_empty())
    );
    // The token was used but is not shown anywhere on the page.
    assert!(!dom.contains(ADMIN_TOKEN));

    // A screenshot for people (kept in the test's temporary directory).
    let shot = dir.path().join("dashboard.png");
    browse(
        &browser,
        &profile,
        &page,
        &format!("--screenshot={}", shot.display()),
    )
    .await;
    let png = std::fs::read(&shot).expect("read");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Some(keep) = std::env::var_os("IDEMGATE_DASHBOARD_PNG") {
        std::fs::copy(&shot, keep).expect("copy");
    }

    gw.stop().await.expect("stop cleanly");
}
