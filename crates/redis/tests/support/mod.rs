//! Private Redis servers for the tests: a single node (for restart and
//! round-trip counting, never the shared one on 6379), a 3-node cluster,
//! and servers that speak TLS only (certificates from the testkit).
//!
//! Servers ([`Server`], from the testkit) run from a temp dir on free
//! loopback ports, each watched so nothing outlives the test binary.

#![allow(dead_code, unreachable_pub)] // each test binary uses a part
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// The shared Redis every machine of this project runs.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379";

pub use idemgate_testkit::redis_server::{Server, create_cluster};
// For the test files that use them; not every test binary does.
#[allow(unused_imports)]
pub use idemgate_testkit::{redis_server::redis_cli, require};

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
            let nodes: Vec<Server> = (0..3).map(|_| Server::start(temp_root(), true)).collect();
            let addrs = create_cluster(&nodes, 0, None, Duration::from_secs(20));
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
            let certs = certs();
            let nodes: Vec<Server> = (0..3)
                .map(|_| Server::start_tls(temp_root(), true, certs))
                .collect();
            let addrs = create_cluster(&nodes, 0, Some(&certs.ca), Duration::from_secs(20));
            let url = format!(
                "rediss+cluster://{}/?tls_ca={}",
                addrs.join(","),
                certs.ca.display()
            );
            (nodes, url)
        })
        .1
}
