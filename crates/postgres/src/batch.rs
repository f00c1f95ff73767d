//! Claims, completions and lease renewals of concurrent requests carried
//! by one statement each: a batch is one round trip and one commit for
//! every key in it.
//!
//! Why: a fresh key is two tiny statements, and the server's cost of a
//! statement is mostly fixed — the protocol messages, the executor start,
//! the commit and the wake-ups around its WAL flush — not the row it
//! writes. Under load, many requests wait for a claim or a completion at
//! the same moment; one statement for all of them (`INSERT … SELECT FROM
//! unnest(…)`, `UPDATE … WHERE id = ANY(…)`) costs the server half the
//! CPU per key or less (BENCHMARKS.md, "PostgreSQL: many keys in one
//! statement").
//!
//! How: each kind (claims and completions together, renewals) has a
//! queue and a few workers
//! ([`PostgresOptions::batch_statements`](crate::PostgresOptions::batch_statements)).
//! A worker takes the first waiting job and every other job waiting at
//! that moment (up to [`MAX_JOBS`]), and runs them as one statement. Jobs
//! are never held back to fill a batch: a request that finds a worker free
//! goes at once, in a batch of one. Batches grow only while every worker
//! is busy, which is exactly when requests would otherwise queue for the
//! server.
//!
//! What a batch must not change:
//! - **Durability**: each job is answered after its batch committed.
//! - **One winner per key**: a batch holds each key at most once (a second
//!   job for the same key waits for the next batch: a takeover claim and
//!   the old owner's completion never update one row in one statement,
//!   where one of the two updates would be dropped), claims insert in key
//!   order so two batches never wait on each other in a cycle, and the
//!   primary key still decides between concurrent claimers. A job held
//!   back for a key the batch only read (a claim that found it taken)
//!   gets that answer ([`Kind::share`]): its own statement, sent while it
//!   waited, would have read the same.
//! - **No job waits on another key's lock**: a batch statement gives up
//!   waiting for a row lock after [`crate::sql::BATCH_LOCK_TIMEOUT_MS`]
//!   (a claim reviving a key whose late owner's transaction still holds
//!   it, say). Its jobs then run one single-key statement each, on
//!   connections of their own and off the worker, as without batching; so
//!   do the jobs of any batch the server answers with an error. Only the
//!   job that needs the lock waits for it, and the queue moves on.
//! - **Bounded waits**: a caller waits at most the operation bound for its
//!   answer, queueing included; a job whose caller stopped waiting before
//!   its batch was sent is not run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use idemgate_engine::{StoreError, StoreErrorKind};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::error::BACKEND;

/// Most jobs in one statement.
pub(crate) const MAX_JOBS: usize = 64;
/// Most bytes of payload (a completion's stored answer) in one statement,
/// unless its first job alone is larger.
pub(crate) const MAX_BYTES: usize = 4 << 20;

/// One kind of job the store batches, and how it runs alone or together.
pub(crate) trait Kind: Send + Sync + 'static {
    /// What the jobs run against (the store's shared state); the workers
    /// hold it weakly, and end once it is gone.
    type Owner: Send + Sync + 'static;
    /// What the caller hands in.
    type Job: Send + Sync + 'static;
    /// What the caller gets back.
    type Out: Send + 'static;
    /// The operation's name in errors and metrics.
    const WHAT: &'static str;

    /// The key the job writes: a batch holds each key at most once.
    fn id(job: &Self::Job) -> &str;

    /// The job's share of [`MAX_BYTES`].
    fn bytes(_job: &Self::Job) -> usize {
        0
    }

    /// The operation `job` is, in errors (default [`Kind::WHAT`]).
    fn what(_job: &Self::Job) -> &'static str {
        Self::WHAT
    }

    /// A copy of `out` for `to`, another job of the same key that was
    /// waiting when the batch was sent, if `to` may have it: an answer
    /// that only read the key (a claim that found it taken) is what
    /// another claim's own statement would have read at the same moment.
    fn share(_out: &Self::Out, _to: &Self::Job) -> Option<Self::Out> {
        None
    }

    /// Runs one job as the store's single-key statement, within the
    /// operation bound (a batch the server refused runs its jobs so).
    fn run_one(
        owner: &Arc<Self::Owner>,
        job: &Self::Job,
    ) -> impl Future<Output = Result<Self::Out, StoreError>> + Send;

    /// Runs jobs (distinct keys) as one statement that waits at most
    /// [`crate::sql::BATCH_LOCK_TIMEOUT_MS`] for a row lock, within the
    /// operation bound: the answers in the jobs' order, or the server's
    /// own error (inner `Err`), or the connection's failure (outer).
    fn run_many(
        owner: &Arc<Self::Owner>,
        jobs: &[&Self::Job],
    ) -> impl Future<Output = Result<Result<Vec<Self::Out>, sqlx::Error>, StoreError>> + Send;
}

