//! [`SqliteStore`]: the [`Store`] implementation, its options, and the
//! reader pool.
//!
//! The crate's public face: each `Store` call becomes either a read on the
//! pool or a message to the writer thread (`writer`), which is how reads
//! stay off the single write connection and writes share one fsync.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::backend::KeyedNotify;
use idemgate_engine::backend::{monotonic_ms, ms};
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use crate::error::{BACKEND, SqliteError, closed, map_error};
use crate::rows::{ATTEMPT_COLUMNS, RECORD_COLUMNS, int, raw_attempt, raw_record};
use crate::schema;
use crate::writer::{self, Claimed, Commits, Msg, Op, Owner, WriterConfig};

/// How a [`SqliteStore`] is opened. Start from [`SqliteOptions::default`]
/// (or [`SqliteStore::builder`]), adjust, then [`SqliteOptions::open`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    busy_timeout: Duration,
    purge_interval: Duration,
    purge_batch: usize,
    max_batch: usize,
    readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            purge_interval: Duration::from_secs(10),
            purge_batch: 1000,
            max_batch: 512,
            readers: 4,
        }
    }
}

impl SqliteOptions {
    /// How long a write waits for another process holding the file's write
    /// lock before failing with an `Unavailable` error. Default 5 s.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How often expired records and timelines are purged. Default 10 s.
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = interval;
        self
    }

    /// Most rows one purge step deletes per table, so a purge never holds
    /// the write lock for long. Default 1000.
    pub fn purge_batch(mut self, rows: usize) -> Self {
        self.purge_batch = rows.max(1);
        self
    }

    /// Most writes committed in one transaction (one fsync). Default 512.
    pub fn max_batch(mut self, ops: usize) -> Self {
        self.max_batch = ops.max(1);
        self
    }

    /// Number of reader connections (reads run concurrently under WAL).
    /// Default 4.
    pub fn readers(mut self, connections: usize) -> Self {
        self.readers = connections.max(1);
        self
    }

    /// Opens (or creates) the store file at `path`.
    ///
    /// # Errors
    /// [`SqliteError::Open`] when the file cannot be opened or created,
    /// [`SqliteError::NotADatabase`] when it is not a SQLite file,
    /// [`SqliteError::NewerSchema`] when a newer idemgate wrote it,
    /// [`SqliteError::Setup`] when WAL mode or the schema cannot be set up,
    /// [`SqliteError::Thread`] when the writer thread cannot start.
    pub fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, SqliteError> {
        let path = path.as_ref().to_owned();
        let mut conn = schema::connect(&path, self.busy_timeout)?;
        schema::prepare_writer(&mut conn, &path, self.busy_timeout)?;
        // Past every fence issued before a power loss (see `writer`).
        writer::skip_to_ceiling(&mut conn).map_err(|e| SqliteError::Setup {
            path: path.clone(),
            source: map_error(e),
        })?;
        let readers = (0..self.readers)
            .map(|_| schema::connect_reader(&path, self.busy_timeout).map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        let notify = Arc::new(KeyedNotify::new());
        let (tx, rx) = mpsc::channel();
        let config = WriterConfig {
            max_batch: self.max_batch,
            purge_interval: self.purge_interval,
            purge_batch: self.purge_batch,
        };
        let thread_notify = Arc::clone(&notify);
        let commits = Arc::new(Commits::default());
        let thread_commits = Arc::clone(&commits);
        let writer = std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || writer::run(conn, rx, thread_notify, config, thread_commits))
            .map_err(SqliteError::Thread)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                options: self,
                tx,
                writer: Mutex::new(Some(writer)),
                closed: AtomicBool::new(false),
                readers,
                next_reader: AtomicUsize::new(0),
                reader_first: ReaderFirst::default(),
                notify,
                commits,
            }),
        })
    }
}

/// The embedded SQLite store. Cheap to clone: clones share one writer
/// thread and one reader pool. The writer stops when the last clone is
/// dropped (after finishing what was queued) or on [`SqliteStore::close`].
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    options: SqliteOptions,
    /// Queue of the writer thread.
    tx: Sender<Msg>,
    /// Taken by the first `close` (or drop) to join the thread.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Set by `close`: every later operation fails with `Closed`.
    closed: AtomicBool,
    /// Reader connections, each used by one caller at a time; never held
    /// across an `.await`.
    readers: Vec<Mutex<Connection>>,
    /// Round-robin start for picking a reader.
    next_reader: AtomicUsize,
    /// Whether claims ask a reader before the writer.
    reader_first: ReaderFirst,
    /// Waiters of `changed`, woken by the writer after a commit.
    notify: Arc<KeyedNotify>,
    /// The writer's commits, synced or not.
    commits: Arc<Commits>,
}

