//! One run, start to verdict: start the store's servers (when the run
//! owns them), the upstream and the replicas on one store, drive the clients and the nemesis for the run's length (or its
//! request budget), heal, read every key once more, stop everything,
//! judge the history, and write it all to the run's directory.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use idemgate_testkit::FaultProxy;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::check::{self, Invariant, Report};
use crate::cluster::{Binaries, LIBFAKETIME, Replica, ReplicaConfig, Upstream};
use crate::error::{Error, Result};
use crate::history::{FaultKind, History, Stall, now_ms};
use crate::nemesis::Targets;
use crate::routes::Route;
use crate::servers::{PgPair, RedisCluster, RedisPair, Servers};
use crate::workload::Workload;

/// The store the replicas share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// One SQLite file (in the run's directory).
    Sqlite,
    /// A Redis master with one replica, private to the run, reached
    /// through a FaultProxy (which a failover moves to the replica).
    Redis,
    /// A Redis node the run does not own, at this URL
    /// (`redis://HOST:PORT[/DB]`), under a key prefix of the run's own: no
    /// fault may restart or fail it over.
    RedisAt(String),
    /// A Redis Cluster of three masters and three replicas, private to the
    /// run, reached directly (`redis+cluster://`).
    Cluster,
    /// A PostgreSQL primary with a synchronous standby, private to the
    /// run, reached through a FaultProxy (which a failover moves to the
    /// standby).
    Postgres,
}

impl Store {
    /// `sqlite`, `redis`, `redis-external`, `cluster` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
            Self::RedisAt(_) => "redis-external",
            Self::Cluster => "cluster",
            Self::Postgres => "postgres",
        }
    }

    /// The faults a run on this store injects unless told otherwise:
    /// those on the replicas, and on a store of the run's own its
    /// restarts, failovers, dropped replies (where a FaultProxy can drop
    /// them) and clock steps.
    pub fn default_faults(&self) -> Vec<FaultKind> {
        let mut kinds = FaultKind::ALL.to_vec();
        match self {
            Self::Sqlite | Self::RedisAt(_) => {}
            Self::Redis | Self::Postgres => kinds.extend([
                FaultKind::StoreRestart,
                FaultKind::Failover,
                FaultKind::DropReply,
                FaultKind::ClockStep,
            ]),
            Self::Cluster => kinds.extend([
                FaultKind::StoreRestart,
                FaultKind::Failover,
                FaultKind::ClockStep,
            ]),
        }
        kinds
    }

    /// Why this store cannot take fault `kind`, if it cannot.
    pub fn refuses(&self, kind: FaultKind) -> Option<&'static str> {
        let proxied = matches!(self, Self::Redis | Self::RedisAt(_) | Self::Postgres);
        let owned = matches!(self, Self::Redis | Self::Cluster | Self::Postgres);
        if kind.through_proxy() && !proxied {
            return Some(
                "needs a FaultProxy in front of the store: redis or postgres (a cluster's \
                 clients reach every node directly; SQLite is a file)",
            );
        }
        if kind.on_private_servers() && !owned {
            return Some(
                "needs store servers of the run's own: redis (without --redis), cluster or \
                 postgres",
            );
        }
        if kind == FaultKind::ClockStep && *self == Self::Sqlite {
            // docs/design.md, "Clocks": replicas sharing one SQLite file
            // disagree after a step until the earlier ones restart.
            return Some(
                "SQLite replicas each anchor their own clock, a documented limit \
                 (docs/design.md, \"Clocks\"): a step is only defined for stores that \
                 decide expiry on the server's clock",
            );
        }
        None
    }
}

/// A deliberately broken deployment, to show the checker catches what it
/// should.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The charging routes are configured `charges = false`, while the
    /// promise judged still says they charge.
    ChargesOff,
}

