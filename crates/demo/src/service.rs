//! The report service: `POST /reports` asks the LLM for a report, then
//! charges the account one credit. The work runs in its own task, so it
//! finishes (generation billed, charge made) even when the client has
//! already given up, as a real server's would.
//!
//! It also runs one whole pass of the demo (`run_once`): it starts the
//! service, drives the retrying client (`client`) against it and counts
//! what it cost. The body both sides exchange lives in `request`, so the
//! client does not depend on this module.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idemgate_engine::{Engine, Policy};
use idemgate_layer::{IdempotencyLayer, LayerConfig, OnInflight};
use idemgate_llm_sim::{LATENCY_HEADER, SimHandle};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::request::ReportRequest;
use crate::workload::Operation;
use crate::{DemoError, Protection, RunStats, Timing, client};

/// Tokens the simulated model writes per report.
pub(crate) const COMPLETION_TOKENS: u32 = 400;

/// Charges per operation.
#[derive(Debug, Default)]
struct Ledger {
    charges: BTreeMap<String, u64>,
}

#[derive(Clone, Debug)]
struct AppState {
    llm: String,
    http: reqwest::Client,
    /// A std `Mutex`: never held across an `.await`.
    ledger: Arc<Mutex<Ledger>>,
    /// Work started and not yet finished, so a run can wait for the work
    /// its clients abandoned before counting.
    active: Arc<AtomicUsize>,
}

/// Decrements the active count however the work ends.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn create_report(
    State(s): State<AppState>,
    headers: HeaderMap,
    Json(req): Json<ReportRequest>,
) -> Response {
    let latency = headers
        .get(LATENCY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    s.active.fetch_add(1, Ordering::SeqCst);
    let guard = Active(Arc::clone(&s.active));
    // Spawned: the client leaving drops this handler, not the work.
    let work = tokio::spawn(async move {
        let _guard = guard;
        report(&s, &req, latency).await
    });
    match work.await {
        Ok(Ok(body)) => (StatusCode::CREATED, Json(body)).into_response(),
        Ok(Err(e)) => (StatusCode::BAD_GATEWAY, e).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Layer 1 (the LLM call), then layer 2 (the charge).
async fn report(s: &AppState, req: &ReportRequest, latency: Option<u64>) -> Result<Value, String> {
    let prompt = format!(
        "Write the quarterly usage report for account {}: activity, spend and anomalies.",
        req.account
    );
    let mut call = s
        .http
        .post(format!("{}/v1/chat/completions", s.llm))
        .json(&json!({
            "model": "sim-report-1",
            "messages": [{"role": "user", "content": prompt}],
        }));
    if let Some(ms) = latency {
        call = call.header(LATENCY_HEADER, ms.to_string());
    }
    let answer: Value = call
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("LLM call failed: {e}"))?
        .json()
        .await
        .map_err(|e| format!("LLM answer unreadable: {e}"))?;
    let charge = {
        let mut l = s.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let n = l.charges.entry(req.operation.clone()).or_default();
        *n += 1;
        *n
    };
    Ok(json!({
        "operation": req.operation,
        "account": req.account,
        "tokens": answer.pointer("/usage/total_tokens"),
        "charge": charge,
        "report": answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(|t| t.chars().take(60).collect::<String>()),
    }))
}

fn other<E: std::error::Error + Send + Sync + 'static>(
    e: E,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

/// One run: the service (protected or not), the whole workload, then a
/// wait for abandoned work to finish, then the counts.
pub(crate) async fn run_once(
    sim: &SimHandle,
    ops: &[Operation],
    timing: &Timing,
    protection: Protection,
) -> Result<RunStats, DemoError> {
    let state = AppState {
        llm: sim.url(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| DemoError::Client(other(e)))?,
        ledger: Arc::default(),
        active: Arc::default(),
    };
    let routes = Router::new().route("/reports", post(create_report));
    let mut store_dir = None;
    let mut sqlite = None;
    let mut layer = None;
    let app = match protection {
        Protection::None => routes.with_state(state.clone()),
        Protection::Idemgate => {
            let dir = tempfile::tempdir().map_err(|e| DemoError::Store(other(e)))?;
            let path = dir.path().join("idemgate.db");
            let store =
                tokio::task::spawn_blocking(move || idemgate_sqlite::SqliteStore::open(path))
                    .await
                    .map_err(|e| DemoError::Store(other(e)))?
                    .map_err(|e| DemoError::Store(other(e)))?;
            let engine = Engine::new(Arc::new(store.clone())).with_policy(
                Policy::default()
                    .pending_ttl(Duration::from_secs(10))
                    .done_ttl(Duration::from_secs(3600)),
            );
            let l = IdempotencyLayer::new(
                engine,
                LayerConfig {
                    // A retry that meets the running first attempt waits
                    // for its result instead of running it again.
                    on_inflight: OnInflight::Wait(Duration::from_secs(30)),
                    completion_timeout: Duration::from_secs(60),
                    ..LayerConfig::new("reports")
                },
            );
            store_dir = Some(dir);
            sqlite = Some(store);
            layer = Some(l.clone());
            routes.layer(l).with_state(state.clone())
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(DemoError::Listen)?;
    let addr = listener.local_addr().map_err(DemoError::Listen)?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .into_future(),
    );

    let url = format!("http://{addr}/reports");
    let outcome = client::perform_all(&url, ops, timing).await;

    // Work whose client left is still running: let it finish, as it would
    // in production, before counting what it cost.
    let deadline = Instant::now() + timing.latency_max * 4 + Duration::from_secs(10);
    let mut quiet_checks = 0;
    while quiet_checks < 3 && Instant::now() < deadline {
        if state.active.load(Ordering::SeqCst) == 0 {
            quiet_checks += 1;
        } else {
            quiet_checks = 0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(l) = &layer {
        l.shutdown(Duration::from_secs(5)).await;
    }
    let _ = stop_tx.send(());
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        // Connections still open after the work finished; nothing to wait for.
    }
    if let Some(s) = sqlite {
        s.close();
    }
    drop(store_dir);

    let outcome = outcome.map_err(DemoError::Client)?;
    let sim_stats = sim.stats();
    let ledger = state.ledger.lock().unwrap_or_else(PoisonError::into_inner);
    let charges: u64 = ledger.charges.values().sum();
    let duplicate_charges: u64 = ledger.charges.values().map(|n| n.saturating_sub(1)).sum();
    let charged_unanswered = ops
        .iter()
        .zip(&outcome.per_op)
        .filter(|(op, o)| !o.answered && ledger.charges.contains_key(&op.id))
        .count();
    Ok(RunStats {
        operations: ops.len(),
        attempts: outcome.per_op.iter().map(|o| o.attempts).sum(),
        timeouts: outcome.per_op.iter().map(|o| o.timeouts).sum(),
        other_failures: outcome.per_op.iter().map(|o| o.other_failures).sum(),
        answered: outcome.per_op.iter().filter(|o| o.answered).count(),
        replayed_answers: outcome.per_op.iter().filter(|o| o.replayed).count(),
        llm_executions: sim_stats.executions,
        billed_tokens: sim_stats.prompt_tokens_billed + sim_stats.completion_tokens_billed,
        charges,
        duplicate_charges,
        charged_unanswered,
        client_time: outcome.elapsed,
    })
}
