//! [`Conn`]: one Redis connection, to a single node or to a cluster, and
//! the one way this workspace opens its shared connection.
//!
//! A leaf module. The store (`store`), its background timeline writer
//! (`timeline`) and the live-event streams of `idemgate-redis-live` all run
//! their commands through this type, so that a second Redis component never
//! grows its own copy of the connection enum, the connection settings or
//! the command dispatch over node and cluster.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, ScriptInvocation};

/// A connection to one node or to a cluster. Every kind is a cheap clone of
/// a shared multiplexed connection.
#[derive(Clone)]
pub enum Conn {
    /// One node, reconnecting by itself (`ConnectionManager`): the shared
    /// connection of a store or of a live-event backend.
    Single(ConnectionManager),
    /// One node, one plain connection that does not reconnect: a connection
    /// dedicated to one user (for example blocking reads), dropped and
    /// opened again after an error.
    Plain(MultiplexedConnection),
    /// A cluster: the client reconnects and follows slot moves itself.
    Cluster(ClusterConnection),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Single",
            Self::Plain(_) => "Plain",
            Self::Cluster(_) => "Cluster",
        })
    }
}

impl Conn {
    /// Opens the shared connection to `redis://host:port[/db]` (one node,
    /// reconnecting) or `redis+cluster://host:port[,host:port…]` (a cluster;
    /// any reachable node is enough to discover the rest).
    ///
    /// `connection_timeout` bounds each connection attempt and
    /// `response_timeout` each command's answer. Callers bound the whole
    /// call themselves: a cluster may try several nodes.
    ///
    /// # Errors
    /// The driver's error: a malformed URL, or a server that cannot be
    /// reached. [`crate::map_error`] turns it into a `StoreError`.
    pub async fn open(
        url: &str,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        match cluster_nodes(url) {
            Some(nodes) => {
                let client = ClusterClient::builder(nodes)
                    .connection_timeout(connection_timeout)
                    .response_timeout(response_timeout)
                    .retries(2)
                    .build()?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
            None => {
                let client = redis::Client::open(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connection_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(250));
                Ok(Self::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
        }
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs one command.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Plain(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// Runs a pipeline whose replies are all ignored.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn pipe(&mut self, pipe: &Pipeline) -> Result<(), RedisError> {
        match self {
            Self::Single(c) => pipe.query_async(c).await,
            Self::Plain(c) => pipe.query_async(c).await,
            Self::Cluster(c) => pipe.query_async(c).await,
        }
    }

    /// Runs a prepared Lua script (`EVALSHA`, loading it on `NOSCRIPT`).
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn invoke<T: FromRedisValue>(
        &mut self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        match self {
            Self::Single(c) => inv.invoke_async(c).await,
            Self::Plain(c) => inv.invoke_async(c).await,
            Self::Cluster(c) => inv.invoke_async(c).await,
        }
    }
}

/// Splits `redis+cluster://[auth@]h1:p1,h2:p2[/…]` into one `redis://` URL per
/// node; `None` for any other scheme.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let rest = url.strip_prefix("redis+cluster://")?;
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, tail) = match hosts.find(['/', '?']) {
        Some(i) => hosts.split_at(i),
        None => (hosts, ""),
    };
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{auth}{h}{tail}"))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_split_per_node() {
        assert_eq!(
            cluster_nodes("redis+cluster://a:1,b:2"),
            Some(vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()])
        );
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@a:1,b:2/0"),
            Some(vec![
                "redis://u:p@a:1/0".to_owned(),
                "redis://u:p@b:2/0".to_owned()
            ])
        );
        assert_eq!(cluster_nodes("redis://a:1"), None);
    }
}
