//! Traces and logs: a client's `traceparent` reaches the upstream (or the
//! gateway starts a trace), and every log line about a keyed request
//! carries its key and trace id, never prompt or completion text.
//!
//! The real gateway (`serve` on 127.0.0.1:0) runs in front of the simulated
//! LLM upstream; the shared helpers are in `support/observability.rs`.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use idemgate_llm_sim::FAIL_HEADER;
use support::observability::*;

/// An upstream that records the `traceparent` of each request it gets.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let log = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let log = Arc::clone(&log);
        async move {
            let tp = headers
                .get("traceparent")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            log.lock().expect("lock not poisoned").push(tp);
            (
                [("content-type", "application/json")],
                r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
            )
        }
    });
    let (listener, url) = idemgate_gateway::test_util::loopback().await;
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn trace_id_of(traceparent: &str) -> &str {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1].len(), 32);
    assert!(
        parts[1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(parts[1], "0".repeat(32));
    assert_eq!(parts[2].len(), 16);
    traceparent.split('-').nth(1).unwrap_or_default()
}

/// A client's valid `traceparent` reaches the upstream unchanged; without
/// one (or with an invalid one) the gateway starts a trace and sends a
/// fresh `traceparent` upstream, a new trace id per request.
#[tokio::test]
async fn traceparent_is_propagated_or_started() {
    let (upstream, seen) = recording_upstream().await;
    let gw = start(&upstream, |_| {}).await;
    let client = reqwest::Client::new();
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let send = |key: &'static str, tp: Option<&'static str>| {
        let mut b = post(&client, &gw, key, chat(false, "trace"));
        if let Some(tp) = tp {
            b = b.header("traceparent", tp);
        }
        b.send()
    };
    let r = send("trace-1", Some(given))
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-2", None).await.expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-3", None).await.expect("send the request");
    assert_eq!(r.status(), 200);
    let r = send("trace-4", Some("00-NOT-A-TRACE-01"))
        .await
        .expect("send the request");
    assert_eq!(r.status(), 200);
    let seen = seen.lock().expect("lock not poisoned").clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[0].as_deref(), Some(given));
    let fresh: Vec<String> = seen[1..]
        .iter()
        .map(|tp| {
            let tp = tp
                .as_deref()
                .unwrap_or_else(|| panic!("no traceparent upstream"));
            trace_id_of(tp).to_owned()
        })
        .collect();
    let distinct: BTreeSet<&String> = fresh.iter().collect();
    assert_eq!(distinct.len(), 3, "{fresh:?}");
    assert!(!fresh.contains(&"0af7651916cd43dd8448eb211c80319c".to_owned()));
    gw.stop().await.expect("stop cleanly");
}

/// A `MakeWriter` collecting every log line in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("lock not poisoned")
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Every line logged about a keyed request (its detached execution, the
/// proxy's upstream failures) carries the client's key and the trace id;
/// no prompt or completion text is ever logged.
#[tokio::test]
async fn keyed_log_lines_carry_key_and_trace_id_and_no_content() {
    let captured = Captured::default();
    assert!(idemgate_telemetry::logging::init_json_with(
        captured.clone()
    ));
    let (_sim, gw, client) = sim_and_tight_gateway().await;
    let given = "00-5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a-1a2b3c4d5e6f7081-01";
    let prompt = "SECRET-PROMPT-7731 what is the capital of nowhere";
    let mut completion = String::new();
    for _ in 0..2 {
        let r = post(&client, &gw, "log-key-1", chat(false, prompt))
            .header("traceparent", given)
            .send()
            .await
            .expect("send the request");
        assert_eq!(r.status(), 200);
        let v: serde_json::Value =
            serde_json::from_slice(&r.bytes().await.expect("read the response body"))
                .expect("valid JSON");
        completion = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    }
    // A mismatch and a first-byte timeout log warnings about their keys.
    let r = post(
        &client,
        &gw,
        "log-key-1",
        chat(false, "another SECRET-PROMPT-7731"),
    )
    .header("traceparent", given)
    .send()
    .await
    .expect("send the request");
    assert_eq!(r.status(), 422);
    let hang = post(&client, &gw, "log-key-2", chat(false, prompt)).header(FAIL_HEADER, "hang");
    expect_status(hang, 504).await;
    gw.stop().await.expect("stop cleanly");

    let text =
        String::from_utf8(captured.0.lock().expect("lock not poisoned").clone()).expect("UTF-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let about = |key: &str| -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["span"]["idempotency_key"] == key)
            .collect()
    };
    let one = about("log-key-1");
    let two = about("log-key-2");
    // executed (stored), mismatch; upstream timeout and the release.
    assert!(one.len() >= 2, "{text}");
    assert!(two.len() >= 2, "{text}");
    for l in &one {
        assert_eq!(
            l["span"]["trace_id"], "5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a",
            "{l}"
        );
    }
    for l in &two {
        let id = l["span"]["trace_id"].as_str().unwrap_or_default();
        assert_eq!(id.len(), 32, "{l}");
        assert_ne!(id, "5e0c1a9d4b7f4c2e8a6b3d1f0e9c8b7a");
    }
    // The proxy's timeout warning is logged inside the request's span.
    assert!(
        two.iter()
            .any(|l| l["fields"]["message"] == "upstream timeout"),
        "{text}"
    );
    assert!(!completion.is_empty());
    assert!(!text.contains("SECRET-PROMPT-7731"), "{text}");
    assert!(!text.contains(&completion), "{text}");
    let tenant = idemgate_layer::key::tenant_id(CREDENTIAL.as_bytes());
    assert!(!text.contains(&tenant));
    assert!(!text.contains("sk-observability"));
}
