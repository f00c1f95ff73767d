//! Timeline entries that change no record (replays, conflicts, mismatches),
//! written in the background so that a replay costs one round trip.
//!
//! `record_attempt` hands the entry to a bounded channel and returns; a
//! writer task drains the channel in batches and appends each key's
//! entries with one script call (`RPUSH` of all of them, trim, TTL), the
//! calls of one batch in flight together on the multiplexed connection.
//! The trait allows it: timeline appends are best effort and may be
//! acknowledged before they are durable. Entries are lost if the process
//! dies before the batch is written, if Redis is unreachable when it is, or
//! if the channel is full (an outage that lasts); each loss is logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::conn::Conn;
use crate::scripts::Scripts;

/// Entries waiting in the channel before new ones are dropped.
const CAPACITY: usize = 65_536;
/// Entries taken from the channel per batch.
const BATCH: usize = 1024;

/// One entry to append.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The timeline list key.
    pub(crate) key: String,
    /// The record's key (whose executed attempt a new list adopts).
    pub(crate) rec: String,
    /// The attempt as JSON.
    pub(crate) json: Vec<u8>,
    /// How long the list must live at least, in ms.
    pub(crate) ttl_ms: u64,
}

/// One key's entries of a batch, written with one script call.
struct Group {
    key: String,
    rec: String,
    entries: Vec<Vec<u8>>,
    ttl_ms: u64,
}

/// The sending side; the writer task ends when the last store clone (and
/// with it this sender) is dropped, after writing what is queued.
#[derive(Debug)]
pub(crate) struct TimelineWriter {
    tx: mpsc::Sender<Entry>,
    dropped: AtomicU64,
}

impl TimelineWriter {
    /// Starts the writer task; `None` outside a tokio runtime (the store
    /// then appends synchronously).
    pub(crate) fn start(
        conn: Conn,
        scripts: Arc<Scripts>,
        max: usize,
        timeout: Duration,
    ) -> Option<Self> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::channel(CAPACITY);
        handle.spawn(run(conn, scripts, max, timeout, rx));
        Some(Self {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues `entry`; drops it (and logs every thousandth loss) when the
    /// queue is full.
    pub(crate) fn push(&self, entry: Entry) {
        if self.tx.try_send(entry).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                tracing::warn!(
                    dropped = n + 1,
                    "timeline entries dropped: the background writer is behind"
                );
            }
        }
    }
}

async fn run(
    conn: Conn,
    scripts: Arc<Scripts>,
    max: usize,
    timeout: Duration,
    mut rx: mpsc::Receiver<Entry>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        // One call per key, entries in arrival order.
        let mut groups: Vec<Group> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for e in batch.drain(..) {
            match index.get(&e.key) {
                Some(&i) => {
                    if let Some(g) = groups.get_mut(i) {
                        g.entries.push(e.json);
                        g.ttl_ms = g.ttl_ms.max(e.ttl_ms);
                    }
                }
                None => {
                    index.insert(e.key.clone(), groups.len());
                    groups.push(Group {
                        key: e.key,
                        rec: e.rec,
                        entries: vec![e.json],
                        ttl_ms: e.ttl_ms,
                    });
                }
            }
        }
        let mut calls = tokio::task::JoinSet::new();
        for Group {
            key,
            rec,
            entries,
            ttl_ms: ttl,
        } in groups
        {
            let (mut conn, scripts) = (conn.clone(), Arc::clone(&scripts));
            calls.spawn(async move {
                let mut inv = scripts.record_many.prepare_invoke();
                inv.key(&key).key(&rec).arg(max).arg(ttl.max(1));
                for e in &entries {
                    inv.arg(e.as_slice());
                }
                let n = entries.len();
                match tokio::time::timeout(timeout, conn.invoke::<i64>(&inv)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, entries = n, "timeline entries not written");
                    }
                    Err(_) => {
                        tracing::warn!(entries = n, "timeline entries not written in time");
                    }
                }
            });
        }
        calls.join_all().await;
    }
}
