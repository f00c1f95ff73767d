//! Private PostgreSQL servers for tests that restart the server, count its
//! statements or need it to speak TLS only: `initdb` in a temporary
//! directory, `pg_ctl` on a free loopback port, `pg_stat_statements`
//! loaded, and a watchdog shell that stops the server once the test
//! process is gone (statics are never dropped). The shared server
//! (127.0.0.1:5432) is never restarted; these are.
//!
//! A missing PostgreSQL installation fails through [`crate::require`]:
//! under `CI=true` (and outside it) it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server::free_port;
use crate::require;
use crate::tls::{CertFiles, TestCerts};

/// The newest installed PostgreSQL's program `name`
/// (`/usr/lib/postgresql/<version>/bin/<name>`); fails through
/// [`require`] when there is none.
fn pg_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    versions.sort();
    let bin = versions
        .last()
        .map(|v| v.join("bin").join(name))
        .filter(|p| p.exists());
    require(&format!("PostgreSQL's {name}"), bin.is_some());
    bin.unwrap()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a PostgreSQL program, as user `postgres` when we are root (initdb
/// and the server refuse to run as root).
fn pg_command(bin: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// A private PostgreSQL instance on a free port; dropping it stops it.
#[derive(Debug)]
pub struct Server {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    /// Set for a server that accepts TCP connections over TLS only.
    tls: Option<CertFiles>,
    /// More `-c name=value` server settings.
    settings: String,
}

impl Server {
    /// initdb + start, with `pg_stat_statements` loaded.
    pub fn start() -> Self {
        Self::launch(None, "")
    }

    /// initdb + start with `ssl=on` and the certificate `certs`
    /// (copied into the cluster's directory), accepting TCP connections
    /// over TLS only (`hostssl` lines alone in `pg_hba.conf`).
    pub fn start_tls(certs: &TestCerts) -> Self {
        Self::launch(Some(certs), "")
    }

    /// [`Server::start`] with more server settings (`-c name=value …`).
    pub fn start_with(settings: &str) -> Self {
        Self::launch(None, settings)
    }

    fn launch(certs: Option<&TestCerts>, settings: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pg")
            .tempdir()
            .unwrap();
        // The server reads its key as user postgres (chown below), and
        // refuses a key that others can read (written 0600).
        let tls = certs.map(|c| {
            let tls_dir = dir.path().join("tls");
            std::fs::create_dir(&tls_dir).unwrap();
            c.write(&tls_dir)
        });
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown of the private cluster directory failed");
        }
        let out = pg_command(&pg_bin("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let me = Self {
            port: free_port(),
            dir,
            tls,
            settings: settings.to_owned(),
        };
        if me.tls.is_some() {
            std::fs::write(
                me.data().join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 hostssl all all ::1/128 trust\n",
            )
            .unwrap();
        }
        me.restart();
        me
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The CA file of a TLS server.
    pub fn ca(&self) -> &Path {
        &self.tls.as_ref().expect("a TLS server").ca
    }

    /// Stops the server: `immediate` is a crash (no checkpoint; recovery
    /// replays the WAL on start), `fast` a clean shutdown.
    pub fn stop(&self, mode: &str) {
        let _ = pg_command(&pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-m", mode, "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Starts the server (again) on the same port and data directory,
    /// retrying for up to 30 s while the port is still being released.
    pub fn restart(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements -c max_connections=60 {}",
                self.port,
                self.dir.path().display(),
                self.settings
            );
            if let Some(certs) = &self.tls {
                opts.push_str(&format!(
                    " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                    certs.cert.display(),
                    certs.key.display()
                ));
            }
            let ok = pg_command(&pg_bin("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .args(["-o", &opts, "-w", "-t", "30", "-l"])
                .arg(self.dir.path().join("log"))
                .arg("start")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                if let Ok(pidfile) = std::fs::read_to_string(self.data().join("postmaster.pid"))
                    && let Some(pid) = pidfile.lines().next()
                {
                    crate::watchdog(pid.trim(), "INT");
                }
                return;
            }
            assert!(Instant::now() < deadline, "pg_ctl start failed");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop("fast");
    }
}

/// The shared PostgreSQL every machine of this project runs (never
/// restarted by a test): `IDEMGATE_TEST_POSTGRES_URL`, or db `test` on
/// 127.0.0.1:5432.
pub fn shared_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Drops `schema` from the database at `url` (the shared server, after a
/// test that used a schema of its own) with `psql`, trying five times 300 ms
/// apart while the test's gateways release their connections. Leftovers are
/// harmless, so a missing `psql` is not an error.
pub async fn drop_schema(url: &str, schema: &str) {
    for _ in 0..5 {
        let done = tokio::process::Command::new("psql")
            .args([url, "-q", "-c"])
            .arg(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        if done {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
