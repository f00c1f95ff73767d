//! `idemgate`: the command line of the idempotency gateway.
//!
//! - `serve`: the gateway (refuses to start on a key template that merges
//!   different operations; logs the other checklist findings).
//! - `check`: the pre-launch checklist as findings, exit 1 on errors
//!   (module `check`).
//! - `demo`: a client whose timeout is shorter than a slow generation
//!   retries and is charged twice; then the same run behind idemgate.
//! - `keys show`: one key's record and timeline from the store (module
//!   `keys`); `keys generate-encryption-key`: a new key-file line.

mod check;
mod keys;
mod log_writer;

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use idemgate_gateway::{GatewayConfig, Overrides};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The allocator: mimalloc. A request allocates and frees many small
/// buffers (headers, keys, log lines) across threads; glibc's `malloc`
/// and `free` were a tenth of the gateway's CPU per request in profiles.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Makes retries safe: run each operation at most once per idempotency key.
#[derive(Debug, Parser)]
#[command(name = "idemgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: an idempotent reverse proxy in front of an upstream.
    Serve(ServeArgs),
    /// Run the pre-launch checklist on a configuration: TTLs against the
    /// retry window, timeouts, key templates, store choice, alert rules.
    /// Exit status 1 when any finding is an error, 2 when the configuration
    /// cannot be read.
    Check(check::CheckArgs),
    /// Watch retries with a too-short client timeout charge twice, then
    /// watch idemgate stop it: a simulated slow LLM, a report service that
    /// charges credits, and a retrying client, all in this process.
    Demo(DemoArgs),
    /// Inspect idempotency keys in the store.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
}

/// Flags of `idemgate demo`.
#[derive(Debug, Args)]
struct DemoArgs {
    /// Report operations the client performs.
    #[arg(long, default_value_t = 12)]
    operations: usize,
    /// Seed of the random latencies and backoffs (same seed, same workload).
    #[arg(long, default_value_t = 2)]
    seed: u64,
    /// Everything five times faster (for tests; timeouts get tight).
    #[arg(long)]
    quick: bool,
}

/// Where the configuration comes from; each flag overrides the file and
/// `IDEMGATE_*`. Shared by `serve` and `check`, so a command line that
/// serves can be checked by changing one word.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// TOML configuration file.
    #[arg(long, short, env = "IDEMGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Upstream base URL; alone, every POST under `/` is proxied to it.
    #[arg(long)]
    upstream: Option<String>,
    /// Proxy listen address (default 127.0.0.1:8080).
    #[arg(long)]
    listen: Option<String>,
    /// Admin listen address (default 127.0.0.1:9464).
    #[arg(long)]
    admin_listen: Option<String>,
    /// Store URL: sqlite:PATH (default sqlite:idemgate.db), memory:,
    /// redis://…, redis+cluster://…, postgres://… (rediss://… and
    /// `?sslmode=…` with TLS)
    #[arg(long)]
    store: Option<String>,
    /// Lease length, e.g. 30s.
    #[arg(long)]
    pending_ttl: Option<String>,
    /// Lifetime of stored results, e.g. 24h.
    #[arg(long)]
    done_ttl: Option<String>,
    /// Key file that seals stored responses (`ID:BASE64` lines, `*` on the
    /// active key, or a single unmarked key); also `encryption_key_file` in the file and
    /// IDEMGATE_ENCRYPTION_KEY_FILE.
    #[arg(long, value_name = "FILE")]
    encryption_key_file: Option<String>,
    /// Worker threads of the async runtime (default: one per core, or
    /// TOKIO_WORKER_THREADS); also `workers` in the file and
    /// IDEMGATE_WORKERS.
    #[arg(long, value_name = "N")]
    workers: Option<u64>,
}

impl ConfigArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            upstream: self.upstream.clone(),
            listen: self.listen.clone(),
            admin_listen: self.admin_listen.clone(),
            store: self.store.clone(),
            pending_ttl: self.pending_ttl.clone(),
            done_ttl: self.done_ttl.clone(),
            encryption_key_file: self.encryption_key_file.clone(),
            workers: self.workers,
        }
    }

    /// Reads and validates the configuration.
    pub(crate) fn load(&self) -> Result<GatewayConfig, idemgate_gateway::ConfigError> {
        GatewayConfig::load(self.config.as_deref(), &self.overrides())
    }
}

/// Flags of `idemgate serve`.
#[derive(Debug, Args)]
struct ServeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Log format: `json` (default) or `text`.
    #[arg(long, default_value = "json")]
    log_format: String,
    /// Export request spans over OTLP/HTTP to this collector base URL
    /// (spans go to URL/v1/traces); without it, OTEL_EXPORTER_OTLP_ENDPOINT
    /// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT turn export on. Needs a build
    /// with the `otlp` feature.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
}

