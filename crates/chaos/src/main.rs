//! `idemgate-chaos`: one chaos run against real `idemgate serve`
//! replicas; prints the summary line and exits 1 on any violation.
//!
//! Run with: `scripts/chaos.sh sqlite 5`, or
//! `cargo run -p idemgate-chaos -- --store redis --minutes 1`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use idemgate_chaos::cluster::Binaries;
use idemgate_chaos::history::FaultKind;
use idemgate_chaos::{Broken, RunConfig, Store};

/// Random faults against idemgate replicas on one store, judged against
/// the promise.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// `sqlite` (one file), `redis` (a private master with one replica),
    /// `cluster` (a private Redis Cluster, 3 masters and 3 replicas) or
    /// `postgres` (a private primary with a synchronous standby).
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// With `--store redis`: an existing Redis node instead of private
    /// servers (a key prefix of the run's own is added; no fault restarts
    /// or fails it over).
    #[arg(long, env = "IDEMGATE_CHAOS_REDIS")]
    redis: Option<String>,
    /// Minutes of clients and faults (fractions allowed).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// Stop after this many requests (the final reads come on top).
    #[arg(long)]
    max_ops: Option<usize>,
    /// Gateway replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Keys per route and tenant.
    #[arg(long, default_value_t = 6)]
    keys: usize,
    /// Share of requests whose upstream answer is cut after a few tokens.
    #[arg(long, default_value_t = 0.05)]
    upstream_cuts: f64,
    /// Seed of every random choice (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Faults, comma-separated: kill, pause, terminate (on replicas);
    /// clock-step (every replica's wall clock); store-restart, failover
    /// (store servers of the run's own); drop-reply, store-cut,
    /// store-stall (through the FaultProxy in front of redis or
    /// postgres); `none` for a run without faults. Default: kill, pause,
    /// terminate, and on a store of the run's own every fault it can take
    /// but store-cut and store-stall.
    #[arg(long)]
    faults: Option<String>,
    /// Break the deployment on purpose: `charges-off`.
    #[arg(long)]
    broken: Option<String>,
    /// Directory for the run's files (default: a new temporary one).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// `idemgate` binary (default: beside this one, or target/debug).
    #[arg(long, env = "IDEMGATE_BIN")]
    idemgate_bin: Option<PathBuf>,
    /// `idemgate-llm-sim` binary.
    #[arg(long, env = "IDEMGATE_LLM_SIM_BIN")]
    llm_sim_bin: Option<PathBuf>,
    /// Judge the history a run left in this directory again (its
    /// `history.json` and `executions.json`), without running anything.
    #[arg(long)]
    recheck: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("idemgate-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Judges a recorded run again.
fn recheck(dir: &std::path::Path) -> anyhow::Result<bool> {
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .with_context(|| format!("reading {name} in {}", dir.display()))
    };
    let history: idemgate_chaos::History = serde_json::from_slice(&read("history.json")?)?;
    let executions: Vec<idemgate_llm_sim::Execution> =
        serde_json::from_slice(&read("executions.json")?)?;
    let report = idemgate_chaos::check(&history, &executions);
    for v in &report.violations {
        println!("violation {}: {:?}: {}", v.invariant, v.key, v.detail);
    }
    let counts: Vec<String> = idemgate_chaos::Invariant::ALL
        .iter()
        .map(|i| format!("{i}={}", report.count(*i)))
        .collect();
    println!(
        "recheck {}: {} excused={} held={}",
        dir.display(),
        counts.join(" "),
        report.excused,
        report.held
    );
    Ok(report.is_clean())
}

async fn run(args: Args) -> anyhow::Result<bool> {
    if let Some(dir) = &args.recheck {
        return recheck(dir);
    }
    let store = match (args.store.as_str(), &args.redis) {
        ("sqlite", _) => Store::Sqlite,
        ("redis", None) => Store::Redis,
        ("redis", Some(url)) => Store::RedisAt(url.clone()),
        ("cluster", _) => Store::Cluster,
        ("postgres", _) => Store::Postgres,
        (other, _) => bail!("unknown store `{other}`; use sqlite, redis, cluster or postgres"),
    };
    let faults = match args.faults.as_deref() {
        None => store.default_faults(),
        Some("none") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|f| match FaultKind::parse(f.trim()) {
                Some(kind) => Ok(kind),
                None => bail!(
                    "unknown fault `{f}`; use {} or none",
                    FaultKind::EVERY.map(FaultKind::as_str).join(", ")
                ),
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let broken = match args.broken.as_deref() {
        None => None,
        Some("charges-off") => Some(Broken::ChargesOff),
        Some(other) => bail!("unknown broken mode `{other}`; use charges-off"),
    };
    let mut binaries = Binaries::locate();
    if let (Some(idemgate), Some(llm_sim)) = (&args.idemgate_bin, &args.llm_sim_bin) {
        binaries = Ok(Binaries {
            idemgate: idemgate.clone(),
            llm_sim: llm_sim.clone(),
        });
    }
    let binaries = binaries.context("locating the binaries")?;
    if !(args.minutes > 0.0 && args.minutes.is_finite()) {
        bail!("--minutes must be positive");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("idemgate-chaos: seed {seed}");
    let cfg = RunConfig {
        store,
        replicas: args.replicas,
        duration: Duration::from_secs_f64(args.minutes * 60.0),
        max_ops: args.max_ops,
        clients: args.clients,
        keys_per_route: args.keys,
        upstream_cuts: args.upstream_cuts,
        seed,
        faults,
        broken,
        binaries,
        dir: args.dir,
    };
    let outcome = idemgate_chaos::run(&cfg).await.context("the run")?;
    for v in &outcome.report.violations {
        eprintln!("violation {}: {:?}: {}", v.invariant, v.key, v.detail);
    }
    eprintln!("idemgate-chaos: files in {}", outcome.dir.display());
    println!("{} seed={seed}", outcome.summary());
    Ok(outcome.report.is_clean())
}
