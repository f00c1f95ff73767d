//! The owner's side: the in-process publisher, plus a writer task that
//! appends the stream to Redis in pipelined batches.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idemgate_engine::backend::ms;
use idemgate_layer::live::{LivePublisher, LiveStream};
use tokio::sync::mpsc;

use crate::entry::{encode_head, id, seal_entry};
use crate::state::Inner;

/// What the owner hands the writer.
#[derive(Debug)]
enum Op {
    Head(Bytes),
    Event(Bytes),
    End { complete: bool },
}

/// Publishes in this process and, once the response is known to be a
/// stream, to Redis. Non-streaming responses cost no Redis command.
#[derive(Debug)]
pub(crate) struct RedisPublisher {
    inner: Arc<Inner>,
    local: Option<Box<dyn LivePublisher>>,
    key: String,
    fence: u64,
    horizon: Duration,
    /// Set when the writer starts (at the response head).
    writer: OnceLock<mpsc::UnboundedSender<Op>>,
    ended: bool,
}

impl RedisPublisher {
    pub(crate) fn new(
        inner: Arc<Inner>,
        local: Box<dyn LivePublisher>,
        key: String,
        stream: &LiveStream,
    ) -> Self {
        Self {
            inner,
            local: Some(local),
            key,
            fence: stream.fence,
            horizon: stream.horizon,
            writer: OnceLock::new(),
            ended: false,
        }
    }

    fn send(&self, op: Op) {
        if let Some(tx) = self.writer.get() {
            // A writer that stopped has logged why; followers fall back.
            let _ = tx.send(op);
        }
    }

    fn end(&mut self, complete: bool) {
        if !self.ended {
            self.ended = true;
            self.send(Op::End { complete });
        }
    }
}

impl LivePublisher for RedisPublisher {
    fn streaming(&self, status: StatusCode, headers: HeaderMap) {
        let head = encode_head(status, headers.clone());
        if let Some(local) = &self.local {
            local.streaming(status, headers);
        }
        let (Some(head), Ok(rt)) = (head, tokio::runtime::Handle::try_current()) else {
            tracing::warn!("live stream head not publishable; other replicas will wait for DONE");
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        if self.writer.set(tx).is_err() {
            return;
        }
        rt.spawn(write(
            Arc::clone(&self.inner),
            self.key.clone(),
            self.fence,
            self.horizon,
            rx,
        ));
        self.send(Op::Head(head));
    }

    fn not_streaming(&self) {
        if let Some(local) = &self.local {
            local.not_streaming();
        }
    }

    fn event(&self, event: Bytes) {
        if let Some(local) = &self.local {
            local.event(event.clone());
        }
        self.send(Op::Event(event));
    }

    fn complete(mut self: Box<Self>) {
        if let Some(local) = self.local.take() {
            local.complete();
        }
        self.end(true);
    }

    fn fail(mut self: Box<Self>) {
        if let Some(local) = self.local.take() {
            local.fail();
        }
        self.end(false);
    }
}

impl Drop for RedisPublisher {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Appends the stream's entries until its end, a batch per round trip.
/// Stops at the first error: a stream with a hole must not look whole, and
/// followers fall back to the stored result when it goes quiet.
async fn write(
    inner: Arc<Inner>,
    key: String,
    fence: u64,
    horizon: Duration,
    mut rx: mpsc::UnboundedReceiver<Op>,
) {
    let opts = &inner.opts;
    let mut conn = inner.shared();
    let mut seq = 0u64;
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let mut pipe = redis::pipe();
        let mut ended = false;
        for op in batch.drain(..) {
            let (field, value, entry_id) = match op {
                Op::Head(head) => match seal_entry(opts, &key, fence, 0, "h", head) {
                    Ok(head) => ("h", head, id(fence, 0)),
                    Err(e) => return not_sealed(&e),
                },
                Op::Event(event) => {
                    seq += 1;
                    match seal_entry(opts, &key, fence, seq, "e", event) {
                        Ok(event) => ("e", event, id(fence, seq)),
                        Err(e) => return not_sealed(&e),
                    }
                }
                Op::End { complete } => {
                    seq += 1;
                    ended = true;
                    let mark = Bytes::from_static(if complete { b"1" } else { b"0" });
                    ("x", mark, id(fence, seq))
                }
            };
            pipe.cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(opts.max_len)
                .arg(entry_id)
                .arg(field)
                .arg(value.as_ref())
                .ignore();
            if ended {
                break;
            }
        }
        let ttl = if ended { opts.end_grace } else { horizon };
        pipe.cmd("PEXPIRE").arg(&key).arg(ms(ttl).max(1)).ignore();
        if let Err(e) = conn.pipe(&pipe).await {
            // An id below the stream's top means another owner took the key
            // over: this owner is fenced out of the stream as well.
            tracing::warn!(error = %e, "live stream not published further");
            return;
        }
        if ended {
            return;
        }
    }
}

/// A writer that could not seal an entry stops: nothing unsealed is ever
/// written, and followers finish from the stored result.
fn not_sealed(e: &idemgate_engine::StoreError) {
    tracing::warn!(error = %e, "live stream not published further");
}
