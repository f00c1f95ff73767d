//! Private `redis-server` processes for tests: single nodes, replicas
//! and cluster nodes on free loopback ports, each paired with a watchdog
//! shell that stops it once the test process is gone (statics are never
//! dropped), and the faults a test inflicts on them (SIGSTOP, SIGKILL).
//!
//! Tests that need one call [`crate::require`] through [`Server::start`]:
//! under `CI=true` a missing `redis-server` fails them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::require;
use crate::tls::CertFiles;

/// A loopback port that is free, as is its cluster bus port (+10000).
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 50000 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// Runs `redis-cli` against the server on `port`; its stdout on success.
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    redis_cli_on(port, None, args)
}

/// `redis-cli` on `port`, over TLS trusting `ca` when given.
pub fn redis_cli_on(port: u16, ca: Option<&Path>, args: &[&str]) -> Option<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(ca) = ca {
        cmd.arg("--tls").arg("--cacert").arg(ca);
    }
    let out = cmd.args(args).stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a server answers PING on `port`.
pub fn pings(port: u16) -> bool {
    redis_cli(port, &["ping"]).is_some_and(|o| o.trim() == "PONG")
}

/// Whether a TLS server answers PING on `port`, trusting `ca`.
pub fn pings_tls(port: u16, ca: &Path) -> bool {
    redis_cli_on(port, Some(ca), &["ping"]).is_some_and(|o| o.trim() == "PONG")
}

/// Polls `ok` every 50 ms until it holds; panics after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not happen within {limit:?}");
}

/// Joins cluster `nodes` into one cluster with `replicas` replicas per
/// master (`redis-cli --cluster create`, over TLS trusting `ca` when
/// given), then waits up to `limit` for every node to report
/// `cluster_state:ok`. Returns the nodes' `127.0.0.1:PORT` addresses.
pub fn create_cluster(
    nodes: &[Server],
    replicas: usize,
    ca: Option<&Path>,
    limit: Duration,
) -> Vec<String> {
    require(
        "redis-cli",
        Command::new("redis-cli").arg("--version").output().is_ok(),
    );
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let replicas = replicas.to_string();
    let mut args = vec!["--cluster", "create"];
    args.extend(addrs.iter().map(String::as_str));
    args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
    assert!(
        redis_cli_on(nodes[0].port, ca, &args).is_some(),
        "redis-cli --cluster create failed"
    );
    for n in nodes {
        wait_until("cluster_state:ok", limit, || {
            redis_cli_on(n.port, ca, &["cluster", "info"])
                .is_some_and(|i| i.contains("cluster_state:ok"))
        });
    }
    addrs
}

/// One private `redis-server` process.
#[derive(Debug)]
pub struct Server {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    /// Set for a server that speaks TLS only.
    tls: Option<CertFiles>,
    child: Option<std::process::Child>,
    /// Extra `redis-server` arguments (e.g. `--replicaof`).
    extra: Vec<String>,
}

impl Server {
    /// Starts a server in a fresh directory under `root`.
    pub fn start(root: &Path, cluster: bool) -> Self {
        Self::launch(root, cluster, None, &[])
    }

    /// Starts a server that speaks only TLS, with the certificate `certs`
    /// (clients are not asked for one).
    pub fn start_tls(root: &Path, cluster: bool, certs: &CertFiles) -> Self {
        Self::launch(root, cluster, Some(certs.clone()), &[])
    }

    /// A replica of the server on `master`.
    pub fn replica_of(root: &Path, master: u16) -> Self {
        Self::start_with(
            root,
            false,
            &["--replicaof", "127.0.0.1", &master.to_string()],
        )
    }

    /// Starts a server with extra arguments.
    pub fn start_with(root: &Path, cluster: bool, extra: &[&str]) -> Self {
        Self::launch(root, cluster, None, extra)
    }

