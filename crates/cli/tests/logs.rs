//! The logs of a real `idemgate serve` process: every line about a keyed
//! request names its key and trace id, and no prompt or completion text is
//! ever written.

mod support;
use support::{MEMORY_ON_ANY_PORT, expect_status, read_log, sigterm, sim, spawn_quiet};

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// The value of `"field":"…"` in a JSON log line.
fn string_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let pat = format!("\"{field}\":\"");
    let start = line.find(&pat)? + pat.len();
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

#[tokio::test]
async fn keyed_lines_carry_key_and_trace_id_and_never_content() {
    let sim = sim().await;
    let dir = tempfile::tempdir().expect("create a temp dir");
    // Port 0 for both listeners (no race with other tests for a port); the
    // bound addresses are read from the "gateway started" log line.
    let mut child = spawn_quiet(
        Command::new(BIN)
            .args(["serve", "--upstream", &sim.url()])
            .args(MEMORY_ON_ANY_PORT)
            .env_remove("IDEMGATE_LOG")
            .env_remove("RUST_LOG")
            .current_dir(dir.path()),
        Stdio::piped(),
    );
    // A plain thread reads the log as it is written, until the pipe closes.
    let (started, reader) = read_log(&mut child).await;
    let listen = string_field(&started, "listen").unwrap_or_else(|| panic!("{started}"));
    assert!(!listen.ends_with(":0"), "{started}");
    let client = reqwest::Client::new();

    let url = format!("http://{listen}/v1/chat/completions");
    let prompt = r#"{"model":"sim-1","messages":[{"role":"user","content":"SECRET-PROMPT-7731 tell me about the harbour"}]}"#;
    let traceparent = "00-7d3f0c2a9b8e4f6a1c5d2e3f4a5b6c7d-0123456789abcdef-01";
    let client_trace = "7d3f0c2a9b8e4f6a1c5d2e3f4a5b6c7d";
    let chat = |key: &str, body: String| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body)
    };
    let mut completion = String::new();
    for attempt in 0..2 {
        let traced = chat("logs-key-1", prompt.to_owned()).header("traceparent", traceparent);
        let r = expect_status(traced, 200).await;
        assert_eq!(
            r.headers()["idempotent-replayed"],
            if attempt == 0 { "false" } else { "true" }
        );
        let body = r.text().await.expect("read the response body");
        // The simulated text is the message content; take it as the
        // completion to look for in the logs.
        completion = string_field(&body, "content")
            .unwrap_or_else(|| panic!("{body}"))
            .to_owned();
    }
    assert_eq!(sim.executions_for("logs-key-1"), 1);
    // A different payload under the same key, and a key without a trace.
    let other = prompt.replace("harbour", "lighthouse");
    expect_status(
        chat("logs-key-1", other).header("traceparent", traceparent),
        422,
    )
    .await;
    let r = expect_status(chat("logs-key-2", prompt.to_owned()), 200).await;
    let _ = r.bytes().await;

    sigterm(&child).await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap_or_else(|_| panic!("gateway did not exit after SIGTERM"))
        .expect("wait for the process");
    // The process has exited: its end of the pipe is closed.
    let stderr = tokio::task::spawn_blocking(move || reader.join())
        .await
        .expect("the blocking task did not panic")
        .unwrap_or_else(|_| panic!("log reader panicked"));
    assert!(status.success(), "exit {status:?}: {stderr}");

    let about = |key: &str| -> Vec<&str> {
        stderr
            .lines()
            .filter(|l| string_field(l, "idempotency_key") == Some(key))
            .collect()
    };
    let one = about("logs-key-1");
    // executed, replayed, mismatch: one line each at least.
    assert!(one.len() >= 3, "{stderr}");
    for line in &one {
        assert!(line.starts_with('{'), "JSON lines: {line}");
        assert_eq!(string_field(line, "trace_id"), Some(client_trace), "{line}");
    }
    let two = about("logs-key-2");
    assert!(!two.is_empty(), "{stderr}");
    for line in &two {
        let id = string_field(line, "trace_id").unwrap_or_else(|| panic!("{line}"));
        assert_eq!(id.len(), 32, "{line}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
        assert_ne!(id, client_trace);
    }
    assert!(!completion.is_empty());
    assert!(!stderr.contains("SECRET-PROMPT-7731"), "{stderr}");
    assert!(!stderr.contains("harbour"), "{stderr}");
    assert!(!stderr.contains(&completion), "{stderr}");
}
