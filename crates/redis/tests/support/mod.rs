//! Private Redis servers for the tests: a single node (for restart and
//! round-trip counting, never the shared one on 6379), a 3-node cluster,
//! and servers that speak TLS only (certificates from the testkit).
//!
//! Servers run from a temp dir on free loopback ports. Each is paired with a
//! watchdog shell that stops it once the test process is gone, so nothing
//! outlives the test binary even though statics are never dropped.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared Redis every machine of this project runs.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379";

pub use idemgate_testkit::require;

/// A random key prefix for this test process.
pub fn run_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| format!("igtest{:08x}", rand::random::<u32>()))
}

/// Options for test stores: this run's prefix, and fences remembered for
/// ten minutes rather than days, so runs leave little behind.
pub fn options() -> idemgate_redis::RedisOptions {
    idemgate_redis::RedisOptions::default()
        .prefix(run_prefix())
        .fence_memory(Duration::from_secs(600))
}

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

fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    redis_cli_on(port, None, args)
}

/// `redis-cli` on `port`, over TLS trusting `ca` when given.
fn redis_cli_on(port: u16, ca: Option<&Path>, args: &[&str]) -> Option<String> {
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
fn pings_tls(port: u16, ca: &Path) -> bool {
    redis_cli_on(port, Some(ca), &["ping"]).is_some_and(|o| o.trim() == "PONG")
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not happen within {limit:?}");
}

/// One private `redis-server` process.
#[derive(Debug)]
pub struct Server {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    /// Set for a server that speaks TLS only.
    tls: Option<idemgate_testkit::tls::CertFiles>,
    child: Option<std::process::Child>,
}

impl Server {
    /// Starts a server in a fresh directory under `root`.
    pub fn start(root: &Path, cluster: bool) -> Self {
        Self::start_with(root, cluster, None)
    }

    /// Starts a server that speaks only TLS, with the certificate `certs`
    /// (clients are not asked for one).
    pub fn start_tls(root: &Path, cluster: bool, certs: &idemgate_testkit::tls::CertFiles) -> Self {
        Self::start_with(root, cluster, Some(certs.clone()))
    }

    fn start_with(
        root: &Path,
        cluster: bool,
        tls: Option<idemgate_testkit::tls::CertFiles>,
    ) -> Self {
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
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id();
        // The watchdog stops the server when this test process exits; it
        // ends by itself, so it is deliberately never waited for.
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill {pid} 2>/dev/null",
                me = std::process::id()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn watchdog");
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

/// Keeps temp dirs alive for the process (statics are never dropped).
fn temp_root() -> &'static Path {
    static ROOT: OnceLock<tempfile::TempDir> = OnceLock::new();
    ROOT.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// A 3-primary cluster shared by every test of this binary; returns its
/// `redis+cluster://` URL.
pub fn cluster_url() -> &'static str {
    static CLUSTER: OnceLock<(Vec<Server>, String)> = OnceLock::new();
    &CLUSTER
        .get_or_init(|| {
            require(
                "redis-cli",
                Command::new("redis-cli").arg("--version").output().is_ok(),
            );
            let nodes: Vec<Server> = (0..3).map(|_| Server::start(temp_root(), true)).collect();
            let addrs: Vec<String> = nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect();
            let mut args = vec!["--cluster", "create"];
            args.extend(addrs.iter().map(String::as_str));
            args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
            let created = redis_cli(nodes[0].port, &args);
            assert!(created.is_some(), "redis-cli --cluster create failed");
            for n in &nodes {
                wait_until("cluster_state:ok", Duration::from_secs(20), || {
                    redis_cli(n.port, &["cluster", "info"])
                        .is_some_and(|i| i.contains("cluster_state:ok"))
                });
            }
            let url = format!("redis+cluster://{}", addrs.join(","));
            (nodes, url)
        })
        .1
}

/// This process's certificates (a CA and a server certificate for
/// `localhost` and 127.0.0.1), written under the temp root.
pub fn certs() -> &'static idemgate_testkit::tls::CertFiles {
    static CERTS: OnceLock<idemgate_testkit::tls::CertFiles> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = temp_root().join("certs");
        std::fs::create_dir_all(&dir).unwrap();
        idemgate_testkit::tls::TestCerts::generate().write(&dir)
    })
}

/// A single node that speaks only TLS, shared by every test of this
/// binary; returns its `rediss://…?tls_ca=…` URL.
pub fn tls_url() -> &'static str {
    static NODE: OnceLock<(Server, String)> = OnceLock::new();
    &NODE
        .get_or_init(|| {
            let server = Server::start_tls(temp_root(), false, certs());
            let url = server.url();
            (server, url)
        })
        .1
}

/// A 3-primary cluster that speaks only TLS (the cluster bus too), shared
/// by every test of this binary; returns its `rediss+cluster://` URL.
pub fn tls_cluster_url() -> &'static str {
    static CLUSTER: OnceLock<(Vec<Server>, String)> = OnceLock::new();
    &CLUSTER
        .get_or_init(|| {
            require(
                "redis-cli",
                Command::new("redis-cli").arg("--version").output().is_ok(),
            );
            let certs = certs();
            let nodes: Vec<Server> = (0..3)
                .map(|_| Server::start_tls(temp_root(), true, certs))
                .collect();
            let addrs: Vec<String> = nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect();
            let mut args = vec!["--cluster", "create"];
            args.extend(addrs.iter().map(String::as_str));
            args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
            let created = redis_cli_on(nodes[0].port, Some(&certs.ca), &args);
            assert!(created.is_some(), "redis-cli --cluster create (TLS) failed");
            for n in &nodes {
                wait_until("cluster_state:ok", Duration::from_secs(20), || {
                    redis_cli_on(n.port, Some(&certs.ca), &["cluster", "info"])
                        .is_some_and(|i| i.contains("cluster_state:ok"))
                });
            }
            let url = format!(
                "rediss+cluster://{}/?tls_ca={}",
                addrs.join(","),
                certs.ca.display()
            );
            (nodes, url)
        })
        .1
}