/// What a run does.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The shared store.
    pub store: Store,
    /// Gateway replicas (2–3).
    pub replicas: usize,
    /// How long clients and the nemesis run.
    pub duration: Duration,
    /// Stop sending new requests after this many (the final reads come on
    /// top).
    pub max_ops: Option<usize>,
    /// Concurrent clients.
    pub clients: usize,
    /// Keys per route and tenant.
    pub keys_per_route: usize,
    /// The share of requests that ask the upstream to cut its answer
    /// (`x-sim-fail: reset-after:N`): a failure after sending.
    pub upstream_cuts: f64,
    /// Seeds every random choice (the timing of real processes is not
    /// reproducible; the choices are).
    pub seed: u64,
    /// The faults the nemesis picks from.
    pub faults: Vec<FaultKind>,
    /// A broken deployment, if any.
    pub broken: Option<Broken>,
    /// The binaries.
    pub binaries: Binaries,
    /// Where the run's files go (configurations, logs, the history); a
    /// fresh temporary directory, kept, if `None`.
    pub dir: Option<PathBuf>,
}

/// The lease of every route: short, so that a pause past it and the
/// takeover that follows happen many times in a run.
pub const PENDING_TTL: Duration = Duration::from_secs(3);

/// The I6 bound beyond `pending_ttl`: the routes' total timeout (15 s),
/// the in-flight wait (5 s) and 5 s to spare. A key still unanswered
/// `pending_ttl` + this after the faults stopped is stuck.
pub const SETTLE_BOUND: Duration = Duration::from_secs(25);

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The history recorded.
    pub history: History,
    /// The upstream's execution log.
    pub executions: Vec<idemgate_llm_sim::Execution>,
    /// The verdict.
    pub report: Report,
    /// The store, for the summary.
    pub store: &'static str,
    /// How long clients and the nemesis ran.
    pub ran: Duration,
    /// Where its files are.
    pub dir: PathBuf,
    /// Results the replicas logged as released unstored when their lease
    /// ran out (the gateways' own account, read from their logs after the
    /// verdict: the checker never reads it). Beside the checker's
    /// `held`, it shows that count is backed by real releases.
    pub releases_logged: usize,
}

impl Outcome {
    /// The summary line.
    pub fn summary(&self) -> Summary<'_> {
        Summary(self)
    }
}

/// The one-line summary of a run: operations, faults by kind, violations
/// per invariant.
#[derive(Debug)]
pub struct Summary<'a>(&'a Outcome);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        let reads = o.history.ops.iter().filter(|op| op.final_read).count();
        let mut faults: BTreeMap<FaultKind, usize> =
            FaultKind::EVERY.iter().map(|k| (*k, 0)).collect();
        for fault in &o.history.faults {
            *faults.entry(fault.kind).or_default() += 1;
        }
        write!(
            f,
            "chaos store={} seconds={} ops={} final_reads={} forgets={} executions={} faults:",
            o.store,
            o.ran.as_secs(),
            o.history.ops.len() - reads,
            reads,
            o.history.forgets.len(),
            o.executions.len(),
        )?;
        for (kind, n) in faults {
            write!(f, " {}={n}", kind.as_str())?;
        }
        write!(f, " violations:")?;
        for i in Invariant::ALL {
            write!(f, " {i}={}", o.report.count(i))?;
        }
        write!(
            f,
            " excused={} held={} stalled={} host_stalls={} longest_stall_ms={} releases_logged={} verdict={}",
            o.report.excused,
            o.report.held,
            o.report.stalled,
            o.history.stalls.len(),
            o.history
                .stalls
                .iter()
                .map(Stall::duration_ms)
                .max()
                .unwrap_or(0),
            o.releases_logged,
            if o.report.is_clean() {
                "ok"
            } else {
                "VIOLATED"
            }
        )
    }
}

/// Runs `cfg` to its verdict.
///
/// # Errors
/// A process cannot be started or the upstream's log read; violations of
/// the promise are in the outcome's report, not errors.
pub async fn run(cfg: &RunConfig) -> Result<Outcome> {
    if !(1..=5).contains(&cfg.replicas) {
        return Err(Error::Config("replicas must be 1 to 5".into()));
    }
    let dir = match &cfg.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tempfile::Builder::new()
            .prefix("idemgate-chaos-")
            .tempdir()?
            .keep(),
    };
    for kind in &cfg.faults {
        if let Some(why) = cfg.store.refuses(*kind) {
            return Err(Error::Config(format!(
                "fault {} on store {}: {why}",
                kind.as_str(),
                cfg.store.name()
            )));
        }
    }
    let clock = if cfg.faults.contains(&FaultKind::ClockStep) {
        if !Path::new(LIBFAKETIME).is_file() {
            return Err(Error::MissingBinary(format!(
                "clock-step needs libfaketime ({LIBFAKETIME}): install Debian's `faketime` \
                 (scripts/setup.sh does)"
            )));
        }
        let file = dir.join("faketime");
        std::fs::write(&file, "+0")?;
        Some(file)
    } else {
        None
    };
    let (store, proxy, mut servers) = open_store(cfg, &dir).await?;
    let result = serve(cfg, &dir, store, proxy.as_ref(), servers.as_mut(), clock).await;
    if let Some(s) = servers.as_mut() {
        s.stop().await;
    }
    result
}

