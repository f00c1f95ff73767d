//! Databases for the tests: the shared server (127.0.0.1:5432, db `test`)
//! under a random schema per test process, and private instances (initdb in
//! a temp dir, own port) for tests that restart the server, count
//! statements or speak TLS only.

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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemgate_postgres::{PostgresOptions, PostgresStore};

/// The shared server every machine of this project runs.
pub fn shared_url() -> String {
    std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub use idemgate_testkit::require;

/// A schema name for this test process: `igtest_<unix secs>_<random>`.
pub fn run_schema() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        format!("igtest_{secs}_{:08x}", rand::random::<u32>())
    })
}

/// Drops test schemas left by runs more than an hour old (a process cannot
/// drop its own at exit: statics are never dropped).
pub async fn drop_stale_schemas(pool: &sqlx::PgPool) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'igtest\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for name in names {
        let secs = name
            .split('_')
            .nth(1)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        if secs.saturating_add(3600) < now
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE"
            )))
            .execute(pool)
            .await;
        }
    }
}

/// A store on the shared server under this process's schema.
pub async fn shared_store() -> PostgresStore {
    let url = shared_url();
    let opts = PostgresOptions::default()
        .schema(run_schema())
        .max_connections(8);
    match PostgresStore::connect_with(&url, opts).await {
        Ok(store) => {
            static CLEANED: OnceLock<()> = OnceLock::new();
            if CLEANED.set(()).is_ok() {
                drop_stale_schemas(store.pool()).await;
            }
            store
        }
        Err(e) if e.kind() == idemgate_engine::StoreErrorKind::Unavailable => {
            require(&format!("PostgreSQL at {url} ({e})"), false);
            unreachable!()
        }
        Err(e) => panic!("setting up the store in schema {}: {e}", run_schema()),
    }
}

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

/// A private PostgreSQL instance on a free port.
#[derive(Debug)]
pub struct Private {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    /// Set for a server that accepts TCP connections over TLS only.
    tls: Option<idemgate_testkit::tls::CertFiles>,
    /// More `-c name=value` server settings.
    settings: String,
}

impl Private {
    /// initdb + start, with `pg_stat_statements` loaded.
    pub fn start() -> Self {
        Self::launch(None, "")
    }

    /// initdb + start with `ssl=on` and the certificate `certs`
    /// (copied into the cluster's directory), accepting TCP connections
    /// over TLS only (`hostssl` lines alone in `pg_hba.conf`).
    pub fn start_tls(certs: &idemgate_testkit::tls::TestCerts) -> Self {
        Self::launch(Some(certs), "")
    }

    /// [`Private::start`] with more server settings (`-c name=value …`).
    pub fn start_with(settings: &str) -> Self {
        Self::launch(None, settings)
    }

    fn launch(certs: Option<&idemgate_testkit::tls::TestCerts>, settings: &str) -> Self {
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
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
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
            port,
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
        me.restart_server();
        me
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the server when this test process exits.
    fn spawn_watchdog(&self) {
        let Ok(pidfile) = std::fs::read_to_string(self.data().join("postmaster.pid")) else {
            return;
        };
        let Some(pid) = pidfile.lines().next().map(str::trim).map(str::to_owned) else {
            return;
        };
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -INT {pid} 2>/dev/null",
                me = std::process::id()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
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

    /// Starts the server (again) on the same port and data directory.
    pub fn restart_server(&self) {
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
                self.spawn_watchdog();
                return;
            }
            assert!(Instant::now() < deadline, "pg_ctl restart failed");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop("fast");
    }
}
