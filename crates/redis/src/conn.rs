//! [`Conn`]: one Redis connection, to a single node or to a cluster, and
//! the one way this workspace opens its shared connection.
//!
//! A leaf module. The store (`store`), its background timeline writer
//! (`timeline`) and the live-event streams of `idemgate-redis-live` all run
//! their commands through this type, so that a second Redis component never
//! grows its own copy of the connection enum, the connection settings or
//! the command dispatch over node and cluster.
//!
//! # Why the shared connection is replaced after a response timeout
//! The driver reconnects by itself only when a connection is dropped or
//! refused. A connection that goes silent (a peer or middlebox that stops
//! answering without closing) stays in use forever: every command on it
//! times out. So the shared connection sits in a [`Shared`] slot: a
//! command that times out discards the connection it ran on, and the next
//! command opens a fresh one.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, ScriptInvocation};

use crate::endpoint::Endpoint;

/// A connection to one node or to a cluster. Every kind is a cheap clone of
/// a shared multiplexed connection.
#[derive(Clone)]
pub enum Conn {
    /// The shared connection of a store or of a live-event backend, to one
    /// node (reconnecting by itself) or to a cluster, replaced by a fresh
    /// one after a command on it times out.
    Shared(Arc<Shared>),
    /// One node, one plain connection that does not reconnect: a connection
    /// dedicated to one user (for example blocking reads), dropped and
    /// opened again after an error.
    Plain(MultiplexedConnection),
    /// A dedicated cluster connection: the client reconnects and follows
    /// slot moves itself.
    Cluster(ClusterConnection),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Shared(s) if s.is_cluster() => "SharedCluster",
            Self::Shared(_) => "Shared",
            Self::Plain(_) => "Plain",
            Self::Cluster(_) => "Cluster",
        })
    }
}

/// What opens the shared connection again.
enum Opener {
    Node(Box<(redis::Client, ConnectionManagerConfig)>),
    Cluster(Box<ClusterClient>),
}

/// The live shared connection.
#[derive(Clone)]
enum Live {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The slot of the shared connection: the connection in use and its
/// generation, or nothing after it was discarded.
pub struct Shared {
    opener: Opener,
    current: Mutex<Option<(u64, Live)>>,
    /// Held while opening, so that concurrent commands open one connection.
    opening: tokio::sync::Mutex<u64>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("cluster", &self.is_cluster())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn is_cluster(&self) -> bool {
        matches!(self.opener, Opener::Cluster(_))
    }

    fn peek(&self) -> Option<(u64, Live)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection in use, opening one if it was discarded.
    async fn live(&self) -> Result<(u64, Live), RedisError> {
        if let Some(cur) = self.peek() {
            return Ok(cur);
        }
        let mut generation = self.opening.lock().await;
        if let Some(cur) = self.peek() {
            return Ok(cur);
        }
        let live = match &self.opener {
            Opener::Node(node) => {
                let (client, config) = &**node;
                Live::Node(
                    ConnectionManager::new_with_config(client.clone(), config.clone()).await?,
                )
            }
            Opener::Cluster(client) => Live::Cluster(client.get_async_connection().await?),
        };
        *generation += 1;
        let cur = (*generation, live);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(cur.clone());
        Ok(cur)
    }

