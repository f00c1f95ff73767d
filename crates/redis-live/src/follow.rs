//! A follower's side: the head, then `XRANGE` from the cursor on the
//! shared connection, then `XREAD BLOCK` on a dedicated one.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use idemgate_engine::StoreError;
use idemgate_layer::live::{LiveFollower, Next};
use idemgate_redis::Conn;
use redis::Value;

use crate::entry::{self, Entry, Kind, MAX_SEQ, id};
use crate::state::Inner;

/// The head of the stream of the owner with `fence`, if it has published
/// one (`None` too when Redis cannot be read: the caller looks at the
/// store, which reports an outage itself).
///
/// # Errors
/// A head that does not open (`Corrupt`): it must not be mistaken for no
/// stream at all.
pub(crate) async fn head(
    inner: &Inner,
    key: &str,
    fence: u64,
) -> Result<Option<(StatusCode, HeaderMap)>, StoreError> {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(key).arg(id(fence, 0)).arg(id(fence, 0));
    let reply: Value = match inner.shared().query(&cmd).await {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(error = %e, "live stream head not readable");
            return Ok(None);
        }
    };
    let Some(entries) = entry::range(&reply) else {
        return Ok(None);
    };
    match entries.first() {
        Some(Entry {
            kind: Kind::Head(value),
            ..
        }) => {
            let opened = entry::open_entry(&inner.opts, key, fence, 0, "h", value)?;
            Ok(entry::decode_head(&opened))
        }
        _ => Ok(None),
    }
}

/// Follows the stream of one owner.
pub(crate) struct RemoteFollow {
    inner: Arc<Inner>,
    key: String,
    fence: u64,
    /// Entries read and not yet handed out.
    backlog: VecDeque<Entry>,
    /// The dedicated connection for blocking reads, once opened.
    blocking: Option<Conn>,
    /// Whether the first (non-blocking) read was made.
    caught_up: bool,
    /// Entries went missing (trimmed, or a writer stopped): only the stored
    /// result can finish this stream.
    lost: bool,
    /// An entry did not open: the follow ends as failed, once the events
    /// before it are handed out.
    broken: bool,
}

