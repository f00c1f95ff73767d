//! Routes, the running server and its handle: the top of the crate, which
//! wires the request handlers (`respond`) to the shared state (`sim`) and
//! owns the listening task.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::anthropic::Anthropic;
use crate::dialect::ErrorKind;
use crate::openai::OpenAi;
use crate::respond::{error, generate};
use crate::responses::Responses;
use crate::sim::Sim;
use crate::{Execution, SimConfig, Stats, StatsSnapshot};

/// How long [`SimHandle::shutdown`] waits for connections to close before
/// it stops serving regardless.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The simulator's routes, for embedding in another server. Counters go to
/// `stats`; requests that wait forever (`x-sim-fail: hang`, `stall-after`)
/// end only when their client leaves.
pub fn router(config: SimConfig, stats: Arc<Stats>) -> Router {
    routes(Arc::new(Sim::new(config, stats)))
}

fn routes(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::<OpenAi>))
        .route("/v1/responses", post(generate::<Responses>))
        .route("/v1/messages", post(generate::<Anthropic>))
        .route("/v1/models", get(models))
        .route("/sim/stats", get(stats))
        .route("/sim/executions", get(all_executions))
        .route("/sim/executions/{key}", get(executions))
        .route("/sim/log", get(log))
        .route("/sim/reset", post(reset))
        .fallback(not_found)
        .with_state(sim)
}

async fn models(headers: HeaderMap) -> Response {
    const CREATED: u64 = 1_735_689_600; // 2025-01-01T00:00:00Z
    if headers.contains_key("anthropic-version") {
        let data: Vec<_> = ["sim-claude-small", "sim-claude-large"]
            .iter()
            .map(|id| {
                json!({
                    "type": "model",
                    "id": id,
                    "display_name": id,
                    "created_at": "2025-01-01T00:00:00Z",
                })
            })
            .collect();
        return Json(json!({
            "data": data,
            "has_more": false,
            "first_id": "sim-claude-small",
            "last_id": "sim-claude-large",
        }))
        .into_response();
    }
    let data: Vec<_> = ["sim-gpt-small", "sim-gpt-large"]
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": CREATED, "owned_by": "idemgate-sim"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn stats(State(sim): State<Arc<Sim>>) -> Json<StatsSnapshot> {
    Json(sim.stats.snapshot())
}

async fn all_executions(State(sim): State<Arc<Sim>>) -> Json<BTreeMap<String, u64>> {
    Json(sim.stats.executions_by_key())
}

async fn executions(State(sim): State<Arc<Sim>>, Path(key): Path<String>) -> Response {
    let executions = sim.stats.executions_for(&key);
    Json(json!({"key": key, "executions": executions})).into_response()
}

async fn log(State(sim): State<Arc<Sim>>) -> Json<Vec<Execution>> {
    Json(sim.stats.log())
}

async fn reset(State(sim): State<Arc<Sim>>) -> StatusCode {
    sim.stats.reset();
    StatusCode::NO_CONTENT
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error::<OpenAi>(
        StatusCode::NOT_FOUND,
        ErrorKind::NotFound,
        &format!("Unknown request URL: {method} {}", uri.path()),
    )
}

/// A running simulator. Dropping it begins shutdown; [`SimHandle::shutdown`]
/// also waits for it.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    sim: Arc<Sim>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, e.g. `http://127.0.0.1:PORT` (append `/v1/...`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of the counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.sim.stats.snapshot()
    }

    /// The live counters, shared with the server.
    pub fn stats_handle(&self) -> Arc<Stats> {
        Arc::clone(&self.sim.stats)
    }

    /// Executions counted under one idempotency key ("" = without a key).
    pub fn executions_for(&self, idempotency_key: &str) -> u64 {
        self.sim.stats.executions_for(idempotency_key)
    }

    /// Every execution since the last reset, oldest first.
    pub fn log(&self) -> Vec<Execution> {
        self.sim.stats.log()
    }

    /// Zeroes the counters.
    pub fn reset(&self) {
        self.sim.stats.reset();
    }

    /// Stops accepting, ends stalled and hanging responses, aborts running
    /// streams, and waits (up to a few seconds) for connections to close.
    pub async fn shutdown(mut self) {
        self.sim.begin_shutdown();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.sim.begin_shutdown();
    }
}

/// Starts a simulator on `127.0.0.1:0` (a free port).
pub async fn spawn(config: SimConfig) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    spawn_on(listener, config).await
}

/// Starts a simulator on an already bound listener.
pub async fn spawn_on(listener: TcpListener, config: SimConfig) -> std::io::Result<SimHandle> {
    let addr = listener.local_addr()?;
    let sim = Arc::new(Sim::new(config, Arc::new(Stats::new())));
    let app = routes(Arc::clone(&sim));
    let signal = {
        let sim = Arc::clone(&sim);
        async move { sim.shutdown_signal().await }
    };
    let task = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<crate::connection::Connection>();
        axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await
    });
    Ok(SimHandle {
        addr,
        sim,
        task: Some(task),
    })
}
