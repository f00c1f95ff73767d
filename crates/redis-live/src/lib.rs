//! Live SSE events across idemgate replicas through Redis Streams: the
//! `LiveEvents` backend for deployments whose records are in Redis.
//!
//! A duplicate of a streaming request that is still being generated joins
//! the live stream ("attach"). Inside one process the layer's in-process
//! registry serves it; with several gateway replicas behind a load
//! balancer, the duplicate often lands on a replica that does not run the
//! stream. [`RedisLiveEvents`] makes the stream visible to every replica
//! that shares the Redis holding the records.
//!
//! # Layout
//! - this file: [`RedisLiveEvents`], the `LiveEvents` backend, on top of
//!   the modules below.
//! - `options`: [`FanoutOptions`].
//! - `state`: what the backend shares with its publishers and followers.
//! - `conn`: the shared connection and dedicated connections for blocking
//!   reads, on the Redis store's connection type and error mapping.
//! - `entry`: stream entry ids, the decoding of replies, and the sealing of
//!   entries with the store's key ring.
//! - `publish`: the owner's side — a background writer per stream.
//! - `follow`: a follower's side — `XRANGE` from the cursor, then
//!   `XREAD BLOCK`.
//!
//! # The key decision
//! **One stream per record, entry ids chosen by the owner: `<fence>-0` is
//! the response head, `<fence>-<n>` is event `n` (the id the client saw),
//! `<fence>-<last + 1>` is the end marker.** The stream key sits under the
//! record's hash tag (`<prefix>:{…}:live`), so it lives in the record's
//! cluster slot. Because the ids carry the owner's fence:
//! - a `Last-Event-ID: n` retry reads exactly the entries after `<fence>-n`;
//! - a follower notices at once when the key was taken over (an entry of
//!   another fence) and stops instead of splicing two executions together;
//! - a stale owner (paused past its lease, then resumed) cannot append:
//!   Redis refuses an id below the stream's top, so its late events never
//!   reach followers of the new owner.
//!
//! Publishing is fire-and-forget from the owner's point of view: events go
//! through a channel to a per-stream writer task that pipelines `XADD`s
//! (`MAXLEN ~`, refreshed `PEXPIRE`), so a slow or absent Redis never slows
//! the client that is being served. When the writer cannot deliver, it
//! stops; followers then see the stream go quiet, and the layer falls back
//! to the stored DONE record (after checking that what it already sent is
//! what was stored). Followers block in `XREAD BLOCK` on a **dedicated**
//! connection: the shared multiplexed one has a short response timeout and
//! would stall every other command behind a blocking read.
//!
//! Duplicates served by the process that runs the stream use the in-process
//! registry (no Redis round trip); only the others read the stream.
//!
//! With a key ring ([`FanoutOptions::key_ring`]) the head and the events
//! are sealed as stored answers are: Redis never holds them readable. An
//! entry that does not open is a store error, never skipped: joining
//! returns `Joined::Failed`, following ends the stream as failed, and
//! [`FanoutOptions::on_seal_failure`] counts it.

mod conn;
mod entry;
mod follow;
mod options;
mod publish;
mod state;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use idemgate_engine::{ScopedKey, StoreError};
use idemgate_layer::live::{Joined, LivePublisher, LiveStream};
use idemgate_layer::{InProcessLive, LiveEvents};
use tokio::time::Instant;

use crate::follow::RemoteFollow;
pub use crate::options::FanoutOptions;
use crate::publish::RedisPublisher;
use crate::state::Inner;

/// The Redis Streams live-event backend. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RedisLiveEvents {
    inner: Arc<Inner>,
}

impl RedisLiveEvents {
    /// Connects to `redis://host:port[/db]` or `redis+cluster://host:port[,…]`.
    ///
    /// # Errors
    /// `Rejected` for a malformed URL or prefix; `Unavailable` when the
    /// server cannot be reached.
    pub async fn connect(url: &str, opts: FanoutOptions) -> Result<Self, StoreError> {
        if opts.prefix.is_empty() || opts.prefix.contains(['{', '}']) {
            return Err(conn::rejected(format!(
                "key prefix {:?} must be non-empty and free of '{{' and '}}'",
                opts.prefix
            )));
        }
        let (shared, clients) = conn::connect(url, &opts).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                local: InProcessLive::default(),
                shared,
                clients,
                opts,
            }),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &FanoutOptions {
        &self.inner.opts
    }

    /// The stream key of a record.
    pub fn stream_key(&self, key: &ScopedKey) -> String {
        format!(
            "{}:{}:live",
            self.inner.opts.prefix,
            idemgate_redis::hash_tag(key)
        )
    }
}

impl LiveEvents for RedisLiveEvents {
    fn publish(&self, stream: LiveStream) -> Box<dyn LivePublisher> {
        let key = self.stream_key(&stream.key);
        let local = self.inner.local.publish(stream.clone());
        Box::new(RedisPublisher::new(
            Arc::clone(&self.inner),
            local,
            key,
            &stream,
        ))
    }

    fn join<'a>(
        &'a self,
        key: &'a ScopedKey,
        fence: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Joined> {
        Box::pin(async move {
            match self.inner.local.join(key, fence, deadline).await {
                Joined::Unknown => {}
                found => return found,
            }
            let stream = self.stream_key(key);
            match follow::head(&self.inner, &stream, fence).await {
                Ok(Some((status, headers))) => Joined::Streaming {
                    status,
                    headers,
                    follow: Box::new(RemoteFollow::new(Arc::clone(&self.inner), stream, fence)),
                },
                Ok(None) => Joined::Unknown,
                Err(e) => Joined::Failed(e),
            }
        })
    }

    fn local_streams(&self) -> usize {
        self.inner.local.local_streams()
    }
}