    fn launch(root: &Path, cluster: bool, tls: Option<CertFiles>, extra: &[&str]) -> Self {
        require(
            "redis-server",
            Command::new("redis-server")
                .arg("--version")
                .output()
                .is_ok(),
        );
        let port = free_port();
        let dir = root.join(format!("node-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Self {
            port,
            dir,
            cluster,
            tls,
            child: None,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.restart();
        s
    }

    /// `redis://127.0.0.1:<port>`, or for a TLS server
    /// `rediss://localhost:<port>/?tls_ca=<its CA file>`.
    pub fn url(&self) -> String {
        match &self.tls {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(certs) => format!(
                "rediss://localhost:{}/?tls_ca={}",
                self.port,
                certs.ca.display()
            ),
        }
    }

    fn ping(&self) -> bool {
        match &self.tls {
            None => pings(self.port),
            Some(certs) => pings_tls(self.port, &certs.ca),
        }
    }

    /// (Re)starts the process on the same port and directory.
    pub fn restart(&mut self) {
        // A TLS server has its plain port turned off (0).
        let plain = if self.tls.is_some() { 0 } else { self.port };
        let mut args = vec![
            "--port".to_owned(),
            plain.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--dir".to_owned(),
            self.dir.display().to_string(),
            "--save".to_owned(),
            String::new(),
            "--appendonly".to_owned(),
            "yes".to_owned(),
            "--appendfsync".to_owned(),
            "always".to_owned(),
            "--daemonize".to_owned(),
            "no".to_owned(),
        ];
        if let Some(certs) = &self.tls {
            args.extend([
                "--tls-port".to_owned(),
                self.port.to_string(),
                "--tls-cert-file".to_owned(),
                certs.cert.display().to_string(),
                "--tls-key-file".to_owned(),
                certs.key.display().to_string(),
                "--tls-ca-cert-file".to_owned(),
                certs.ca.display().to_string(),
                "--tls-auth-clients".to_owned(),
                "no".to_owned(),
            ]);
            if self.cluster {
                args.extend(["--tls-cluster", "yes"].map(String::from));
            }
        }
        if self.cluster {
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ]
                .map(String::from),
            );
        }
        args.extend(self.extra.iter().cloned());
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        crate::watchdog(&child.id().to_string(), "TERM");
        self.child = Some(child);
        wait_until("redis-server start", Duration::from_secs(10), || {
            self.ping()
        });
    }

    /// Stops the process (SIGTERM, then SIGKILL) and waits until the port is
    /// closed.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            wait_until("redis-server stop", Duration::from_secs(5), || !self.ping());
        }
    }

    /// Kills the process at once (SIGKILL), as a crashed host; the port
    /// closes.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): it holds its connections and answers
    /// nothing, as a stalled host does.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let ok = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} failed");
        }
    }

    /// A field of `INFO replication`, e.g. `connected_slaves`.
    pub fn replication(&self, field: &str) -> Option<String> {
        let info = redis_cli(self.port, &["info", "replication"])?;
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
    }

    /// Waits until `INFO replication` has `field:value`.
    pub fn wait_replication(&self, field: &str, value: &str) {
        wait_until(&format!("{field}:{value}"), Duration::from_secs(20), || {
            self.replication(field).as_deref() == Some(value)
        });
    }

    /// Waits until this master counts its first replica online
    /// (`slave0:…,state=online`): only then does `ROLE` list it. A replica
    /// reports its link up a moment earlier, while the master still has it
    /// syncing.
    pub fn wait_replica_online(&self) {
        wait_until("slave0 state=online", Duration::from_secs(20), || {
            self.replication("slave0")
                .is_some_and(|v| v.split(',').any(|f| f == "state=online"))
        });
    }

    /// Summed `calls` of the given commands in `INFO commandstats`.
    pub fn calls(&self, commands: &[&str]) -> u64 {
        self.calls_where(|name| commands.contains(&name))
    }

    /// Summed `calls` of every command but `INFO` (which reads the counters).
    pub fn calls_but_info(&self) -> u64 {
        self.calls_where(|name| name != "info")
    }

    /// Summed `calls` of every command but `INFO` and those in `skip`.
    pub fn calls_except(&self, skip: &[&str]) -> u64 {
        self.calls_where(|name| name != "info" && !skip.contains(&name))
    }

    fn calls_where(&self, keep: impl Fn(&str) -> bool) -> u64 {
        let info = redis_cli(self.port, &["info", "commandstats"]).unwrap_or_default();
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                keep(name).then_some(())?;
                rest.split(',')
                    .find_map(|f| f.strip_prefix("calls="))?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}
