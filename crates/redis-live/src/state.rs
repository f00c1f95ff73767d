//! [`Inner`], what the backend shares with every publisher and follower it
//! hands out: the in-process registry, the connections and the settings.
//! A leaf below the backend (`lib.rs`) and its two sides (`publish`,
//! `follow`), so that neither side depends on the module that creates it.

use idemgate_engine::StoreError;
use idemgate_layer::InProcessLive;
use idemgate_redis::Conn;

use crate::conn::Clients;
use crate::options::FanoutOptions;

/// The backend's shared part; [`crate::RedisLiveEvents`] is a cheap handle
/// on it.
#[derive(Debug)]
pub(crate) struct Inner {
    /// Streams of this process, for duplicates served here.
    pub(crate) local: InProcessLive,
    /// Writes and non-blocking reads.
    pub(crate) shared: Conn,
    /// Makes dedicated connections for blocking reads.
    pub(crate) clients: Clients,
    pub(crate) opts: FanoutOptions,
}

impl Inner {
    /// A handle on the shared connection (writes, quick reads).
    pub(crate) fn shared(&self) -> Conn {
        self.shared.clone()
    }

    /// A new connection for one follower's blocking reads.
    pub(crate) async fn dedicated(&self) -> Result<Conn, StoreError> {
        self.clients.dedicated(&self.opts).await
    }
}
