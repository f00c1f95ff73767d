//! The store servers a run starts for itself, so that the nemesis may
//! kill, restart and fail them over without touching a server anything
//! else uses: a Redis master with one replica ([`RedisPair`]), a Redis
//! Cluster of three masters and three replicas ([`RedisCluster`]), a
//! PostgreSQL primary with one synchronous standby ([`PgPair`]).
//!
//! Every process is started here on free loopback ports, in the run's
//! directory, and watched by a small shell that stops it once the harness
//! is gone (a harness killed with -9 leaves no server behind). Signals go
//! to the process ids started here, never by name.

mod postgres;
mod redis;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::process::Command;

pub use postgres::PgPair;
pub use redis::{RedisCluster, RedisPair};

use crate::error::{Error, Result};

/// The servers of one run.
#[derive(Debug)]
pub enum Servers {
    /// A Redis master with one replica, behind the run's FaultProxy.
    Redis(Box<RedisPair>),
    /// A Redis Cluster, addressed directly (its nodes announce their own
    /// addresses).
    Cluster(RedisCluster),
    /// A PostgreSQL primary with one synchronous standby, behind the
    /// run's FaultProxy.
    Postgres(PgPair),
}

impl Servers {
    /// Kills the store's primary (a random node of a cluster) and starts
    /// it again on its data; returns which server it was. Ends once the
    /// store is whole again (replicas linked).
    ///
    /// # Errors
    /// A server cannot be killed, started or seen whole again.
    pub async fn restart(&mut self, down: Duration, pick: usize) -> Result<String> {
        match self {
            Self::Redis(p) => p.restart(down).await,
            Self::Cluster(c) => c.restart(down, pick).await,
            Self::Postgres(p) => p.restart(down).await,
        }
    }

    /// Kills the primary (a random master of a cluster) and promotes its
    /// replica; the FaultProxy, if any, is moved to the new primary and
    /// its live connections reset. Ends once a new replica is in sync.
    ///
    /// # Errors
    /// A step of the failover fails.
    pub async fn failover(
        &mut self,
        proxy: Option<&idemgate_testkit::FaultProxy>,
        pick: usize,
    ) -> Result<String> {
        match self {
            Self::Redis(p) => p.failover(proxy).await,
            Self::Cluster(c) => c.failover(pick).await,
            Self::Postgres(p) => p.failover(proxy).await,
        }
    }

    /// Stops every server.
    pub async fn stop(&mut self) {
        match self {
            Self::Redis(p) => p.stop().await,
            Self::Cluster(c) => c.stop().await,
            Self::Postgres(p) => p.stop().await,
        }
    }
}

/// Polls `ok` every 100 ms until it holds, for at most `limit`.
///
/// # Errors
/// [`Error::Server`] naming `what` when it never held.
pub(crate) async fn wait_until<F, Fut>(what: &str, limit: Duration, mut ok: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if ok().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Server(format!("{what}: not within {limit:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `cmd` to its end; its stdout, or [`Error::Server`] with its
/// stderr.
pub(crate) async fn output(what: &str, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| Error::Server(format!("{what}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Server(format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether `program --version` runs.
pub(crate) async fn runs(program: &Path) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .await
        .is_ok_and(|o| o.status.success())
}
