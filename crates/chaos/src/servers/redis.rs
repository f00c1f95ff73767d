//! Private `redis-server` processes: a master with one replica, and a
//! cluster of three masters each with one replica. Every node appends
//! each write to its AOF and syncs it (`appendfsync always`), so a node
//! killed and started again comes back with what it acknowledged.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use idemgate_testkit::FaultProxy;
use tokio::process::{Child, Command};

use super::{output, runs, wait_until};
use crate::error::{Error, Result};

/// How long a node may take to start, a replica to sync, a cluster to
/// agree.
const SETTLE: Duration = Duration::from_secs(30);

/// A loopback port that is free, as is its cluster bus port (+10000).
async fn free_port() -> Result<u16> {
    for _ in 0..100 {
        let port = crate::cluster::free_port().await?;
        if port < 50_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Start("no free port pair for a Redis node".into()))
}

/// `redis-cli -p PORT ARGS…`; its output.
async fn cli(port: u16, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    output(&format!("redis-cli -p {port} {}", args.join(" ")), &mut cmd).await
}

/// One private `redis-server`, on a port it keeps across restarts.
#[derive(Debug)]
pub(super) struct RedisNode {
    /// Its port on 127.0.0.1.
    pub(super) port: u16,
    dir: PathBuf,
    cluster: bool,
    child: Option<Child>,
}

impl RedisNode {
    async fn new(root: &Path, cluster: bool) -> Result<Self> {
        let port = free_port().await?;
        let dir = root.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            port,
            dir,
            cluster,
            child: None,
        })
    }

    /// Its address.
    pub(super) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Starts the process (again) with `extra` arguments and waits until
    /// it answers PING.
    async fn start(&mut self, extra: &[&str]) -> Result<()> {
        let port = self.port.to_string();
        let dir = self.dir.display().to_string();
        let mut args = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir,
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--repl-ping-replica-period",
            "1",
            "--repl-timeout",
            "2",
            // A replica rejoining after a failover syncs at once: the
            // store's WAIT holds every completion until it has.
            "--repl-diskless-sync-delay",
            "0",
        ];
        if self.cluster {
            args.extend([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
            ]);
        }
        args.extend(extra);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))?;
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(log)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        if let Some(pid) = child.id() {
            idemgate_testkit::try_watchdog(&pid.to_string(), "KILL")?;
        }
        self.child = Some(child);
        let port = self.port;
        wait_until(&format!("redis {port} answers"), SETTLE, || async move {
            cli(port, &["ping"]).await.is_ok_and(|o| o.trim() == "PONG")
        })
        .await
    }

    /// Kills the process at once (SIGKILL), as a crashed host.
    async fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// A field of `INFO replication`.
    async fn replication(&self, field: &str) -> Option<String> {
        let info = cli(self.port, &["info", "replication"]).await.ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
    }

    /// Whether it is a replica with its link to the master up.
    async fn linked(&self) -> bool {
        self.replication("role").await.as_deref() == Some("slave")
            && self.replication("master_link_status").await.as_deref() == Some("up")
    }

    /// Whether it is a master that counts a replica online (only then
    /// does `ROLE` list it, and `WAIT` count it).
    async fn has_online_replica(&self) -> bool {
        self.replication("role").await.as_deref() == Some("master")
            && self
                .replication("slave0")
                .await
                .is_some_and(|v| v.split(',').any(|f| f == "state=online"))
    }

    /// The port of its replica, for a master.
    async fn replica_port(&self) -> Option<u16> {
        let line = self.replication("slave0").await?;
        line.split(',')
            .find_map(|f| f.strip_prefix("port="))
            .and_then(|p| p.parse().ok())
    }
}

/// Checks that `redis-server` and `redis-cli` run.
async fn require_binaries() -> Result<()> {
    for bin in ["redis-server", "redis-cli"] {
        if !runs(Path::new(bin)).await {
            return Err(Error::MissingBinary(format!(
                "`{bin}` not found: install Redis (scripts/setup.sh does)"
            )));
        }
    }
    Ok(())
}

/// A master with one replica. The store reaches the master through the
/// run's FaultProxy, which a failover moves to the promoted replica.
#[derive(Debug)]
pub struct RedisPair {
    master: RedisNode,
    replica: RedisNode,
}

impl RedisPair {
    /// Starts both, the replica in sync.
    ///
    /// # Errors
    /// A binary is missing or a node does not start or sync.
    pub async fn start(root: &Path) -> Result<Self> {
        require_binaries().await?;
        let mut master = RedisNode::new(root, false).await?;
        master.start(&[]).await?;
        let mut replica = RedisNode::new(root, false).await?;
        let of = master.port.to_string();
        replica.start(&["--replicaof", "127.0.0.1", &of]).await?;
        let pair = Self { master, replica };
        pair.in_sync().await?;
        Ok(pair)
    }

