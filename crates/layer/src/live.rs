//! Live streams of this process, so that a duplicate request can join a
//! stream that is still being generated ("attach").
//!
//! The store knows only PENDING or DONE; the events of a PENDING stream
//! exist only in the process that runs it. Each running execution publishes
//! here: first whether its response is a stream (and its head), then every
//! event, then how it ended. A subscriber reads the events so far and is
//! woken for each new one. An entry leaves the registry when its stream
//! ends; a duplicate arriving later finds the key DONE (or free) in the store.
//! A duplicate served by another process finds no entry and waits for DONE.
//!
//! State sits in a `tokio::sync::watch` channel: it never loses a wake-up
//! between a subscriber's read and its wait, and publishing costs one short
//! lock with nobody subscribed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::stored::concat;

/// The execution's progress as subscribers see it.
#[derive(Debug)]
pub(crate) struct LiveState {
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

/// Map from storage id to the live execution of that key in this process.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveRegistry {
    /// Held only to look up, insert or remove, never across an `.await`.
    map: Arc<Mutex<HashMap<String, Arc<watch::Sender<LiveState>>>>>,
}

impl LiveRegistry {
    /// Registers the execution of `id` (replacing a stale entry) and returns
    /// its publisher.
    pub(crate) fn publish(&self, id: String) -> Publisher {
        let (tx, _) = watch::channel(LiveState {
            phase: Phase::Starting,
            events: Vec::new(),
            end: None,
        });
        let tx = Arc::new(tx);
        self.lock().insert(id.clone(), Arc::clone(&tx));
        Publisher {
            registry: self.clone(),
            id,
            tx,
            ended: false,
        }
    }

    /// The live execution of `id`, if this process runs one.
    pub(crate) fn get(&self, id: &str) -> Option<Subscription> {
        let tx = self.lock().get(id).cloned()?;
        Some(Subscription { rx: tx.subscribe() })
    }

    /// Number of live executions (for tests and diagnostics).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<watch::Sender<LiveState>>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The owner's side. Dropping it without [`Publisher::complete`] marks the
/// execution failed (subscribers' streams end with an error) and removes
/// the entry, so a panicking owner cannot leave a stale entry behind.
#[derive(Debug)]
pub(crate) struct Publisher {
    registry: LiveRegistry,
    id: String,
    tx: Arc<watch::Sender<LiveState>>,
    ended: bool,
}

impl Publisher {
    /// The response is an event stream with this head.
    pub(crate) fn streaming(&self, status: StatusCode, headers: HeaderMap) {
        self.tx
            .send_modify(|s| s.phase = Phase::Streaming { status, headers });
    }

    /// The response is not an event stream.
    pub(crate) fn not_streaming(&self) {
        self.tx.send_modify(|s| {
            if matches!(s.phase, Phase::Starting) {
                s.phase = Phase::NotStreaming;
            }
        });
    }

    /// One more event (already rewritten).
    pub(crate) fn event(&self, event: Bytes) {
        self.tx.send_modify(|s| s.events.push(event));
    }

    /// The stream is stored DONE.
    pub(crate) fn complete(mut self) {
        self.end(End::Complete);
    }

    /// The stream broke; the key was released.
    pub(crate) fn fail(mut self) {
        self.end(End::Failed);
    }

    fn end(&mut self, end: End) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.tx.send_modify(|s| s.end = Some(end));
        let mut map = self.registry.lock();
        if map.get(&self.id).is_some_and(|t| Arc::ptr_eq(t, &self.tx)) {
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
pub(crate) struct Subscription {
    rx: watch::Receiver<LiveState>,
}

/// What a subscriber found when it waited for the response head.
#[derive(Debug)]
pub(crate) enum Head {
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
    pub(crate) async fn head(mut self, deadline: Instant) -> Head {
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
pub(crate) struct Follow {
    rx: watch::Receiver<LiveState>,
}

/// The next piece of a followed stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Events (concatenated) from the cursor on.
    Events(Bytes),
    /// The stream ended cleanly and is stored.
    End,
    /// The stream broke (or its owner went away).
    Failed,
}

impl Follow {
    /// Events after `*cursor` (advancing it), waiting for new ones; or how
    /// the stream ended once every event was read.
    pub(crate) async fn next(&mut self, cursor: &mut usize) -> Next {
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
mod tests {
    use super::*;
    use std::time::Duration;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn subscriber_sees_events_so_far_then_live_ones_then_the_end() {
        let reg = LiveRegistry::default();
        let p = reg.publish("k".into());
        p.streaming(StatusCode::OK, HeaderMap::new());
        p.event(Bytes::from_static(b"a"));
        p.event(Bytes::from_static(b"b"));
        let Head::Streaming { mut follow, .. } = reg.get("k").unwrap().head(deadline()).await
        else {
            panic!("expected a stream");
        };
        let mut cursor = 1;
        assert_eq!(
            follow.next(&mut cursor).await,
            Next::Events(Bytes::from_static(b"b"))
        );
        let waiter = tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                match follow.next(&mut cursor).await {
                    Next::Events(b) => got.push(b),
                    other => return (got, other),
                }
            }
        });
        p.event(Bytes::from_static(b"c"));
        p.complete();
        let (got, end) = waiter.await.unwrap();
        assert_eq!(got.concat(), b"c");
        assert_eq!(end, Next::End);
        assert!(reg.get("k").is_none());
        assert_eq!(reg.len(), 0);
    }

    #[tokio::test]
    async fn a_dropped_publisher_fails_its_subscribers_and_leaves() {
        let reg = LiveRegistry::default();
        let p = reg.publish("k".into());
        p.streaming(StatusCode::OK, HeaderMap::new());
        let Head::Streaming { mut follow, .. } = reg.get("k").unwrap().head(deadline()).await
        else {
            panic!("expected a stream");
        };
        drop(p);
        let mut cursor = 0;
        assert_eq!(follow.next(&mut cursor).await, Next::Failed);
        assert!(reg.get("k").is_none());
    }

    #[tokio::test]
    async fn non_streaming_and_failed_heads() {
        let reg = LiveRegistry::default();
        let p = reg.publish("a".into());
        let sub = reg.get("a").unwrap();
        p.not_streaming();
        assert!(matches!(sub.head(deadline()).await, Head::NotStreaming));
        let q = reg.publish("b".into());
        let sub = reg.get("b").unwrap();
        q.fail();
        assert!(matches!(sub.head(deadline()).await, Head::Gone));
        let _r = reg.publish("c".into());
        let sub = reg.get("c").unwrap();
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(matches!(sub.head(soon).await, Head::Gone));
    }

    #[tokio::test]
    async fn a_replaced_entry_is_not_removed_by_the_old_publisher() {
        let reg = LiveRegistry::default();
        let old = reg.publish("k".into());
        let new = reg.publish("k".into());
        old.fail();
        assert!(reg.get("k").is_some());
        new.complete();
        assert!(reg.get("k").is_none());
    }
}