impl std::fmt::Debug for RemoteFollow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFollow")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("backlog", &self.backlog.len())
            .field("lost", &self.lost)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl RemoteFollow {
    pub(crate) fn new(inner: Arc<Inner>, key: String, fence: u64) -> Self {
        Self {
            inner,
            key,
            fence,
            backlog: VecDeque::new(),
            blocking: None,
            caught_up: false,
            lost: false,
            broken: false,
        }
    }

    /// Hands out what the backlog holds from `cursor` on.
    fn drain(&mut self, cursor: &mut usize) -> Option<Next> {
        if self.broken {
            return Some(Next::Failed);
        }
        let mut chunk = BytesMut::new();
        while let Some(e) = self.backlog.front() {
            let next_seq = u64::try_from(*cursor).unwrap_or(u64::MAX).saturating_add(1);
            if e.fence != self.fence {
                // Another owner took the key over.
                self.backlog.clear();
                return Some(if chunk.is_empty() {
                    Next::Failed
                } else {
                    Next::Events(chunk.freeze())
                });
            }
            if e.seq < next_seq {
                if let Kind::End { complete } = e.kind {
                    // The client's cursor (its `Last-Event-ID`) is beyond
                    // the end of the stream: nothing more to send.
                    if !chunk.is_empty() {
                        break;
                    }
                    self.backlog.clear();
                    return Some(if complete { Next::End } else { Next::Failed });
                }
                // Already handed out (or the head).
                self.backlog.pop_front();
                continue;
            }
            if e.seq > next_seq {
                self.lost = true;
                self.backlog.clear();
                break;
            }
            match &e.kind {
                Kind::Event(b) => {
                    match entry::open_entry(&self.inner.opts, &self.key, e.fence, e.seq, "e", b) {
                        Ok(b) => {
                            chunk.extend_from_slice(&b);
                            *cursor += 1;
                            self.backlog.pop_front();
                        }
                        Err(err) => {
                            // A store error, as a record that does not
                            // open: the follow fails (after the events
                            // before it), as on a store error mid-stream.
                            tracing::warn!(error = %err, "store failed while following a stream");
                            self.broken = true;
                            self.backlog.clear();
                            if chunk.is_empty() {
                                return Some(Next::Failed);
                            }
                            break;
                        }
                    }
                }
                Kind::End { complete } if chunk.is_empty() => {
                    let complete = *complete;
                    self.backlog.clear();
                    return Some(if complete { Next::End } else { Next::Failed });
                }
                Kind::End { .. } => break,
                Kind::Head(_) | Kind::Other => {
                    self.lost = true;
                    self.backlog.clear();
                    break;
                }
            }
        }
        if !chunk.is_empty() {
            return Some(Next::Events(chunk.freeze()));
        }
        self.lost.then_some(Next::Unsure)
    }

    /// Reads more entries after `cursor`: the first time with `XRANGE` on
    /// the shared connection, then with `XREAD BLOCK` on a dedicated one.
    /// `false` when nothing came (quiet, or Redis could not be read).
    async fn read(&mut self, cursor: usize) -> bool {
        let opts = &self.inner.opts;
        let after = u64::try_from(cursor).unwrap_or(u64::MAX);
        let reply = if self.caught_up {
            if self.blocking.is_none() {
                match self.inner.dedicated().await {
                    Ok(c) => self.blocking = Some(c),
                    Err(e) => {
                        tracing::debug!(error = %e, "no connection for a blocking read");
                        return false;
                    }
                }
            }
            let Some(conn) = self.blocking.as_mut() else {
                return false;
            };
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(opts.read_count)
                .arg("BLOCK")
                .arg(
                    u64::try_from(opts.block.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                )
                .arg("STREAMS")
                .arg(&self.key)
                .arg(id(self.fence, after));
            conn.query::<Value>(&cmd).await.map(|v| entry::read(&v))
        } else {
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(&self.key)
                .arg(id(self.fence, after.saturating_add(1)))
                .arg(id(self.fence, MAX_SEQ))
                .arg("COUNT")
                .arg(opts.read_count);
            let r = self
                .inner
                .shared()
                .query::<Value>(&cmd)
                .await
                .map(|v| entry::range(&v));
            self.caught_up = true;
            r
        };
        match reply {
            Ok(Some(entries)) if !entries.is_empty() => {
                self.backlog.extend(entries);
                true
            }
            Ok(Some(_)) => match self.ended_before(cursor).await {
                Some(end) => {
                    self.backlog.push_back(end);
                    true
                }
                None => false,
            },
            Ok(None) => {
                tracing::warn!("live stream reply not understood");
                self.lost = true;
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "live stream read failed");
                self.blocking = None;
                false
            }
        }
    }
}

impl RemoteFollow {
    /// The stream's end marker when the stream ended at or before `cursor`:
    /// reads after a cursor beyond the end never return it, since its
    /// entry id is lower.
    async fn ended_before(&self, cursor: usize) -> Option<Entry> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(&self.key)
            .arg(id(self.fence, MAX_SEQ))
            .arg(id(self.fence, 0))
            .arg("COUNT")
            .arg(1);
        let reply = self.inner.shared().query::<Value>(&cmd).await.ok()?;
        let last = entry::range(&reply)?.into_iter().next()?;
        let within = last.seq <= u64::try_from(cursor).unwrap_or(u64::MAX);
        (within && last.fence == self.fence && matches!(last.kind, Kind::End { .. }))
            .then_some(last)
    }
}

impl LiveFollower for RemoteFollow {
    fn next<'a>(&'a mut self, cursor: &'a mut usize) -> BoxFuture<'a, Next> {
        Box::pin(async move {
            loop {
                if let Some(next) = self.drain(cursor) {
                    return next;
                }
                let first = !self.caught_up;
                if !self.read(*cursor).await && !first {
                    // Quiet for a whole block, or Redis could not be read.
                    return Next::Unsure;
                }
            }
        })
    }
}