/// The span export started with the logs (when built with `otlp` and
/// asked for), stopped by [`Traces::finish`].
#[derive(Debug)]
struct Traces {
    #[cfg(feature = "otlp")]
    otlp: Option<idemgate_telemetry::otlp::OtlpTraces>,
}

impl Traces {
    /// Starts OTLP export when the flag or the environment asks for it.
    #[cfg(feature = "otlp")]
    fn start(endpoint: Option<&str>) -> anyhow::Result<Traces> {
        use idemgate_telemetry::otlp::{OtlpTraces, configured_by_env};
        let otlp = if endpoint.is_some() || configured_by_env() {
            Some(OtlpTraces::start(endpoint).context("cannot start OTLP span export")?)
        } else {
            None
        };
        Ok(Traces { otlp })
    }

    #[cfg(not(feature = "otlp"))]
    fn start(endpoint: Option<&str>) -> anyhow::Result<Traces> {
        if endpoint.is_some() {
            anyhow::bail!("--otlp-endpoint: this build has no OTLP export (cargo feature `otlp`)");
        }
        Ok(Traces {})
    }

    /// Sends the spans still queued and stops export.
    async fn finish(self) {
        #[cfg(feature = "otlp")]
        if let Some(otlp) = self.otlp {
            // Shutdown blocks until the last export ends: off the workers.
            if let Err(e) = tokio::task::spawn_blocking(move || otlp.shutdown()).await {
                tracing::warn!(error = %e, "OTLP span export: shutdown did not finish");
            }
        }
    }
}

/// Installs the log subscriber. Lines go to stderr through a writer thread
/// that writes them in batches (`log_writer`), so a slow terminal or log
/// pipe never stalls a request and a line costs no wake-up; the returned
/// guard writes what is buffered when it is dropped at exit. Nothing is
/// dropped: when the buffer is full (16 MiB), writers wait for room.
fn init_logs(
    format: &str,
    otlp_endpoint: Option<&str>,
) -> anyhow::Result<(Traces, log_writer::FlushGuard)> {
    let filter = match std::env::var("IDEMGATE_LOG") {
        Ok(s) => Targets::from_str(&s).context("IDEMGATE_LOG is not a log filter")?,
        Err(_) => Targets::new().with_default(LevelFilter::INFO),
    };
    let traces = Traces::start(otlp_endpoint)?;
    let (stderr, guard) =
        log_writer::batched(std::io::stderr()).context("cannot start the log writer thread")?;
    #[cfg(feature = "otlp")]
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(traces.otlp.as_ref().map(|t| t.layer()));
    #[cfg(not(feature = "otlp"))]
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        "json" => registry
            .with(idemgate_telemetry::logging::json_layer(stderr))
            .try_init()?,
        "text" => registry
            .with(tracing_subscriber::fmt::layer().with_writer(stderr))
            .try_init()?,
        other => anyhow::bail!("--log-format `{other}`: expected json or text"),
    }
    #[cfg(not(feature = "otlp"))]
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        tracing::warn!("OTEL_EXPORTER_OTLP_ENDPOINT is set but this build has no OTLP export");
    }
    Ok((traces, guard))
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

async fn serve(args: ServeArgs, config: GatewayConfig) -> anyhow::Result<()> {
    let (traces, log_writer) = init_logs(&args.log_format, args.otlp_endpoint.as_deref())?;
    let served = serve_logged(config).await;
    traces.finish().await;
    drop(log_writer);
    served
}

async fn serve_logged(config: GatewayConfig) -> anyhow::Result<()> {
    if let Err(e) = idemgate_gateway::telemetry::install_prometheus() {
        tracing::warn!(error = %e, "metrics disabled");
    }
    // The gateway runs the checklist first (logging the findings, refusing
    // a key that merges operations), then binds the configured addresses.
    idemgate_gateway::bind_and_serve(config, signal()).await?;
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    runtime_with(None)
}

/// The multi-thread runtime, with `workers` threads when given (else
/// tokio's default: `TOKIO_WORKER_THREADS`, or one per core). Its threads
/// (workers and the blocking pool alike) are named `idemgate-worker`.
fn runtime_with(workers: Option<NonZeroUsize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.thread_name("idemgate-worker");
    if let Some(n) = workers {
        builder.worker_threads(n.get());
    }
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            // Read first: the runtime's size is part of it.
            let config = args.config.load()?;
            runtime_with(config.workers)?.block_on(serve(args, config))?;
        }
        Command::Check(args) => return Ok(check::run(&args)),
        Command::Demo(args) => {
            let options = idemgate_demo::DemoOptions {
                operations: args.operations,
                seed: args.seed,
                quick: args.quick,
            };
            let report = runtime()?.block_on(idemgate_demo::run(&options))?;
            print!("{}", idemgate_demo::render(&report));
        }
        Command::Keys(cmd) => return runtime()?.block_on(keys::run(cmd)),
    }
    Ok(ExitCode::SUCCESS)
}