type Reply<K> = oneshot::Sender<Result<<K as Kind>::Out, StoreError>>;

struct Waiting<K: Kind> {
    job: K::Job,
    reply: Reply<K>,
}

/// The queue of one kind of job; its workers end when it is dropped.
pub(crate) struct Batcher<K: Kind> {
    tx: mpsc::UnboundedSender<Waiting<K>>,
    bound: Duration,
    counts: Arc<Counts>,
}

/// What the workers have done so far (for tests).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Batch statements sent.
    pub(crate) statements: AtomicU64,
    /// Jobs that shared their statement with another job.
    pub(crate) shared: AtomicU64,
}

impl<K: Kind> std::fmt::Debug for Batcher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("kind", &K::WHAT)
            .finish_non_exhaustive()
    }
}

/// The queue's receiving end, before its workers start (they need the
/// store, which holds the queue).
pub(crate) struct Unstarted<K: Kind> {
    rx: mpsc::UnboundedReceiver<Waiting<K>>,
    counts: Arc<Counts>,
}

impl<K: Kind> Batcher<K> {
    /// A queue whose callers wait at most `bound` for their answer.
    pub(crate) fn new(bound: Duration) -> (Self, Unstarted<K>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        (
            Self {
                tx,
                bound,
                counts: Arc::clone(&counts),
            },
            Unstarted { rx, counts },
        )
    }

    /// [`Batcher::new`] when `on`, else neither half.
    pub(crate) fn unless_off(on: bool, bound: Duration) -> (Option<Self>, Option<Unstarted<K>>) {
        if on {
            let (batcher, unstarted) = Self::new(bound);
            (Some(batcher), Some(unstarted))
        } else {
            (None, None)
        }
    }

    /// What the workers have done so far.
    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Runs `job` in the next batch and waits for its answer.
    pub(crate) async fn run(&self, job: K::Job) -> Result<K::Out, StoreError> {
        let what = K::what(&job);
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Waiting { job, reply })
            .map_err(|_| gone::<K>())?;
        match tokio::time::timeout(self.bound, answer).await {
            Ok(Ok(out)) => out,
            Ok(Err(_)) => Err(gone::<K>()),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!("{what} did not finish in time"),
            )),
        }
    }
}

impl<K: Kind> Unstarted<K> {
    /// Starts `workers` workers on the current runtime; they hold the store
    /// weakly and end once it is dropped and its queue is drained.
    pub(crate) fn start(self, store: Weak<K::Owner>, workers: usize) {
        let rx = Arc::new(Mutex::new(self.rx));
        for _ in 0..workers.max(1) {
            tokio::spawn(work::<K>(
                Weak::clone(&store),
                Arc::clone(&rx),
                Arc::clone(&self.counts),
            ));
        }
    }
}

fn gone<K: Kind>() -> StoreError {
    StoreError::new(
        StoreErrorKind::Closed,
        BACKEND,
        format!("the store's {} workers have stopped", K::WHAT),
    )
}

