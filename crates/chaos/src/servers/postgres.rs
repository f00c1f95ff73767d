//! A private PostgreSQL primary with one streaming standby, made with the
//! machine's own binaries (`initdb`, `pg_ctl`, `pg_basebackup`).
//!
//! Replication is synchronous (`synchronous_commit = on`,
//! `synchronous_standby_names = '*'`): a commit is acknowledged once the
//! standby has flushed it, so a promoted standby has every DONE the
//! primary acknowledged (docs/design.md, "Replicated stores"). With the
//! default asynchronous replication a failover may lose acknowledged
//! answers, which is a deployment the promise does not cover.
//!
//! The data directories live in a temporary directory of their own, owned
//! by user `postgres` when the harness runs as root (initdb and the server
//! refuse root); their logs are copied into the run's directory at the
//! end. `fsync = off`: the faults kill the server process, never the
//! machine, so what was written is in the kernel's cache either way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate_testkit::FaultProxy;
use tokio::process::Command;

use super::{output, wait_until};
use crate::error::{Error, Result};

/// How long a server may take to start, a standby to catch up.
const SETTLE: Duration = Duration::from_secs(60);

/// The newest installed PostgreSQL's program `name`.
fn pg_bin(name: &str) -> Result<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .last()
        .map(|v| v.join("bin").join(name))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Error::MissingBinary(format!(
                "PostgreSQL's `{name}` not found under /usr/lib/postgresql/*/bin: install the \
                 server (scripts/setup.sh does)"
            ))
        })
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A PostgreSQL program, run as user `postgres` when we are root.
fn pg_command(name: &str) -> Result<Command> {
    let bin = pg_bin(name)?;
    Ok(if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    })
}

/// One server: its data directory and port.
#[derive(Debug)]
struct PgNode {
    data: PathBuf,
    port: u16,
}

impl PgNode {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    async fn start(&self, sockets: &Path) -> Result<()> {
        let opts = format!("-p {} -k {}", self.port, sockets.display());
        output(
            &format!("pg_ctl start {}", self.data.display()),
            pg_command("pg_ctl")?
                .arg("-D")
                .arg(&self.data)
                .args(["-o", &opts, "-w", "-t", "60", "-l"])
                .arg(self.data.with_extension("log"))
                .arg("start"),
        )
        .await?;
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))?;
        // A number, never the file's text, reaches the watchdog's shell.
        if let Some(pid) = pid
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
        {
            idemgate_testkit::try_watchdog(&pid.to_string(), "QUIT")?;
        }
        Ok(())
    }

    /// `pg_ctl stop -m immediate`: the server's processes end at once,
    /// without a checkpoint, as in a crash (recovery replays the WAL).
    async fn crash(&self) -> Result<()> {
        output(
            &format!("pg_ctl stop {}", self.data.display()),
            pg_command("pg_ctl")?.arg("-D").arg(&self.data).args([
                "-m",
                "immediate",
                "-w",
                "-t",
                "30",
                "stop",
            ]),
        )
        .await
        .map(drop)
    }

    async fn psql(&self, sql: &str) -> Result<String> {
        output(
            "psql",
            Command::new(pg_bin("psql")?)
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-Atc",
                    sql,
                ])
                .arg("-p")
                .arg(self.port.to_string()),
        )
        .await
    }
}

/// A primary and its synchronous standby. The store reaches the primary
/// through the run's FaultProxy, which a failover moves to the promoted
/// standby.
#[derive(Debug)]
pub struct PgPair {
    root: tempfile::TempDir,
    primary: PgNode,
    standby: PgNode,
    /// Data directories made so far (each standby gets a new one).
    made: usize,
    /// The run's directory, for the logs.
    logs: PathBuf,
}