/// The store's URL for the replicas, with the FaultProxy in front of it
/// and the servers behind it when the run has them.
async fn open_store(
    cfg: &RunConfig,
    dir: &Path,
) -> Result<(String, Option<FaultProxy>, Option<Servers>)> {
    let proxied = |url: String, proxy: &FaultProxy, target: SocketAddr| {
        url.replacen(&target.to_string(), &proxy.addr().to_string(), 1)
    };
    Ok(match &cfg.store {
        Store::Sqlite => (
            format!("sqlite:{}", dir.join("keys.db").display()),
            None,
            None,
        ),
        Store::RedisAt(url) => {
            if cfg.faults.iter().any(|k| k.through_proxy()) {
                let target = redis_addr(url)?;
                let p = FaultProxy::start(target).await?;
                (prefixed(&proxied(url.clone(), &p, target)), Some(p), None)
            } else {
                (prefixed(url), None, None)
            }
        }
        Store::Redis => {
            let pair = RedisPair::start(dir).await?;
            let p = FaultProxy::start(pair.master_addr()).await?;
            let url = prefixed(&format!("redis://{}", p.addr()));
            (url, Some(p), Some(Servers::Redis(Box::new(pair))))
        }
        Store::Cluster => {
            let cluster = RedisCluster::start(dir).await?;
            let url = prefixed(&format!("redis+cluster://{}", cluster.seed()));
            (url, None, Some(Servers::Cluster(cluster)))
        }
        Store::Postgres => {
            let pair = PgPair::start(dir).await?;
            let p = FaultProxy::start(pair.primary_addr()).await?;
            let url = format!("postgres://postgres@{}/postgres", p.addr());
            (url, Some(p), Some(Servers::Postgres(pair)))
        }
    })
}

/// A Redis URL with a key prefix of the run's own.
fn prefixed(url: &str) -> String {
    let prefix = format!("chaos{:016x}", rand::random::<u64>());
    let sep = if url.contains('?') { '&' } else { '?' };
    let base = if url.contains('?') || url.ends_with('/') {
        url.to_owned()
    } else {
        format!("{url}/")
    };
    format!("{base}{sep}prefix={prefix}")
}

/// The upstream and the replicas on `store`, the run, its verdict.
async fn serve(
    cfg: &RunConfig,
    dir: &Path,
    store: String,
    proxy: Option<&FaultProxy>,
    servers: Option<&mut Servers>,
    clock: Option<PathBuf>,
) -> Result<Outcome> {
    let mut routes = Route::all();
    if cfg.broken == Some(Broken::ChargesOff) {
        for r in &mut routes {
            r.charges_written = false;
        }
    }
    let upstream = Upstream::start(&cfg.binaries.llm_sim, dir).await?;
    let replica_cfg = ReplicaConfig {
        store,
        upstream: upstream.url.clone(),
        pending_ttl: format!("{}s", PENDING_TTL.as_secs()),
        shutdown_grace: "1s".into(),
        routes: routes.clone(),
        faketime: clock.clone(),
    };
    let mut replicas = Vec::new();
    for i in 0..cfg.replicas {
        let mut r = Replica::new(i, dir, &cfg.binaries.idemgate, &replica_cfg).await?;
        r.start().await?;
        replicas.push(r);
    }
    let targets = Targets {
        replicas: &mut replicas,
        proxy,
        servers,
        clock: clock.as_deref(),
    };
    let result = drive(cfg, &routes, targets).await;
    for r in &mut replicas {
        r.stop().await;
    }
    let (mut history, ran) = result?;
    let executions = upstream.log().await;
    upstream.stop().await;
    let executions = executions?;
    history.charging_routes = routes
        .iter()
        .filter(|r| r.charges)
        .map(|r| r.name.clone())
        .collect();
    history.pending_ttl_ms = millis(PENDING_TTL);
    history.settle_bound_ms = millis(SETTLE_BOUND);
    history.shared_file = cfg.store == Store::Sqlite;
    let report = check::check(&history, &executions);
    write_json(&dir.join("history.json"), &history)?;
    write_json(&dir.join("executions.json"), &executions)?;
    write_json(&dir.join("report.json"), &report)?;
    Ok(Outcome {
        history,
        executions,
        report,
        store: cfg.store.name(),
        ran,
        dir: dir.to_path_buf(),
        releases_logged: releases_logged(dir),
    })
}

