//! The system under test as real processes: one `idemgate-llm-sim`
//! upstream and N `idemgate serve` replicas on one store, each replica on
//! a port of its own that it keeps across restarts, so a client addresses
//! "replica 2" whether it is up, frozen or restarting.
//!
//! Signals go through `kill(1)` to the one process id this module started,
//! never by name.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::error::{Error, Result};
use crate::routes::{ADMIN_TOKEN, Route};

/// Where the two binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `idemgate`.
    pub idemgate: PathBuf,
    /// `idemgate-llm-sim`.
    pub llm_sim: PathBuf,
}

impl Binaries {
    /// The binaries named by `IDEMGATE_BIN` and `IDEMGATE_LLM_SIM_BIN`, or
    /// else found beside the running executable (a `target/<profile>`
    /// directory or its `deps/`), or in `target/debug` of the workspace
    /// this crate was built in.
    ///
    /// # Errors
    /// [`Error::MissingBinary`] naming the first one not found and how to
    /// build it.
    pub fn locate() -> Result<Self> {
        Ok(Self {
            idemgate: find("IDEMGATE_BIN", "idemgate")?,
            llm_sim: find("IDEMGATE_LLM_SIM_BIN", "idemgate-llm-sim")?,
        })
    }
}

fn find(var: &str, name: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingBinary(format!(
                "{var}={} is not a file",
                path.display()
            )))
        };
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        dirs.push(dir.to_path_buf());
        if let Some(up) = dir.parent() {
            dirs.push(up.to_path_buf());
        }
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug"));
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::MissingBinary(format!(
                "`{name}` not found beside this executable nor in target/debug: build it with \
                 `cargo build -p idemgate -p idemgate-llm-sim` (or set {var})"
            ))
        })
}

/// A loopback port free at the time of asking.
pub async fn free_port() -> Result<u16> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(l.local_addr()?.port())
}

/// The simulated upstream, in a process of its own.
#[derive(Debug)]
pub struct Upstream {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Upstream {
    /// Starts the simulator and waits until it answers.
    ///
    /// # Errors
    /// It cannot be started or never answers.
    pub async fn start(bin: &Path, dir: &Path) -> Result<Self> {
        let port = free_port().await?;
        let child = Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--latency-ms", "300", "--first-token-ms", "50"])
            .args(["--token-interval-ms", "40", "--tokens", "20"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("llm-sim.log"))?)
            .kill_on_drop(true)
            .spawn()?;
        let up = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = client.get(format!("{}/sim/stats", up.url)).send().await
                && r.status().is_success()
            {
                return Ok(up);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Start("the simulated upstream never answered".into()))
    }

    /// Every execution the upstream ran.
    ///
    /// # Errors
    /// The log cannot be read.
    pub async fn log(&self) -> Result<Vec<idemgate_llm_sim::Execution>> {
        let r = reqwest::get(format!("{}/sim/log", self.url)).await?;
        let bytes = r.error_for_status()?.bytes().await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// Stops it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// libfaketime, under which the replicas run when the nemesis steps
/// their clocks (Debian's `faketime`).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How a replica's configuration is written.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The store URL every replica shares.
    pub store: String,
    /// The upstream's base URL.
    pub upstream: String,
    /// `pending_ttl`, e.g. `"3s"`.
    pub pending_ttl: String,
    /// `shutdown_grace`, e.g. `"1s"`.
    pub shutdown_grace: String,
    /// The routes, each with its `charges` as written (a broken mode may
    /// write `false` where the promise judged says `true`).
    pub routes: Vec<Route>,
    /// Run under [`LIBFAKETIME`] with this offset file (re-read at every
    /// wall-clock read; the monotonic clock is left alone).
    pub faketime: Option<PathBuf>,
}

/// One `idemgate serve` replica: its ports, its configuration file, and
/// its process while it runs.
#[derive(Debug)]
pub struct Replica {
    /// Its index.
    pub index: usize,
    /// The client port.
    pub port: u16,
    /// The admin port.
    pub admin: u16,
    config: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    faketime: Option<PathBuf>,
    /// Starts so far (the log file of each start is kept apart).
    starts: usize,
}

impl Replica {
    /// Writes the replica's configuration in `dir`; does not start it.
    ///
    /// # Errors
    /// No free port, or the file cannot be written.
    pub async fn new(index: usize, dir: &Path, bin: &Path, cfg: &ReplicaConfig) -> Result<Self> {
        let (port, admin) = (free_port().await?, free_port().await?);
        let mut text = format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             store = \"{}\"\nshutdown_grace = \"{}\"\ndone_ttl = \"1h\"\n\
             admin_token = \"{ADMIN_TOKEN}\"\n",
            cfg.store, cfg.shutdown_grace
        );
        for r in &cfg.routes {
            text.push_str(&r.toml(&cfg.upstream, &cfg.pending_ttl));
        }
        let config = dir.join(format!("replica-{index}.toml"));
        std::fs::write(&config, text)?;
        Ok(Self {
            index,
            port,
            admin,
            config,
            log: dir.join(format!("replica-{index}")),
            bin: bin.to_path_buf(),
            child: None,
            faketime: cfg.faketime.clone(),
            starts: 0,
        })
    }

    /// The URL of `path` on this replica's client port.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The URL of `path` on this replica's admin port.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    /// Starts the process and waits until it is ready.
    ///
    /// # Errors
    /// It cannot be started, exits, or is not ready within 30 s.
    pub async fn start(&mut self) -> Result<()> {
        self.starts += 1;
        let log = std::fs::File::create(format!("{}.{}.log", self.log.display(), self.starts))?;
        let mut cmd = Command::new(&self.bin);
        if let Some(offset) = &self.faketime {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", offset)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = cmd
            .args(["serve", "--config"])
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        for _ in 0..300 {
            if let Some(status) = child.try_wait()? {
                return Err(Error::Start(format!(
                    "replica {} exited at start ({status}); see {}.{}.log",
                    self.index,
                    self.log.display(),
                    self.starts
                )));
            }
            if let Ok(r) = client.get(self.admin_url("/healthz")).send().await
                && r.status().is_success()
            {
                self.child = Some(child);
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill().await;
        Err(Error::Start(format!(
            "replica {} never became ready",
            self.index
        )))
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to the running
    /// process; nothing if it is not running.
    ///
    /// # Errors
    /// `kill(1)` cannot be run.
    pub async fn signal(&self, signal: &str) -> Result<()> {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return Ok(());
        };
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await?;
        Ok(())
    }

    /// Waits for the process to exit (after a KILL or TERM), for at most
    /// `max`; kills it if it has not.
    ///
    /// # Errors
    /// Waiting fails.
    pub async fn wait_exit(&mut self, max: Duration) -> Result<()> {
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(max, child.wait()).await.is_err()
        {
            child.kill().await?;
        }
        Ok(())
    }

    /// Stops the process for good (SIGCONT first, in case it is frozen).
    pub async fn stop(&mut self) {
        let _ = self.signal("CONT").await;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}