impl PgPair {
    /// initdb, the primary started, a standby made by `pg_basebackup -R`
    /// and started, and in sync.
    ///
    /// # Errors
    /// A program is missing or a step fails.
    pub async fn start(run_dir: &Path) -> Result<Self> {
        for name in ["initdb", "pg_ctl", "pg_basebackup", "psql"] {
            pg_bin(name)?;
        }
        let root = tempfile::Builder::new()
            .prefix("idemgate-chaos-pg")
            .tempdir()?;
        if is_root() {
            output(
                "chown",
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(root.path()),
            )
            .await?;
        }
        let primary = PgNode {
            data: root.path().join("pg-0"),
            port: crate::cluster::free_port().await?,
        };
        output(
            "initdb",
            pg_command("initdb")?.arg("-D").arg(&primary.data).args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ]),
        )
        .await?;
        let conf = "\n# idemgate-chaos\nlisten_addresses = '127.0.0.1'\nmax_connections = 200\n\
             wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\n\
             synchronous_commit = on\nsynchronous_standby_names = '*'\nfsync = off\n\
             wal_retrieve_retry_interval = '200ms'\nwal_receiver_status_interval = '1s'\n";
        let path = primary.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(conf);
        std::fs::write(&path, text)?;
        primary.start(root.path()).await?;
        let mut pair = Self {
            standby: PgNode {
                data: PathBuf::new(),
                port: 0,
            },
            primary,
            root,
            made: 1,
            logs: run_dir.to_path_buf(),
        };
        pair.standby = pair.new_standby().await?;
        Ok(pair)
    }

    /// The primary's address (the FaultProxy's first target).
    pub fn primary_addr(&self) -> SocketAddr {
        self.primary.addr()
    }

    /// A standby of the primary in a new data directory, started and in
    /// sync.
    async fn new_standby(&mut self) -> Result<PgNode> {
        let node = PgNode {
            data: self.root.path().join(format!("pg-{}", self.made)),
            port: crate::cluster::free_port().await?,
        };
        self.made += 1;
        output(
            "pg_basebackup",
            pg_command("pg_basebackup")?
                .args(["-h", "127.0.0.1", "-U", "postgres"])
                .arg("-p")
                .arg(self.primary.port.to_string())
                .arg("-D")
                .arg(&node.data)
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]),
        )
        .await?;
        node.start(self.root.path()).await?;
        self.in_sync().await?;
        Ok(node)
    }

    /// The primary counts a synchronous standby.
    async fn in_sync(&self) -> Result<()> {
        let primary = &self.primary;
        wait_until("the PostgreSQL standby in sync", SETTLE, || async move {
            primary
                .psql("SELECT sync_state FROM pg_stat_replication")
                .await
                .is_ok_and(|s| s.lines().any(|l| l.trim() == "sync"))
        })
        .await
    }

    pub(super) async fn restart(&mut self, down: Duration) -> Result<String> {
        self.primary.crash().await?;
        tokio::time::sleep(down).await;
        self.primary.start(self.root.path()).await?;
        self.in_sync().await?;
        Ok(format!("primary {}", self.primary.addr()))
    }

    pub(super) async fn failover(&mut self, proxy: Option<&FaultProxy>) -> Result<String> {
        self.primary.crash().await?;
        output(
            "pg_ctl promote",
            pg_command("pg_ctl")?
                .arg("-D")
                .arg(&self.standby.data)
                .args(["-w", "-t", "60", "promote"]),
        )
        .await?;
        if let Some(p) = proxy {
            p.retarget(self.standby.addr());
            p.reset().await;
        }
        let old = std::mem::replace(
            &mut self.primary,
            PgNode {
                data: PathBuf::new(),
                port: 0,
            },
        );
        self.primary = std::mem::replace(
            &mut self.standby,
            PgNode {
                data: PathBuf::new(),
                port: 0,
            },
        );
        self.copy_log(&old);
        let _ = std::fs::remove_dir_all(&old.data);
        // Until the new standby is in sync, the promoted primary's commits
        // wait for it (synchronous_standby_names = '*').
        self.standby = self.new_standby().await?;
        Ok(format!(
            "{} promoted, {} its new standby",
            self.primary.addr(),
            self.standby.addr()
        ))
    }

    fn copy_log(&self, node: &PgNode) {
        let log = node.data.with_extension("log");
        if let Some(name) = log.file_name() {
            let _ = std::fs::copy(&log, self.logs.join(name));
        }
    }

    pub(super) async fn stop(&mut self) {
        for node in [&self.primary, &self.standby] {
            let _ = node.crash().await;
            self.copy_log(node);
        }
    }
}
