//! Private Redis servers for the tests: a single node (for restart and
//! round-trip counting, never the shared one on 6379) and a 3-node cluster.
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

pub use idemgate_testkit::redis_server::{Server, redis_cli, wait_until};
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