    /// Discards the connection of `generation` when `result` is a timeout
    /// (the connection may have gone silent), unless it was replaced
    /// already. Commands still running on it keep their clone.
    fn check<T>(&self, generation: u64, result: &Result<T, RedisError>) {
        if let Err(e) = result
            && e.is_timeout()
        {
            let mut cur = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if cur.as_ref().is_some_and(|(g, _)| *g == generation) {
                tracing::warn!(
                    error = %e,
                    "redis command timed out: its connection is replaced"
                );
                *cur = None;
            }
        }
    }
}

/// Runs `$call` on the connection of `$self`, whatever its kind.
macro_rules! dispatch {
    ($self:ident, $c:ident => $call:expr) => {
        match $self {
            Self::Plain($c) => $call,
            Self::Cluster($c) => $call,
            Self::Shared(shared) => {
                let (generation, live) = shared.live().await?;
                let result = match live {
                    Live::Node(mut conn) => {
                        let $c = &mut conn;
                        $call
                    }
                    Live::Cluster(mut conn) => {
                        let $c = &mut conn;
                        $call
                    }
                };
                shared.check(generation, &result);
                result
            }
        }
    };
}

impl Conn {
    /// Opens the shared connection to `redis://host:port[/db]` (one node,
    /// reconnecting) or `redis+cluster://host:port[,host:port…]` (a cluster;
    /// any reachable node is enough to discover the rest); `rediss://` and
    /// `rediss+cluster://` with TLS (see [`Endpoint`]).
    ///
    /// `connection_timeout` bounds each connection attempt and
    /// `response_timeout` each command's answer; a command that times out
    /// has its connection replaced for the next one. Callers bound the
    /// whole call themselves: a cluster may try several nodes.
    ///
    /// # Errors
    /// The driver's error: a malformed URL, a certificate that is not
    /// trusted, or a server that cannot be reached. [`crate::map_error`]
    /// turns it into a `StoreError`.
    pub async fn open(
        url: &str,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let endpoint = Endpoint::parse(url)?;
        let opener = if endpoint.is_cluster() {
            Opener::Cluster(Box::new(
                endpoint
                    .cluster_builder()
                    .connection_timeout(connection_timeout)
                    .response_timeout(response_timeout)
                    // A failover answers MOVED, ASK, TRYAGAIN or CLUSTERDOWN,
                    // or drops the dead master's connection, for about a
                    // second: the client follows redirects and retries these
                    // with backoff (50 ms doubling, at most 400 ms apart)
                    // inside the store's operation bound.
                    .retries(8)
                    .min_retry_wait(50)
                    .max_retry_wait(400)
                    .retry_wait_formula(50, 2)
                    .build()?,
            ))
        } else {
            Opener::Node(Box::new((
                endpoint.node_client()?,
                ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connection_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(250)),
            )))
        };
        let shared = Arc::new(Shared {
            opener,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(0),
        });
        shared.live().await?;
        Ok(Self::Shared(shared))
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        match self {
            Self::Shared(s) => s.is_cluster(),
            Self::Plain(_) => false,
            Self::Cluster(_) => true,
        }
    }

    /// Runs one command.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        dispatch!(self, c => cmd.query_async(c).await)
    }

    /// Runs a pipeline whose replies are all ignored.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn pipe(&mut self, pipe: &Pipeline) -> Result<(), RedisError> {
        dispatch!(self, c => pipe.query_async(c).await)
    }

    /// Runs a pipeline and returns its replies. On a cluster the whole
    /// pipeline goes, in order on one connection, to the node of its first
    /// keyed command.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn query_pipe<T: FromRedisValue>(
        &mut self,
        pipe: &Pipeline,
    ) -> Result<T, RedisError> {
        dispatch!(self, c => pipe.query_async(c).await)
    }

    /// Runs a prepared Lua script (`EVALSHA`, loading it on `NOSCRIPT`).
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn invoke<T: FromRedisValue>(
        &mut self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        dispatch!(self, c => inv.invoke_async(c).await)
    }
}

impl Conn {
    /// Runs one command on the master serving `route` (a cluster), or on
    /// the node (`None`, or not a cluster): for commands that must reach
    /// the node a key's writes went to, such as `WAIT` after them.
    ///
    /// # Errors
    /// The driver's error; see [`crate::map_error`].
    pub async fn query_on_master(
        &mut self,
        cmd: &Cmd,
        route: Option<Route>,
    ) -> Result<redis::Value, RedisError> {
        let Some(route) = route else {
            return self.query(cmd).await;
        };
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
        match self {
            Self::Plain(c) => cmd.query_async(c).await,
            Self::Cluster(c) => c.route_command(cmd.clone(), routing).await,
            Self::Shared(shared) => {
                let (generation, live) = shared.live().await?;
                let result = match live {
                    Live::Node(mut conn) => cmd.query_async(&mut conn).await,
                    Live::Cluster(mut conn) => conn.route_command(cmd.clone(), routing).await,
                };
                shared.check(generation, &result);
                result
            }
        }
    }
}
