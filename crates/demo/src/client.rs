//! The demo's client: a timeout shorter than many generations, and
//! retries with backoff. It does one thing right: the idempotency key is
//! minted once per operation and sent on every attempt.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idemgate_layer::IDEMPOTENT_REPLAYED;
use idemgate_llm_sim::LATENCY_HEADER;

use crate::Timing;
use crate::request::ReportRequest;
use crate::workload::Operation;

/// How one operation went, from the client's side.
#[derive(Clone, Debug, Default)]
pub(crate) struct OpOutcome {
    pub(crate) attempts: u64,
    pub(crate) timeouts: u64,
    pub(crate) other_failures: u64,
    pub(crate) answered: bool,
    /// The answer carried `Idempotent-Replayed: true`.
    pub(crate) replayed: bool,
}

/// Every operation's outcome, in workload order.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) per_op: Vec<OpOutcome>,
    pub(crate) elapsed: Duration,
}

/// Runs every operation at once, each with its retries.
pub(crate) async fn perform_all(
    url: &str,
    ops: &[Operation],
    timing: &Timing,
) -> Result<Outcome, Box<dyn std::error::Error + Send + Sync>> {
    // A fresh pool per run: the runs share nothing.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(ops.len())
        .build()?;
    let started = Instant::now();
    let per_op = join_all(ops.iter().map(|op| perform(&http, url, op, timing))).await;
    Ok(Outcome {
        per_op,
        elapsed: started.elapsed(),
    })
}

async fn perform(http: &reqwest::Client, url: &str, op: &Operation, t: &Timing) -> OpOutcome {
    let body = ReportRequest {
        operation: op.id.clone(),
        account: op.account.clone(),
    };
    let mut out = OpOutcome::default();
    for attempt in 0..t.attempts as usize {
        if attempt > 0 {
            let sleep = op.backoffs.get(attempt - 1).copied().unwrap_or_default();
            tokio::time::sleep(sleep).await;
        }
        out.attempts += 1;
        let latency = op.latencies.get(attempt).copied().unwrap_or(t.latency_max);
        let request = http
            .post(url)
            .header("idempotency-key", op.key.as_str())
            // The simulator's knob: how slow the model is on this attempt.
            .header(LATENCY_HEADER, latency.as_millis().to_string())
            .json(&body)
            .send();
        let answer = tokio::time::timeout(t.client_timeout, async {
            let resp = request.await?;
            let status = resp.status();
            let replayed = resp
                .headers()
                .get(IDEMPOTENT_REPLAYED)
                .is_some_and(|v| v.as_bytes() == b"true");
            let _ = resp.bytes().await?;
            Ok::<_, reqwest::Error>((status, replayed))
        })
        .await;
        match answer {
            Err(_elapsed) => out.timeouts += 1,
            Ok(Ok((status, replayed))) if status.is_success() => {
                out.answered = true;
                out.replayed = replayed;
                return out;
            }
            Ok(Ok(_)) | Ok(Err(_)) => out.other_failures += 1,
        }
    }
    out
}
