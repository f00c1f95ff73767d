//! Streams in progress, so that a duplicate request can join a stream that
//! is still being generated ("attach").
//!
//! The store knows only PENDING or DONE; the events of a PENDING stream
//! exist only where it runs. Each running execution publishes them through
//! a [`LiveEvents`] backend: first whether its response is a stream (and
//! its head), then every event, then how it ended. A duplicate joins with
//! [`LiveEvents::join`] and follows the events from its cursor on.
//!
//! [`InProcessLive`] (the default) keeps them in this process: a duplicate
//! served by another replica finds nothing and waits for DONE, then
//! replays. A backend that shares them between replicas (Redis Streams, in
//! the `idemgate-redis-live` crate) lets it follow the live stream instead.
//!
//! A follower that cannot say more for now ([`Next::Unsure`]: a shared log
//! went quiet or lost entries) is not trusted blindly: the layer then looks
//! at the store, goes on following while the key is PENDING, and finishes
//! from the DONE record once it is stored — after checking that the events
//! it already sent are the stored ones, so a client never gets the first
//! half of one execution and the second half of another.
//!
//! The in-process state sits in a `tokio::sync::watch` channel: it never
//! loses a wake-up between a subscriber's read and its wait, and publishing
//! costs one short lock with nobody subscribed.

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;
use idemgate_engine::{ScopedKey, StoreError};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::stored::concat;

/// Which execution a publisher speaks for.
#[derive(Debug, Clone)]
pub struct LiveStream {
    /// The record's key.
    pub key: ScopedKey,
    /// The owner's fence: a backend shared by replicas uses it to tell the
    /// events of one owner from those of an owner that took the key over.
    pub fence: u64,
    /// How long the execution may still run (the layer's completion
    /// bound): a shared log of its events may expire after that.
    pub horizon: Duration,
}

/// Where streams in progress are published and joined.
///
/// # Behavior
/// - [`publish`](Self::publish) is called by a key's owner before it calls
///   the inner service; the returned publisher is told the response head,
///   each (id-rewritten) event, and the end. Publishing never blocks and
///   never fails the owner: a backend that cannot deliver drops events, and
///   its followers then see [`Next::Unsure`] or [`Next::Failed`].
/// - [`join`](Self::join) finds the stream of `key` run by the owner with
///   `fence` (the fence of the PENDING record found) if one is known: it
///   may wait until `deadline` for the owner to know whether its response
///   is a stream. [`Joined::Unknown`] means "nothing to follow here": the caller
///   waits for the record in the store instead; [`Joined::Failed`] is a
///   store error.
pub trait LiveEvents: Send + Sync + fmt::Debug {
    /// Starts publishing one execution.
    fn publish(&self, stream: LiveStream) -> Box<dyn LivePublisher>;

    /// Joins the stream of `key`, if one is known.
    fn join<'a>(
        &'a self,
        key: &'a ScopedKey,
        fence: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Joined>;

    /// Streams being published by this process now.
    fn local_streams(&self) -> usize;
}

/// The owner's side of a published stream. Dropping it without
/// [`complete`](Self::complete) counts as [`fail`](Self::fail), so a
/// panicking owner cannot leave followers waiting.
pub trait LivePublisher: Send + Sync + fmt::Debug {
    /// The response is an event stream with this head (as attachers get it).
    fn streaming(&self, status: StatusCode, headers: HeaderMap);
    /// The response is not an event stream.
    fn not_streaming(&self);
    /// One more event, already rewritten with its sequential id.
    fn event(&self, event: Bytes);
    /// The stream is stored DONE.
    fn complete(self: Box<Self>);
    /// The stream broke; the key was released.
    fn fail(self: Box<Self>);
}

/// A follower of one stream.
pub trait LiveFollower: Send + Sync + fmt::Debug {
    /// Events after `*cursor` (advancing it by their number), waiting for
    /// new ones; or how the stream ended once every event was read.
    fn next<'a>(&'a mut self, cursor: &'a mut usize) -> BoxFuture<'a, Next>;
}