/// What the gateway logs when a held result's lease ran out
/// (`crates/layer/src/service/detached.rs`).
const RELEASED_LOG: &str = "result not stored before the lease ran out; key released";

/// Lines of the replicas' logs in `dir` that say a held result was
/// released unstored.
fn releases_logged(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("replica-") && n.ends_with(".log"))
        })
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|text| text.lines().filter(|l| l.contains(RELEASED_LOG)).count())
        .sum()
}

/// Clients and the nemesis until the run's end, then the final reads.
async fn drive(
    cfg: &RunConfig,
    routes: &[Route],
    targets: Targets<'_>,
) -> Result<(History, Duration)> {
    let workload = Arc::new(Workload::new(
        targets.replicas.iter().map(|r| r.port).collect(),
        targets.replicas.iter().map(|r| r.admin).collect(),
        routes,
        cfg.keys_per_route,
        cfg.upstream_cuts,
    )?);
    let watchdog = idemgate_testkit::stall::Watchdog::start()?;
    let started = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut clients = JoinSet::new();
    for c in 0..cfg.clients {
        let workload = Arc::clone(&workload);
        let stop = stop_rx.clone();
        let max_ops = cfg.max_ops;
        let mut rng = StdRng::seed_from_u64(cfg.seed.wrapping_add(1 + c as u64));
        clients.spawn(async move {
            while !*stop.borrow() && max_ops.is_none_or(|m| workload.op_count() < m) {
                workload.step(&mut rng).await;
            }
        });
    }
    let timer = {
        let stop_tx = stop_tx.clone();
        let duration = cfg.duration;
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            let _ = stop_tx.send(true);
        })
    };
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let nemesis = crate::nemesis::run(targets, &cfg.faults, PENDING_TTL, &mut rng, stop_rx);
    // The nemesis stops when the time is up, or when the clients have
    // used their budget.
    let stop_on_budget = async {
        while clients.join_next().await.is_some() {}
        let _ = stop_tx.send(true);
    };
    let (faults, ()) = tokio::join!(nemesis, stop_on_budget);
    timer.abort();
    let faults = faults?;
    let ran = started.elapsed();

    // The faults have stopped and every replica serves: read every key
    // until it is answered.
    let quiet_ms = now_ms();
    let deadline = quiet_ms + millis(PENDING_TTL) + millis(SETTLE_BOUND);
    let mut reads = JoinSet::new();
    // Enough at once that thousands of keys are read within the I6
    // bound on a loaded machine.
    let slots = Arc::new(tokio::sync::Semaphore::new(64));
    for key in workload.touched() {
        let workload = Arc::clone(&workload);
        let slots = Arc::clone(&slots);
        reads.spawn(async move {
            let _slot = slots.acquire().await;
            workload.settle(&key, deadline).await;
        });
    }
    while reads.join_next().await.is_some() {}
    let (ops, forgets) = workload.take();
    Ok((
        History {
            ops,
            forgets,
            faults,
            stalls: watchdog.stop().into_iter().map(Stall::from).collect(),
            quiet_ms,
            ..History::default()
        },
        ran,
    ))
}

/// The `HOST:PORT` of a `redis://HOST:PORT[/DB][?…]` URL, as an address
/// (the FaultProxy forwards to it).
fn redis_addr(url: &str) -> Result<SocketAddr> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| Error::Config(format!("store faults need a redis:// URL, not {url}")))?;
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    host.parse().map_err(|_| {
        Error::Config(format!(
            "store faults need an IP:PORT Redis address, not {host}"
        ))
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let file = std::fs::File::create(path)?;
    serde_json::to_writer(std::io::BufWriter::new(file), value)?;
    Ok(())
}
