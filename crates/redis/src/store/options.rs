//! [`RedisOptions`]: the store's settings and their documented defaults.

use std::time::Duration;

use crate::replication::WaitReplicas;

/// Settings of a [`RedisStore`](super::RedisStore). `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Prefix of every key the store writes (default `idemgate`). Lets
    /// several deployments share one Redis; must not contain `{` or `}`.
    pub prefix: String,
    /// How long one command may wait for its answer (default 500 ms).
    pub response_timeout: Duration,
    /// How long one connection attempt may take (default 1 s).
    pub connection_timeout: Duration,
    /// Upper bound on one store operation, reconnection included (default
    /// 1.5 s). During an outage every operation ends within this bound with
    /// an `Unavailable` error.
    pub operation_timeout: Duration,
    /// How long a key's last fence is remembered after its last claim
    /// (default 7 days). Beyond that, fences still grow because they are at
    /// least the server time in µs.
    pub fence_memory: Duration,
    /// Whether timeline entries that change no record (replays,
    /// conflicts, mismatches) are written by a background task in batches
    /// (default true), so that a replay costs one round trip instead of two.
    /// Such entries are best effort either way.
    pub background_timeline: bool,
    /// How many replicas must acknowledge a DONE record before it counts
    /// as written (default [`WaitReplicas::Auto`]: 1 when the master
    /// reports a connected replica). See the `replication` module.
    pub wait_replicas: WaitReplicas,
    /// How long a completion waits for those acknowledgements (default
    /// 500 ms) before it is reported as not written yet.
    pub wait_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: "idemgate".to_owned(),
            response_timeout: Duration::from_millis(500),
            connection_timeout: Duration::from_secs(1),
            operation_timeout: Duration::from_millis(1500),
            fence_memory: Duration::from_secs(7 * 24 * 3600),
            background_timeline: true,
            wait_replicas: WaitReplicas::Auto,
            wait_timeout: Duration::from_millis(500),
        }
    }
}

impl RedisOptions {
    /// Sets the key prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the per-command response timeout.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets the connection timeout.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Sets the bound on one store operation.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Sets how long a key's last fence is remembered.
    pub fn fence_memory(mut self, memory: Duration) -> Self {
        self.fence_memory = memory;
        self
    }

    /// Sets how many replicas must acknowledge a DONE record.
    pub fn wait_replicas(mut self, wanted: WaitReplicas) -> Self {
        self.wait_replicas = wanted;
        self
    }

    /// Sets how long a completion waits for its replicas.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// Sets whether timeline entries of replays and conflicts are written in
    /// the background.
    pub fn background_timeline(mut self, on: bool) -> Self {
        self.background_timeline = on;
        self
    }
}