/// Whether a claim asks a reader first. A reader answers the claim of a
/// key that is already live (a retry) without the writer, but for a new
/// key the read is wasted: a read transaction, and pages to read again
/// after each commit, about a tenth of a first execution's CPU. So claims
/// skip the reader once it has missed [`ReaderFirst::MISSES`] times in a
/// row, and go to the writer, which decides inside its transaction either
/// way; every [`ReaderFirst::PROBE_EVERY`]th claim still asks the reader,
/// and a claim the writer answers with an existing record (a retry) turns
/// the reader back on. This only moves work; every answer is the same.
#[derive(Debug, Default)]
struct ReaderFirst {
    misses: AtomicU32,
    claims: AtomicU32,
}

impl ReaderFirst {
    const MISSES: u32 = 8;
    const PROBE_EVERY: u32 = 16;

    fn ask_reader(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < Self::MISSES
            || self
                .claims
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(Self::PROBE_EVERY)
    }

    /// The reader found the key live (`true`) or not.
    fn read(&self, found: bool) {
        if found {
            self.misses.store(0, Ordering::Relaxed);
        } else {
            let _ = self
                .misses
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    Some(m.saturating_add(1))
                });
        }
    }
}

/// How many transactions the writer of one [`SqliteStore`] committed, by
/// whether the commit was fsynced (`synchronous=FULL`: a batch with a
/// result or a forget, or one that raised the fence ceiling) or only
/// written to the WAL (`synchronous=NORMAL`: claims, renewals, releases and
/// timeline entries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Commits on disk before they were acknowledged.
    pub synced: u64,
    /// Commits in the WAL, on disk by the next synced commit or checkpoint.
    pub unsynced: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("options", &self.inner.options)
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` with default options.
    ///
    /// # Errors
    /// As [`SqliteOptions::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SqliteError> {
        SqliteOptions::default().open(path)
    }

    /// Options to open a store with.
    pub fn builder() -> SqliteOptions {
        SqliteOptions::default()
    }

    /// The file this store uses.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The writer's commits so far, synced or not.
    pub fn commit_counts(&self) -> CommitCounts {
        CommitCounts {
            synced: self.inner.commits.synced.load(Ordering::Relaxed),
            unsynced: self.inner.commits.unsynced.load(Ordering::Relaxed),
        }
    }

    /// Stops the writer: writes queued before this call are committed, later
    /// operations fail with a `Closed` error. Blocks until the writer thread
    /// has finished its current batch. Idempotent.
    pub fn close(&self) {
        self.inner.stop();
    }

    /// Deletes every expired record and timeline now, in bounded steps;
    /// returns how many records and timelines went. The store also does
    /// this in the background every purge interval.
    ///
    /// # Errors
    /// A store error from the writer.
    pub async fn purge_expired(&self) -> Result<usize, StoreError> {
        let limit = self.inner.options.purge_batch;
        let mut total = 0;
        loop {
            let (records, timelines) = self.inner.write(|reply| Op::Purge { limit, reply }).await?;
            total += records + timelines;
            if records < limit && timelines < limit {
                return Ok(total);
            }
        }
    }
}