async fn work<K: Kind>(
    store: Weak<K::Owner>,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Waiting<K>>>>,
    counts: Arc<Counts>,
) {
    // Jobs that met an earlier job of their key in the batch being formed.
    let mut later = VecDeque::new();
    loop {
        let Some(batch) = next_batch(&rx, &mut later).await else {
            return;
        };
        let Some(owner) = store.upgrade() else {
            return;
        };
        counts.statements.fetch_add(1, Ordering::Relaxed);
        if batch.len() > 1 {
            counts
                .shared
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        let read = run_batch::<K>(&owner, batch).await;
        if !read.is_empty() && !later.is_empty() {
            // Jobs held back for a key the batch only read get that answer
            // now rather than a statement each (a retry storm on a key in
            // flight is answered in one round trip, not one per retry).
            let mut rest = VecDeque::with_capacity(later.len());
            for w in later.drain(..) {
                match read
                    .get(K::id(&w.job))
                    .and_then(|out| K::share(out, &w.job))
                {
                    Some(out) => {
                        let _ = w.reply.send(Ok(out));
                    }
                    None => rest.push_back(w),
                }
            }
            later = rest;
        }
    }
}

/// A batch being formed: one job per key, within the limits.
struct Forming<K: Kind> {
    jobs: Vec<Waiting<K>>,
    ids: HashSet<String>,
    bytes: usize,
}

impl<K: Kind> Forming<K> {
    fn full(&self) -> bool {
        self.jobs.len() >= MAX_JOBS || self.bytes >= MAX_BYTES
    }

    /// Adds `w`, or holds it in `later` when its key is already in; drops
    /// it when its caller stopped waiting.
    fn add(&mut self, w: Waiting<K>, later: &mut VecDeque<Waiting<K>>) {
        if w.reply.is_closed() {
            return;
        }
        if self.ids.contains(K::id(&w.job)) {
            later.push_back(w);
            return;
        }
        self.ids.insert(K::id(&w.job).to_owned());
        self.bytes += K::bytes(&w.job);
        self.jobs.push(w);
    }

    /// Adds every job waiting in `rx` now, until full.
    fn add_waiting(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Waiting<K>>,
        later: &mut VecDeque<Waiting<K>>,
    ) {
        while !self.full() {
            match rx.try_recv() {
                Ok(w) => self.add(w, later),
                Err(_) => break,
            }
        }
    }
}

/// The next batch: the jobs held back from the last one first, else the
/// next job to arrive, then every job waiting now, within the limits and
/// one per key. `None` once the queue is closed and empty.
async fn next_batch<K: Kind>(
    rx: &Mutex<mpsc::UnboundedReceiver<Waiting<K>>>,
    later: &mut VecDeque<Waiting<K>>,
) -> Option<Vec<Waiting<K>>> {
    let mut forming = Forming {
        jobs: Vec::new(),
        ids: HashSet::new(),
        bytes: 0,
    };
    for w in std::mem::take(later) {
        if forming.full() {
            later.push_back(w);
        } else {
            forming.add(w, later);
        }
    }
    if !forming.jobs.is_empty() {
        // Another worker may be waiting on the queue for jobs that are not
        // coming: the held jobs go now, with whatever is waiting if the
        // queue is free.
        if let Ok(mut rx) = rx.try_lock() {
            forming.add_waiting(&mut rx, later);
        }
        return Some(forming.jobs);
    }
    let mut rx = rx.lock().await;
    while forming.jobs.is_empty() {
        let w = rx.recv().await?;
        forming.add(w, later);
    }
    forming.add_waiting(&mut rx, later);
    Some(forming.jobs)
}

/// Runs a batch and answers every job in it; returns the answers that
/// other jobs of their keys may share ([`Kind::share`]).
async fn run_batch<K: Kind>(
    owner: &Arc<K::Owner>,
    batch: Vec<Waiting<K>>,
) -> HashMap<String, K::Out> {
    let mut read = HashMap::new();
    let jobs: Vec<&K::Job> = batch.iter().map(|w| &w.job).collect();
    let together = K::run_many(owner, &jobs).await;
    drop(jobs);
    match together {
        Ok(Ok(outs)) if outs.len() == batch.len() => {
            for (w, out) in batch.into_iter().zip(outs) {
                // A copy for a job like this one, kept for jobs of its key
                // that were held back.
                if let Some(copy) = K::share(&out, &w.job) {
                    read.insert(K::id(&w.job).to_owned(), copy);
                }
                let _ = w.reply.send(Ok(out));
            }
        }
        // The server refused the batch: a lock it would not wait for, a
        // deadlock, a value one job got wrong. Each job then runs alone,
        // off this worker, as it would without batching, so only the job
        // with the problem meets it and the queue moves on.
        Ok(_) => {
            for w in batch {
                if w.reply.is_closed() {
                    continue;
                }
                let owner = Arc::clone(owner);
                tokio::spawn(async move {
                    let out = K::run_one(&owner, &w.job).await;
                    let _ = w.reply.send(out);
                });
            }
        }
        // No connection, or it failed: every job would meet the same.
        Err(e) => {
            let copy = || StoreError::new(e.kind(), BACKEND, e.to_string());
            let mut batch = batch.into_iter();
            let first = batch.next();
            for w in batch {
                let _ = w.reply.send(Err(copy()));
            }
            if let Some(w) = first {
                let _ = w.reply.send(Err(e));
            }
        }
    }
    read
}
