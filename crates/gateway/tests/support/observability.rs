//! What the observability tests share: a gateway in front of the
//! simulated LLM with one `/v1` route (`obs`, reject mode, short
//! timeouts), a keyed chat request with a fixed credential, and the
//! reading of Prometheus exposition text (`/metrics`) into samples.

use idemgate_gateway::config::{RawInflightMode, RawRoute, RawTimeouts};
use idemgate_llm_sim::SimHandle;

pub(crate) use super::expect_status;
use super::{TestGateway, keyed_post, timeouts};

/// Starts the gateway on an SQLite store in a fresh directory.
pub(crate) async fn start(upstream: &str, tweak: impl FnOnce(&mut RawRoute)) -> TestGateway {
    start_with(upstream, None, tweak).await
}

/// As [`start`], with an admin token.
pub(crate) async fn start_with(
    upstream: &str,
    admin_token: Option<&str>,
    tweak: impl FnOnce(&mut RawRoute),
) -> TestGateway {
    TestGateway::builder(upstream)
        .route(|route| {
            route.id = Some("obs".into());
            route.on_inflight = Some(RawInflightMode::Reject);
            route.timeouts = Some(timeouts("2s", "20s", "10s", "60s"));
            tweak(route);
        })
        .config(|c| {
            c.shutdown_grace = Some("1s".into());
            c.admin_token = admin_token.map(str::to_owned);
        })
        .start()
        .await
}

/// The simulated LLM, a gateway in front of it ([`start_with`]) and a
/// client for the test.
pub(crate) async fn sim_and_gateway(
    admin_token: Option<&str>,
    tweak: impl FnOnce(&mut RawRoute),
) -> (SimHandle, TestGateway, reqwest::Client) {
    let sim = sim().await;
    let gw = start_with(&sim.url(), admin_token, tweak).await;
    (sim, gw, reqwest::Client::new())
}

/// As [`sim_and_gateway`], without an admin token, on a route with
/// [`tight_timeouts`].
pub(crate) async fn sim_and_tight_gateway() -> (SimHandle, TestGateway, reqwest::Client) {
    sim_and_gateway(None, |r| r.timeouts = Some(tight_timeouts())).await
}

/// Timeouts of a route whose upstream is failed or stalled on purpose: a
/// second to the first byte and between chunks.
pub(crate) fn tight_timeouts() -> RawTimeouts {
    timeouts("2s", "1s", "1s", "30s")
}

/// Timeouts of a route whose upstream is held slow on purpose: two minutes
/// for each phase.
pub(crate) fn patient_timeouts() -> RawTimeouts {
    timeouts("2s", "120s", "120s", "120s")
}

/// The simulated LLM with its default pacing.
pub(crate) async fn sim() -> SimHandle {
    super::sim().await
}

/// A chat completion request for `text`, streamed or not.
pub(crate) fn chat(stream: bool, text: &str) -> String {
    super::chat_body(stream, text)
}

/// The credential every request sends (its hash is the tenant).
pub(crate) const CREDENTIAL: &str = "Bearer sk-observability-credential-9d2f";

/// A keyed chat completion `POST` to the gateway, with [`CREDENTIAL`].
pub(crate) fn post(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    body: String,
) -> reqwest::RequestBuilder {
    let url = format!("{}/v1/chat/completions", gw.base);
    keyed_post(client, url, CREDENTIAL, key, body)
}

/// Sends the keyed chat `body` ([`post`]), asserts the answer's status is
/// `status`, and reads the answer to its end.
pub(crate) async fn exchange(
    client: &reqwest::Client,
    gw: &TestGateway,
    key: &str,
    body: String,
    status: u16,
) {
    let r = expect_status(post(client, gw, key, body), status).await;
    let _ = r.bytes().await;
}

/// One sample of the exposition text.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

/// Every sample of the exposition `text`, comments left out.
pub(crate) fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some(Sample {
                name: name.to_owned(),
                labels,
                value,
            })
        })
        .collect()
}

/// The sum of every sample of `name` carrying all of `labels`.
pub(crate) fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|s| s.value)
        .sum()
}

/// Whether any sample of `name` carries all of `labels`.
pub(crate) fn present(text: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    samples(text).iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
    })
}

/// Prompt plus completion tokens of a chat completion body.
pub(crate) fn total_tokens(body: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
    let usage = &v["usage"];
    let p = usage["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    let c = usage["completion_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    p + c
}