impl Inner {
    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        Ok(())
    }

    /// Sends an op to the writer and waits for its committed result.
    async fn write<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Op,
    ) -> Result<T, StoreError> {
        self.check_open()?;
        let (reply, answer) = oneshot::channel();
        self.tx.send(Msg::Op(op(reply))).map_err(|_| closed())?;
        // The writer drops the reply only when it exits without answering.
        answer.await.map_err(|_| closed())?
    }

    /// Runs `f` on a free reader connection (waiting for one only if all
    /// are busy). Reads are short indexed lookups on a local file, cheaper
    /// than a hop to a blocking thread, so they run on the caller's thread.
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check_open()?;
        let n = self.readers.len();
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            if let Ok(conn) = self.readers[(start + i) % n].try_lock() {
                return f(&conn);
            }
        }
        // A panic inside a read leaves the connection usable: it holds no
        // transaction between statements.
        let conn = self.readers[start]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&conn)
    }

    fn live_record(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let now = int(monotonic_ms());
        self.read(|conn| {
            let raw = conn
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS} FROM records WHERE id = ?1 AND expires_at > ?2"
                ))
                .and_then(|mut stmt| stmt.query_row(params![id, now], raw_record).optional())
                .map_err(map_error)?;
            raw.map(|r| r.decode()).transpose()
        })
    }

    fn stop(&self) {
        self.closed.store(true, Ordering::Release);
        let handle = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            // Fails only if the writer already exited; either way it stops.
            let _ = self.tx.send(Msg::Stop);
            if handle.join().is_err() {
                tracing::error!("the SQLite writer thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

fn owner(lease: &Lease) -> Owner {
    Owner {
        id: lease.key.storage_id(),
        token: lease.token,
        fence: lease.fence,
    }
}

fn fenced(applied: bool) -> Fenced {
    if applied {
        Fenced::Applied
    } else {
        Fenced::Stale
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let id = key.storage_id();
            // Fast path: a live record seen by a reader is a valid answer (the
            // claim linearizes at the read). Only absent or expired keys go to
            // the writer, which decides again inside its transaction.
            let reader_first = &self.inner.reader_first;
            if reader_first.ask_reader() {
                let live = self.inner.live_record(&id)?;
                reader_first.read(live.is_some());
                if let Some(record) = live {
                    return Ok(Claim::Existing(record));
                }
            }
            let token = Lease::new_token();
            let claimed = self
                .inner
                .write(|reply| Op::Claim {
                    id,
                    fingerprint: *fingerprint.as_bytes(),
                    token,
                    ttl_ms: ms(pending_ttl),
                    reply,
                })
                .await?;
            Ok(match claimed {
                Claimed::Acquired {
                    fence,
                    expires_at_ms,
                } => Claim::Acquired(Lease {
                    key: key.clone(),
                    token,
                    fence,
                    expires_at_ms,
                    fingerprint: *fingerprint,
                }),
                Claimed::Existing(record) => {
                    // A retry the reader would have answered.
                    reader_first.read(true);
                    Claim::Existing(record)
                }
            })
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let owner = owner(lease);
            let renewed = self
                .inner
                .write(|reply| Op::Renew {
                    owner,
                    ttl_ms: ms(pending_ttl),
                    reply,
                })
                .await?;
            Ok(match renewed {
                Some(expires) => {
                    lease.expires_at_ms = expires;
                    Fenced::Applied
                }
                None => Fenced::Stale,
            })
        })
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let owner = owner(lease);
            let applied = self
                .inner
                .write(|reply| Op::Complete {
                    owner,
                    payload,
                    ttl_ms: ms(done_ttl),
                    attempt: attempt.clone(),
                    reply,
                })
                .await?;
            Ok(fenced(applied))
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let owner = owner(lease);
            let applied = self
                .inner
                .write(|reply| Op::Release {
                    owner,
                    attempt: attempt.clone(),
                    ttl_ms: ms(timeline_ttl),
                    reply,
                })
                .await?;
            Ok(fenced(applied))
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let id = key.storage_id();
            self.inner
                .write(|reply| Op::Forget {
                    id,
                    attempt: attempt.clone(),
                    ttl_ms: ms(timeline_ttl),
                    reply,
                })
                .await
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move { self.inner.live_record(&key.storage_id()) })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.inner.check_open()?;
            let op = Op::Attempt {
                id: key.storage_id(),
                attempt: attempt.clone(),
                ttl_ms: ms(ttl),
            };
            self.inner.tx.send(Msg::Op(op)).map_err(|_| closed())
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let id = key.storage_id();
            let now = int(monotonic_ms());
            self.inner.read(|conn| {
                let raws = conn
                    .prepare_cached(&format!(
                        "SELECT {ATTEMPT_COLUMNS} FROM attempts
                     WHERE id = ?1
                       AND EXISTS (SELECT 1 FROM timelines WHERE id = ?1 AND keep_until > ?2)
                     ORDER BY at_ms, seq"
                    ))
                    .and_then(|mut stmt| {
                        stmt.query_map(params![id, now], raw_attempt)?
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .map_err(map_error)?;
                raws.into_iter().map(|r| r.decode()).collect()
            })
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // Commits by this process wake waiters at once; changes made by other
            // processes are seen by the caller's next read, at most 50 ms later.
            self.inner
                .notify
                .wait(&key.storage_id(), max.min(Duration::from_millis(50)))
                .await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ReaderFirst;

    #[test]
    fn claims_skip_a_missing_reader_probe_it_and_come_back_on_a_retry() {
        let r = ReaderFirst::default();
        for _ in 0..ReaderFirst::MISSES {
            assert!(r.ask_reader(), "asked while it has been answering");
            r.read(false);
        }
        let asked = (0..64).filter(|_| r.ask_reader()).count();
        assert_eq!(asked, 64 / ReaderFirst::PROBE_EVERY as usize, "only probes");
        // A retry (found live, by a probe or by the writer) turns it back on.
        r.read(true);
        assert!((0..10).all(|_| r.ask_reader()));
    }
}
