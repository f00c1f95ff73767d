//! Timeline entries that change no record (replays, conflicts, mismatches),
//! written in the background so that a replay costs one round trip.
//!
//! `record_attempt` hands the entry to a bounded channel and returns; a
//! writer task drains the channel and appends each batch — any number of
//! keys — with one statement (`INSERT … SELECT FROM unnest(…)`, trimming
//! each key's timeline in the same statement). The `Store` trait allows
//! it: timeline appends are best effort and may be acknowledged before they
//! are durable. Entries are lost if the process dies before their batch is
//! written, if the database cannot be reached when it is, or if the channel
//! is full (an outage that lasts); each loss is logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::mpsc;

/// Entries waiting in the channel before new ones are dropped.
const CAPACITY: usize = 65_536;
/// Entries written per statement.
const BATCH: usize = 1024;

/// One entry to append.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The record's storage id.
    pub(crate) id: String,
    /// The attempt as JSON.
    pub(crate) json: String,
    /// How long it is kept, in ms.
    pub(crate) keep_ms: i64,
}

/// The sending side; the writer task ends when the store (and with it this
/// sender) is dropped, after writing what is queued.
#[derive(Debug)]
pub(crate) struct TimelineWriter {
    tx: mpsc::Sender<Entry>,
    dropped: AtomicU64,
}

impl TimelineWriter {
    /// Starts the writer task; `None` outside a tokio runtime (the store
    /// then appends synchronously).
    pub(crate) fn start(pool: PgPool, statement: Arc<str>, timeout: Duration) -> Option<Self> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::channel(CAPACITY);
        handle.spawn(run(pool, statement, timeout, rx));
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

async fn run(pool: PgPool, statement: Arc<str>, timeout: Duration, mut rx: mpsc::Receiver<Entry>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let n = batch.len();
        let mut ids = Vec::with_capacity(n);
        let mut entries = Vec::with_capacity(n);
        let mut keep = Vec::with_capacity(n);
        for e in batch.drain(..) {
            ids.push(e.id);
            entries.push(e.json);
            keep.push(e.keep_ms);
        }
        let write = sqlx::query(AssertSqlSafe(Arc::clone(&statement)))
            .bind(ids)
            .bind(entries)
            .bind(keep)
            .execute(&pool);
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, entries = n, "timeline entries not written"),
            Err(_) => tracing::warn!(entries = n, "timeline entries not written in time"),
        }
    }
}
