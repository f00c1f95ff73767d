//! `idemgate demo`: a late-night incident replayed locally, once without
//! idemgate and once with it, and measured.
//!
//! A report service calls a slow LLM and then charges the account: a side
//! effect in the caller's own system, beyond the LLM call, that every
//! re-execution repeats. Its client has a timeout shorter than many
//! generations and retries with backoff, sending the same
//! `Idempotency-Key` on every attempt. Nothing is mocked: the LLM is
//! the simulator (`idemgate-llm-sim`) that counts executions and bills
//! tokens, the service is an axum server on `127.0.0.1:0`, the client is
//! reqwest, and the protected run puts [`idemgate_layer::IdempotencyLayer`]
//! with an SQLite store (in a temporary directory) in front of the same
//! handler. Every figure printed is counted during the run.
//!
//! # Layout
//! - `workload`: the schedule drawn from `--seed` (latency of every attempt, every
//!   backoff sleep), identical for both runs.
//! - `request`: the body the client sends and the service reads.
//! - `client`: the retrying client with the too-short timeout.
//! - `service`: the report service and its ledger of charges; runs one
//!   pass (service + client) and counts it.
//! - `render`: the side-by-side table and what it means.
//!
//! # The key decision
//! The service keeps working after its client leaves (the handler spawns
//! the work), as real servers do: a timeout does not cancel what already
//! started on the other side. That single fact is what makes unprotected
//! retries charge twice, so the demo reproduces it rather than the
//! friendlier (and unrealistic) cancel-on-disconnect of a bare handler.

mod client;
mod render;
mod request;
mod service;
mod workload;

use std::time::{Duration, Instant};

use idemgate_llm_sim::SimConfig;

pub use render::render;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoOptions {
    /// Report operations the client performs (all at once).
    pub operations: usize,
    /// Seed of the latencies and backoff sleeps: the same seed gives the
    /// same workload.
    pub seed: u64,
    /// Every duration five times shorter (tests).
    pub quick: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            operations: 12,
            seed: 2,
            quick: false,
        }
    }
}

/// The clocks of the demo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The client gives up on an attempt after this long.
    pub client_timeout: Duration,
    /// Attempts per operation, the first included.
    pub attempts: u32,
    /// Backoff before the first retry; doubles after each retry.
    pub backoff_base: Duration,
    /// Longest backoff sleep. Sleeps are drawn in `[0, backoff]` (full jitter).
    pub backoff_cap: Duration,
    /// Fastest LLM call.
    pub latency_min: Duration,
    /// Slowest LLM call.
    pub latency_max: Duration,
}

impl Timing {
    /// The demo's clocks: a 1 s client timeout against 0.4–2.5 s calls,
    /// three attempts with 0.5 s backoff doubling (all ÷5 when `quick`).
    pub fn new(quick: bool) -> Self {
        let t = Self {
            client_timeout: Duration::from_millis(1000),
            attempts: 3,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_millis(2000),
            latency_min: Duration::from_millis(400),
            latency_max: Duration::from_millis(2500),
        };
        if quick {
            Self {
                client_timeout: t.client_timeout / 5,
                backoff_base: t.backoff_base / 5,
                backoff_cap: t.backoff_cap / 5,
                latency_min: t.latency_min / 5,
                latency_max: t.latency_max / 5,
                ..t
            }
        } else {
            t
        }
    }
}

/// What one run counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Operations the client performed.
    pub operations: usize,
    /// Requests the client sent.
    pub attempts: u64,
    /// Attempts the client gave up on.
    pub timeouts: u64,
    /// Attempts that failed otherwise (an error status, a refused connection).
    pub other_failures: u64,
    /// Operations whose client got an answer.
    pub answered: usize,
    /// Of those, answers that were replayed from the store.
    pub replayed_answers: usize,
    /// Times the LLM ran a generation.
    pub llm_executions: u64,
    /// Tokens the LLM billed (prompt + completion).
    pub billed_tokens: u64,
    /// Charges the service made.
    pub charges: u64,
    /// Charges beyond the first of an operation.
    pub duplicate_charges: u64,
    /// Operations charged whose client never got an answer.
    pub charged_unanswered: usize,
    /// From the first request to the client's last answer or give-up.
    pub client_time: Duration,
}

/// Both runs of the same workload.
#[derive(Clone, Debug)]
pub struct DemoReport {
    /// What was asked for.
    pub options: DemoOptions,
    /// The clocks used.
    pub timing: Timing,
    /// Client → report service, unprotected.
    pub direct: RunStats,
    /// Client → the same service behind the idempotency layer.
    pub idemgate: RunStats,
    /// Both runs, wall clock.
    pub elapsed: Duration,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// No operations were asked for.
    #[error("the demo needs at least one operation")]
    NoOperations,
    /// The simulated LLM or the report service could not listen.
    #[error("cannot listen on 127.0.0.1")]
    Listen(#[source] std::io::Error),
    /// The SQLite store could not be created in a temporary directory.
    #[error("cannot create the SQLite store in a temporary directory")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// An HTTP client could not be built.
    #[error("cannot build an HTTP client")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// How the service is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protection {
    None,
    Idemgate,
}

/// Runs the workload without, then with idemgate.
///
/// # Errors
/// [`DemoError`] when a listener, the store or a client cannot be set up.
pub async fn run(options: &DemoOptions) -> Result<DemoReport, DemoError> {
    if options.operations == 0 {
        return Err(DemoError::NoOperations);
    }
    let started = Instant::now();
    let timing = Timing::new(options.quick);
    let ops = workload::workload(options.operations, options.seed, &timing);
    let sim = idemgate_llm_sim::spawn(SimConfig {
        latency: timing.latency_min,
        completion_tokens: service::COMPLETION_TOKENS,
        ..SimConfig::default()
    })
    .await
    .map_err(DemoError::Listen)?;
    let direct = service::run_once(&sim, &ops, &timing, Protection::None).await;
    sim.reset();
    let idemgate = match direct {
        Ok(_) => service::run_once(&sim, &ops, &timing, Protection::Idemgate).await,
        Err(_) => Ok(RunStats::default()),
    };
    sim.shutdown().await;
    Ok(DemoReport {
        options: options.clone(),
        timing,
        direct: direct?,
        idemgate: idemgate?,
        elapsed: started.elapsed(),
    })
}
