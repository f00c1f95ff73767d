//! Connections of the live event streams: one shared connection for writes
//! and quick reads, and a dedicated one per follower for blocking reads.
//!
//! The connection type ([`Conn`]) and the error mapping ([`map_error`]) are
//! the Redis store's, so that a command, a timeout or an outage is handled
//! the same way whether it hit a record or its stream. What is added here
//! is only what blocking reads need: a client that makes connections whose
//! response timeout is longer than the block.

use std::fmt;
use std::time::Duration;

use idemgate_engine::{StoreError, StoreErrorKind};
use idemgate_redis::{BACKEND, Conn, Endpoint, map_error};
use redis::AsyncConnectionConfig;
use redis::cluster::ClusterClient;

use crate::options::FanoutOptions;

/// What makes dedicated connections.
pub(crate) enum Clients {
    Single(Box<redis::Client>),
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
    /// The maker of dedicated connections for `url`.
    fn new(url: &str, opts: &FanoutOptions) -> Result<Self, StoreError> {
        let endpoint = Endpoint::parse(url).map_err(map_error)?;
        if endpoint.is_cluster() {
            endpoint
                .cluster_builder()
                .connection_timeout(opts.connection_timeout)
                .response_timeout(blocking_timeout(opts))
                .retries(1)
                .build()
                .map(|c| Self::Cluster(Box::new(c)))
                .map_err(map_error)
        } else {
            endpoint
                .node_client()
                .map(|c| Self::Single(Box::new(c)))
                .map_err(map_error)
        }
    }

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
    let clients = Clients::new(url, opts)?;
    let connecting = Conn::open(url, opts.connection_timeout, opts.response_timeout);
    match tokio::time::timeout(opts.connection_timeout * 3, connecting).await {
        Ok(r) => Ok((r.map_err(map_error)?, clients)),
        Err(_) => Err(unavailable("connecting took too long")),
    }
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
