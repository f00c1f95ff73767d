//! [`FanoutOptions`], the settings of the live event streams. A leaf: the
//! backend, its connections and its readers and writers all read them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idemgate_seal::KeyRing;
use idemgate_seal::store::FailureHook;

/// Settings of [`RedisLiveEvents`](crate::RedisLiveEvents). `Default` gives
/// the documented defaults.
#[derive(Clone)]
pub struct FanoutOptions {
    /// Key prefix (default `idemgate`), the same as the store's so that a
    /// record and its stream share a hash slot.
    pub prefix: String,
    /// Approximate bound on entries kept per stream (`XADD MAXLEN ~`,
    /// default 10 000). A follower that falls behind a trimmed stream
    /// finishes from the stored result.
    pub max_len: u64,
    /// How long one blocking read waits before the follower reports that
    /// it has no news (default 1 s); the layer then looks at the store.
    pub block: Duration,
    /// How long a stream is kept after its end marker (default 60 s), for
    /// followers still reading; later duplicates replay the stored result.
    pub end_grace: Duration,
    /// Response timeout of the shared connection (default 500 ms).
    pub response_timeout: Duration,
    /// Connection timeout (default 1 s).
    pub connection_timeout: Duration,
    /// Entries read per round trip (default 512).
    pub read_count: u64,
    /// Seals the head and event entries (default none: written as
    /// received). Every replica needs the keys the others seal under.
    pub key_ring: Option<Arc<KeyRing>>,
    /// Called with each entry that could not be sealed or opened, as
    /// `SealedStore`'s hook is for records (a metric counts both).
    pub on_seal_failure: Option<FailureHook>,
}

impl fmt::Debug for FanoutOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FanoutOptions")
            .field("prefix", &self.prefix)
            .field("max_len", &self.max_len)
            .field("block", &self.block)
            .field("end_grace", &self.end_grace)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("read_count", &self.read_count)
            .field("key_ring", &self.key_ring)
            .field("on_seal_failure", &self.on_seal_failure.is_some())
            .finish()
    }
}

impl Default for FanoutOptions {
    fn default() -> Self {
        Self {
            prefix: "idemgate".to_owned(),
            max_len: 10_000,
            block: Duration::from_secs(1),
            end_grace: Duration::from_secs(60),
            response_timeout: Duration::from_millis(500),
            connection_timeout: Duration::from_secs(1),
            read_count: 512,
            key_ring: None,
            on_seal_failure: None,
        }
    }
}

impl FanoutOptions {
    /// Sets the key prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Seals the stream's head and event entries with `ring`.
    pub fn key_ring(mut self, ring: Arc<KeyRing>) -> Self {
        self.key_ring = Some(ring);
        self
    }

    /// Calls `hook` with each entry that could not be sealed or opened.
    pub fn on_seal_failure(mut self, hook: FailureHook) -> Self {
        self.on_seal_failure = Some(hook);
        self
    }

    /// Sets how long one blocking read waits.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Sets the approximate bound on entries per stream.
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = max_len;
        self
    }
}
