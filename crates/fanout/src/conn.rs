//! Connections: one shared multiplexed connection for writes and quick
//! reads, and a dedicated one per follower for blocking reads.

use std::fmt;
use std::time::Duration;

use idemgate_engine::{StoreError, StoreErrorKind};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, Pipeline, RedisError};

use crate::FanoutOptions;

const BACKEND: &str = "redis";

/// A connection of either kind; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// Single node, reconnecting.
    Single(ConnectionManager),
    /// Single node, one connection (dedicated to a follower).
    Plain(MultiplexedConnection),
    /// A cluster (follows slot moves and reconnects itself).
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
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Plain(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }

    pub(crate) async fn pipe(&mut self, pipe: &Pipeline) -> Result<(), RedisError> {
        match self {
            Self::Single(c) => pipe.query_async(c).await,
            Self::Plain(c) => pipe.query_async(c).await,
            Self::Cluster(c) => pipe.query_async(c).await,
        }
    }
}

/// What makes dedicated connections.
pub(crate) enum Clients {
    Single(redis::Client),
    /// Built with a response timeout longer than a blocking read.
    Cluster(Box<ClusterClient>),
}

impl fmt::Debug for Clients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Single",
            Self::Cluster(_) => "Cluster",
        })
    }
}

/// Longest a blocking read may take to answer: the block plus slack.
fn blocking_timeout(opts: &FanoutOptions) -> Duration {
    opts.block + Duration::from_secs(1)
}

impl Clients {
    /// A new connection for one follower's blocking reads.
    pub(crate) async fn dedicated(&self, opts: &FanoutOptions) -> Result<Conn, StoreError> {
        let connecting = async {
            match self {
                Self::Single(client) => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(opts.connection_timeout))
                        .set_response_timeout(Some(blocking_timeout(opts)));
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::Plain)
                }
                Self::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            }
        };
        match tokio::time::timeout(opts.connection_timeout * 2, connecting).await {
            Ok(r) => r.map_err(map_error),
            Err(_) => Err(unavailable("connecting for a blocking read took too long")),
        }
    }
}

/// The shared connection and the maker of dedicated ones for `url`.
pub(crate) async fn connect(
    url: &str,
    opts: &FanoutOptions,
) -> Result<(Conn, Clients), StoreError> {
    let connecting = async {
        match idemgate_redis::cluster_nodes(url) {
            Some(nodes) => {
                let shared = ClusterClient::builder(nodes.clone())
                    .connection_timeout(opts.connection_timeout)
                    .response_timeout(opts.response_timeout)
                    .retries(2)
                    .build()
                    .map_err(map_error)?;
                let conn = shared.get_async_connection().await.map_err(map_error)?;
                let blocking = ClusterClient::builder(nodes)
                    .connection_timeout(opts.connection_timeout)
                    .response_timeout(blocking_timeout(opts))
                    .retries(1)
                    .build()
                    .map_err(map_error)?;
                Ok((Conn::Cluster(conn), Clients::Cluster(Box::new(blocking))))
            }
            None => {
                let client = redis::Client::open(url).map_err(map_error)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(opts.connection_timeout))
                    .set_response_timeout(Some(opts.response_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(250));
                let conn = ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map_err(map_error)?;
                Ok((Conn::Single(conn), Clients::Single(client)))
            }
        }
    };
    match tokio::time::timeout(opts.connection_timeout * 3, connecting).await {
        Ok(r) => r,
        Err(_) => Err(unavailable("connecting took too long")),
    }
}

/// A driver error as a store error: unreachable or timed out →
/// `Unavailable`, anything else → `Rejected`.
pub(crate) fn map_error(e: RedisError) -> StoreError {
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Rejected
    };
    StoreError::new(kind, BACKEND, format!("live events: {e}")).with_source(e)
}

pub(crate) fn rejected(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Rejected, BACKEND, message)
}

fn unavailable(message: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        BACKEND,
        format!("live events: {message}"),
    )
}