/// What [`LiveEvents::join`] found.
#[derive(Debug)]
pub enum Joined {
    /// An event stream: follow it.
    Streaming {
        /// The response status.
        status: StatusCode,
        /// The response headers for attachers.
        headers: HeaderMap,
        /// The events.
        follow: Box<dyn LiveFollower>,
    },
    /// Not a stream: wait for DONE in the store.
    NotStreaming,
    /// No stream known (none, not yet, or it ended): look at the store.
    Unknown,
    /// A stream is known but cannot be read: a store error (for example an
    /// entry sealed under a key this process does not hold). The caller
    /// answers as it answers any store error while attaching.
    Failed(StoreError),
}

/// The next piece of a followed stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Events (concatenated) from the cursor on.
    Events(Bytes),
    /// The stream ended cleanly and is stored.
    End,
    /// The stream broke, or another owner took the key over.
    Failed,
    /// The follower cannot say more for now (quiet for a while, entries
    /// lost): the caller should look at the store before asking again.
    Unsure,
}

/// The in-process backend: streams are visible to duplicates served by
/// this process only.
#[derive(Debug, Clone, Default)]
pub struct InProcessLive {
    registry: LiveRegistry,
}

impl LiveEvents for InProcessLive {
    fn publish(&self, stream: LiveStream) -> Box<dyn LivePublisher> {
        Box::new(self.registry.publish(stream.key.storage_id(), stream.fence))
    }

    fn join<'a>(
        &'a self,
        key: &'a ScopedKey,
        fence: u64,
        deadline: Instant,
    ) -> BoxFuture<'a, Joined> {
        Box::pin(async move {
            let Some(sub) = self.registry.get(&key.storage_id(), fence) else {
                return Joined::Unknown;
            };
            match sub.head(deadline).await {
                Head::Streaming {
                    status,
                    headers,
                    follow,
                } => Joined::Streaming {
                    status,
                    headers,
                    follow: Box::new(follow),
                },
                Head::NotStreaming => Joined::NotStreaming,
                Head::Gone => Joined::Unknown,
            }
        })
    }

    fn local_streams(&self) -> usize {
        self.registry.len()
    }
}

/// The execution's progress as subscribers see it.
#[derive(Debug)]
struct LiveState {
    phase: Phase,
    events: Vec<Bytes>,
    end: Option<End>,
}

#[derive(Debug, Clone)]
enum Phase {
    /// The inner service has not answered yet.
    Starting,
    /// The response is an event stream with this head.
    Streaming {
        status: StatusCode,
        headers: HeaderMap,
    },
    /// The response is not a stream: duplicates wait for DONE in the store.
    NotStreaming,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Stored DONE: the events are the whole stream.
    Complete,
    /// Broke, timed out or was cancelled: the key was released.
    Failed,
}

/// The live execution of one key: its owner's fence and its progress.
type Entry = (u64, Arc<watch::Sender<LiveState>>);

/// Map from storage id to the live execution of that key in this process.
///
/// Each entry carries its owner's fence, and a duplicate joins only the
/// stream of the owner whose fence the record holds now: an owner whose
/// lease was taken over may still be relaying its (unstorable) stream in
/// this process, and a duplicate that joined it would get a result the
/// store will never hold.
#[derive(Debug, Clone, Default)]
struct LiveRegistry {
    /// Held only to look up, insert or remove, never across an `.await`.
    map: Arc<Mutex<HashMap<String, Entry>>>,
}

impl LiveRegistry {
    /// Registers the execution of `id` by the owner with `fence` (replacing
    /// the entry of an owner with a lower fence, never one with a higher
    /// fence) and returns its publisher.
    fn publish(&self, id: String, fence: u64) -> Publisher {
        let (tx, _) = watch::channel(LiveState {
            phase: Phase::Starting,
            events: Vec::new(),
            end: None,
        });
        let tx = Arc::new(tx);
        let mut map = self.lock();
        if map.get(&id).is_none_or(|(current, _)| *current <= fence) {
            map.insert(id.clone(), (fence, Arc::clone(&tx)));
        }
        drop(map);
        Publisher {
            registry: self.clone(),
            id,
            tx,
            ended: false,
        }
    }

