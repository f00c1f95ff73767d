//! How `idemgate keys show` prints what it found: a readable timeline for
//! people, or JSON for scripts.

use std::time::{Duration, UNIX_EPOCH};

use idemgate_engine::backend::now_ms;
use idemgate_engine::{Record, RecordState};
use idemgate_gateway::config::StoreUrl;
use idemgate_layer::StoredResponse;
use serde_json::json;

use super::Found;

fn rfc3339(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// `in 23h 59m` / `3m ago`, to the second.
fn relative(at_ms: u64) -> String {
    let now = now_ms();
    let secs = |ms: u64| humantime::format_duration(Duration::from_secs(ms / 1000)).to_string();
    if at_ms >= now {
        format!("in {}", secs(at_ms - now))
    } else {
        format!("{} ago", secs(now - at_ms))
    }
}

fn latency(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.3}s", us as f64 / 1e6)
    } else if us >= 1000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{us}µs")
    }
}

fn state_line(record: Option<&Record>) -> String {
    match record.map(|r| &r.state) {
        None => "absent (never seen, released after a failure, or expired)".to_owned(),
        Some(RecordState::Pending {
            fence,
            lease_expires_at_ms,
        }) => format!(
            "PENDING: running now (fence {fence}); lease expires {} ({})",
            rfc3339(*lease_expires_at_ms),
            relative(*lease_expires_at_ms)
        ),
        Some(RecordState::Done {
            payload,
            expires_at_ms,
        }) => {
            let what = match StoredResponse::decode(payload) {
                Ok(r) => {
                    let tokens = r
                        .usage
                        .map(|u| format!(", {} tokens", u.total()))
                        .unwrap_or_default();
                    format!(
                        "{} response stored, {} body bytes{tokens}",
                        r.status.as_u16(),
                        r.body.len()
                    )
                }
                Err(e) => format!("{} bytes stored ({e})", payload.len()),
            };
            format!(
                "DONE: {what}; expires {} ({})",
                rfc3339(*expires_at_ms),
                relative(*expires_at_ms)
            )
        }
    }
}

pub(super) fn text(url: &StoreUrl, f: &Found) -> String {
    let mut out = String::new();
    let s = &f.scoped;
    out.push_str(&format!("key          {}\n", s.key.as_str()));
    out.push_str(&format!("tenant       {} ({})\n", s.tenant, f.tenant_from));
    out.push_str(&format!("namespace    {}\n", s.namespace));
    out.push_str(&format!("store        {url}\n"));
    out.push_str(&format!("state        {}\n", state_line(f.record.as_ref())));
    if let Some(r) = &f.record {
        out.push_str(&format!("fingerprint  {}\n", &r.fingerprint.to_hex()[..16]));
    }
    out.push('\n');
    if f.timeline.is_empty() {
        out.push_str("no attempts recorded\n");
        return out;
    }
    let width = f
        .timeline
        .iter()
        .map(|a| a.replica.len())
        .max()
        .unwrap_or(0)
        .max("REPLICA".len());
    out.push_str(&format!(
        "{:<24}  {:<width$}  {:<9}  {:>6}  {:>10}  {}\n",
        "TIME (UTC)", "REPLICA", "OUTCOME", "STATUS", "LATENCY", "COUNT"
    ));
    for a in &f.timeline {
        // An entry that stands for several attempts (replays gathered over
        // one flush) names how many, and until when.
        let count = match a.repeated {
            Some(r) => format!("{} until {}", r.count, rfc3339(r.last_at_ms)),
            None => "1".to_owned(),
        };
        out.push_str(&format!(
            "{:<24}  {:<width$}  {:<9}  {:>6}  {:>10}  {count}\n",
            rfc3339(a.at_ms),
            a.replica,
            a.outcome.as_str(),
            a.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            latency(a.latency_us)
        ));
    }
    let mut tally: Vec<(&str, u64)> = Vec::new();
    for a in &f.timeline {
        match tally.iter_mut().find(|(o, _)| *o == a.outcome.as_str()) {
            Some((_, n)) => *n += a.count(),
            None => tally.push((a.outcome.as_str(), a.count())),
        }
    }
    let total: u64 = tally.iter().map(|(_, n)| n).sum();
    let tally: Vec<String> = tally.iter().map(|(o, n)| format!("{n} {o}")).collect();
    out.push_str(&format!("\n{total} attempts: {}\n", tally.join(", ")));
    out
}

pub(super) fn as_json(url: &StoreUrl, f: &Found) -> serde_json::Value {
    let record = match f.record.as_ref().map(|r| (&r.state, r)) {
        None => json!(null),
        Some((
            RecordState::Pending {
                fence,
                lease_expires_at_ms,
            },
            r,
        )) => json!({
            "state": "pending",
            "fence": fence,
            "lease_expires_at_ms": lease_expires_at_ms,
            "fingerprint": r.fingerprint.to_hex(),
        }),
        Some((
            RecordState::Done {
                payload,
                expires_at_ms,
            },
            r,
        )) => {
            let stored = StoredResponse::decode(payload).ok();
            json!({
                "state": "done",
                "expires_at_ms": expires_at_ms,
                "fingerprint": r.fingerprint.to_hex(),
                "status": stored.as_ref().map(|s| s.status.as_u16()),
                "body_bytes": stored.as_ref().map(|s| s.body.len()),
                "usage": stored.as_ref().and_then(|s| s.usage).map(|u| json!({
                    "prompt_tokens": u.prompt_tokens,
                    "completion_tokens": u.completion_tokens,
                })),
            })
        }
    };
    json!({
        "key": f.scoped.key.as_str(),
        "tenant": f.scoped.tenant,
        "tenant_from": f.tenant_from,
        "namespace": f.scoped.namespace,
        "store": url.to_string(),
        "state": match &f.record { None => "absent", Some(r) if r.is_done() => "done", Some(_) => "pending" },
        "record": record,
        "timeline": f.timeline,
    })
}
