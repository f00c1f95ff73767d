//! Private Redis servers for the tests: a single node (for restart and
//! round-trip counting, never the shared one on 6379), a 3-node cluster,
//! and servers that speak TLS only (certificates from the testkit).
//!
//! Servers ([`Server`], from the testkit) run from a temp dir on free
//! loopback ports, each watched so nothing outlives the test binary.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The shared Redis every machine of this project runs.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379";

pub use idemgate_testkit::redis_server::{Server, redis_cli, redis_cli_on, wait_until};
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

/// Keeps temp dirs alive for the process (statics are never dropped).
pub fn temp_root() -> &'static Path {
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