    /// The master's address (the FaultProxy's first target).
    pub fn master_addr(&self) -> SocketAddr {
        self.master.addr()
    }

    async fn in_sync(&self) -> Result<()> {
        let (m, r) = (&self.master, &self.replica);
        wait_until("the Redis replica in sync", SETTLE, || async {
            r.linked().await && m.has_online_replica().await
        })
        .await
    }

    pub(super) async fn restart(&mut self, down: Duration) -> Result<String> {
        self.master.kill().await?;
        tokio::time::sleep(down).await;
        self.master.start(&[]).await?;
        self.in_sync().await?;
        Ok(format!("master {}", self.master.addr()))
    }

    pub(super) async fn failover(&mut self, proxy: Option<&FaultProxy>) -> Result<String> {
        self.master.kill().await?;
        cli(self.replica.port, &["replicaof", "no", "one"]).await?;
        if let Some(p) = proxy {
            p.retarget(self.replica.addr());
            p.reset().await;
        }
        std::mem::swap(&mut self.master, &mut self.replica);
        let of = self.master.port.to_string();
        self.replica
            .start(&["--replicaof", "127.0.0.1", &of])
            .await?;
        self.in_sync().await?;
        Ok(format!(
            "{} promoted, {} its replica",
            self.master.addr(),
            self.replica.addr()
        ))
    }

    pub(super) async fn stop(&mut self) {
        let _ = self.master.kill().await;
        let _ = self.replica.kill().await;
    }
}

/// Three masters, each with one replica (`cluster-node-timeout 1000`).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisNode>,
}

impl RedisCluster {
    /// Starts six nodes and makes them a cluster (`redis-cli --cluster
    /// create … --cluster-replicas 1`), every master with its replica in
    /// sync.
    ///
    /// # Errors
    /// A binary is missing, or the cluster does not form.
    pub async fn start(root: &Path) -> Result<Self> {
        require_binaries().await?;
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let mut n = RedisNode::new(root, true).await?;
            n.start(&[]).await?;
            nodes.push(n);
        }
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        cli(nodes[0].port, &args).await?;
        let cluster = Self { nodes };
        cluster.whole().await?;
        Ok(cluster)
    }

    /// The store URL's node (`redis+cluster://` names one).
    pub fn seed(&self) -> SocketAddr {
        self.nodes[0].addr()
    }

    /// Every node says `cluster_state:ok`, and three masters count a
    /// replica online.
    async fn whole(&self) -> Result<()> {
        let nodes = &self.nodes;
        wait_until("the Redis Cluster whole", SETTLE, || async move {
            let mut masters = 0;
            for n in nodes {
                let ok = cli(n.port, &["cluster", "info"])
                    .await
                    .is_ok_and(|i| i.contains("cluster_state:ok"));
                if !ok {
                    return false;
                }
                if n.has_online_replica().await {
                    masters += 1;
                }
            }
            masters == 3
        })
        .await
    }

    pub(super) async fn restart(&mut self, down: Duration, pick: usize) -> Result<String> {
        let i = pick % self.nodes.len();
        self.nodes[i].kill().await?;
        tokio::time::sleep(down).await;
        self.nodes[i].start(&[]).await?;
        self.whole().await?;
        Ok(format!("node {}", self.nodes[i].addr()))
    }

    pub(super) async fn failover(&mut self, pick: usize) -> Result<String> {
        let mut masters = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.replication("role").await.as_deref() == Some("master") {
                masters.push(i);
            }
        }
        let Some(&m) = masters.get(pick % masters.len().max(1)) else {
            return Err(Error::Server("no Redis Cluster master found".into()));
        };
        let replica_port = self.nodes[m]
            .replica_port()
            .await
            .ok_or_else(|| Error::Server("the master to fail has no replica".into()))?;
        let r = self
            .nodes
            .iter()
            .position(|n| n.port == replica_port)
            .ok_or_else(|| Error::Server(format!("no node on port {replica_port}")))?;
        self.nodes[m].kill().await?;
        let replica = &self.nodes[r];
        wait_until("the replica promoted", SETTLE, || async move {
            replica.replication("role").await.as_deref() == Some("master")
        })
        .await?;
        self.nodes[m].start(&[]).await?;
        self.whole().await?;
        Ok(format!(
            "master {} failed, {} promoted",
            self.nodes[m].addr(),
            self.nodes[r].addr()
        ))
    }

    pub(super) async fn stop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.kill().await;
        }
    }
}