    /// The live execution of `id` by the owner with `fence`, if this
    /// process runs it.
    fn get(&self, id: &str, fence: u64) -> Option<Subscription> {
        let tx = self
            .lock()
            .get(id)
            .filter(|(owner, _)| *owner == fence)
            .map(|(_, tx)| Arc::clone(tx))?;
        Some(Subscription { rx: tx.subscribe() })
    }

    /// Number of live executions (for tests and diagnostics).
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The owner's side. Dropping it without [`Publisher::complete`] marks the
/// execution failed (subscribers' streams end with an error) and removes
/// the entry, so a panicking owner cannot leave a stale entry behind.
#[derive(Debug)]
struct Publisher {
    registry: LiveRegistry,
    id: String,
    tx: Arc<watch::Sender<LiveState>>,
    ended: bool,
}

impl LivePublisher for Publisher {
    fn streaming(&self, status: StatusCode, headers: HeaderMap) {
        self.tx
            .send_modify(|s| s.phase = Phase::Streaming { status, headers });
    }

    fn not_streaming(&self) {
        self.tx.send_modify(|s| {
            if matches!(s.phase, Phase::Starting) {
                s.phase = Phase::NotStreaming;
            }
        });
    }

    fn event(&self, event: Bytes) {
        self.tx.send_modify(|s| s.events.push(event));
    }

    fn complete(mut self: Box<Self>) {
        self.end(End::Complete);
    }

    fn fail(mut self: Box<Self>) {
        self.end(End::Failed);
    }
}

impl Publisher {
    fn end(&mut self, end: End) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.tx.send_modify(|s| s.end = Some(end));
        let mut map = self.registry.lock();
        if map
            .get(&self.id)
            .is_some_and(|(_, t)| Arc::ptr_eq(t, &self.tx))
        {
            map.remove(&self.id);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.end(End::Failed);
    }
}

/// A subscriber's side.
#[derive(Debug)]
struct Subscription {
    rx: watch::Receiver<LiveState>,
}

/// What a subscriber found when it waited for the response head.
#[derive(Debug)]
enum Head {
    /// An event stream: follow it.
    Streaming {
        status: StatusCode,
        headers: HeaderMap,
        follow: Follow,
    },
    /// Not a stream: wait for DONE in the store.
    NotStreaming,
    /// The execution ended before answering (failed), or the wait ran out.
    Gone,
}

impl Subscription {
    /// Waits (until `deadline`) for the owner to know whether its response
    /// is a stream.
    async fn head(mut self, deadline: Instant) -> Head {
        loop {
            {
                let s = self.rx.borrow_and_update();
                match &s.phase {
                    Phase::Streaming { status, headers } => {
                        let (status, headers) = (*status, headers.clone());
                        drop(s);
                        return Head::Streaming {
                            status,
                            headers,
                            follow: Follow { rx: self.rx },
                        };
                    }
                    Phase::NotStreaming => return Head::NotStreaming,
                    Phase::Starting if s.end.is_some() => return Head::Gone,
                    Phase::Starting => {}
                }
            }
            match tokio::time::timeout_at(deadline, self.rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Head::Gone,
            }
        }
    }
}

/// Follows a live stream's events.
#[derive(Debug)]
struct Follow {
    rx: watch::Receiver<LiveState>,
}

impl LiveFollower for Follow {
    fn next<'a>(&'a mut self, cursor: &'a mut usize) -> BoxFuture<'a, Next> {
        Box::pin(self.next_events(cursor))
    }
}

impl Follow {
    async fn next_events(&mut self, cursor: &mut usize) -> Next {
        loop {
            {
                let s = self.rx.borrow_and_update();
                if *cursor < s.events.len() {
                    let chunk = concat(s.events.get(*cursor..).unwrap_or_default());
                    *cursor = s.events.len();
                    return Next::Events(chunk);
                }
                match s.end {
                    Some(End::Complete) => return Next::End,
                    Some(End::Failed) => return Next::Failed,
                    None => {}
                }
            }
            if self.rx.changed().await.is_err() {
                // The owner dropped its publisher without a clean end.
                let s = self.rx.borrow();
                if s.end == Some(End::Complete) && *cursor >= s.events.len() {
                    return Next::End;
                }
                if *cursor < s.events.len() {
                    continue;
                }
                return Next::Failed;
            }
        }
    }
}

#[cfg(test)]
mod tests;
