//! The writer thread: one connection, group commit.
//!
//! Every write (claim, renew, complete, release, timeline entry) is a
//! message to this thread. It takes whatever is queued (up to the batch
//! limit), applies it in order inside one `BEGIN IMMEDIATE … COMMIT`, and
//! only then answers the callers: one fsync covers the whole batch, and no
//! caller hears "done" before its write is as durable as it must be.
//! Applying in queue order inside one transaction is a valid serial order,
//! so each operation stays atomic. `BEGIN IMMEDIATE` plus the busy timeout
//! serializes this thread with the writers of other processes sharing the
//! file.
//!
//! **Which commits are synced.** Each batch is committed in two parts.
//! Claims, renewals, releases and timeline entries come first, committed
//! with `synchronous=NORMAL`: written to the WAL (so they survive the
//! process being killed) but not fsynced, and answered at once. Results
//! (`complete`) and an operator's `forget` follow in a commit with
//! `synchronous=FULL`: on disk before they are answered. Every op of one
//! batch was sent before any was answered, so committing the parts in
//! this order is a valid serial order, and a claim never waits for the
//! fsync of the results queued beside it. The
//! WAL is a log: a later synced commit makes every earlier one durable, so
//! a DONE on disk always has its claim on disk too. What a power loss can
//! take is a claim (or renewal, or release) of work whose owner died with
//! the machine: every process using the file runs on that machine (WAL
//! needs shared memory). Had the claim survived, its lease would expire
//! after `pending_ttl` with nobody renewing it, and the retry would run the
//! work, as it does when the claim is gone; a lost release or renewal
//! likewise only changes when the key frees itself. The one thing a lost
//! claim could repeat is its fence: the counter's ceiling
//! ([`apply::FenceCounter`]) is kept durable ahead of the fences issued.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::backend::KeyedNotify;
use idemgate_engine::backend::monotonic_ms;
use idemgate_engine::{Attempt, Record, StoreError};
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use crate::error::{BACKEND, closed, corrupt, map_error};

/// Where a caller waits for its answer.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// What the writer did with a claim that reached it.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The key was absent or expired: it is now PENDING under this fence.
    Acquired {
        /// The new fence.
        fence: u64,
        /// The lease expiry written.
        expires_at_ms: u64,
    },
    /// The key is held or done.
    Existing(Record),
}

/// Identifies a lease in a fenced write.
#[derive(Debug)]
pub(crate) struct Owner {
    pub(crate) id: String,
    pub(crate) token: u128,
    pub(crate) fence: u64,
}

/// One write, with the channel its answer goes to.
#[derive(Debug)]
pub(crate) enum Op {
    Claim {
        id: String,
        fingerprint: [u8; 32],
        token: u128,
        ttl_ms: u64,
        reply: Reply<Claimed>,
    },
    /// Answers with the new lease expiry, or `None` when stale.
    Renew {
        owner: Owner,
        ttl_ms: u64,
        reply: Reply<Option<u64>>,
    },
    /// Answers whether the write applied.
    Complete {
        owner: Owner,
        payload: Bytes,
        ttl_ms: u64,
        attempt: Attempt,
        reply: Reply<bool>,
    },
    /// Answers whether the write applied.
    Release {
        owner: Owner,
        attempt: Attempt,
        ttl_ms: u64,
        reply: Reply<bool>,
    },
    /// Deletes the record whatever its state; answers whether there was
    /// one.
    Forget {
        id: String,
        attempt: Attempt,
        ttl_ms: u64,
        reply: Reply<bool>,
    },
    /// Best effort: nobody waits for it.
    Attempt {
        id: String,
        attempt: Attempt,
        ttl_ms: u64,
    },
    /// One bounded purge step; answers with the records and timelines
    /// removed.
    Purge {
        limit: usize,
        reply: Reply<(usize, usize)>,
    },
}

/// A message to the writer.
#[derive(Debug)]
pub(crate) enum Msg {
    Op(Op),
    /// Finish what was queued before this message, refuse the rest, exit.
    Stop,
}

/// What applying one op produced, held until the commit succeeds.
#[derive(Debug)]
enum Outcome {
    Claimed(Claimed),
    Renewed(Option<u64>),
    Applied(bool),
    Recorded,
    Purged((usize, usize)),
}

impl Op {
    /// Whether the op must be on disk before it is acknowledged: a result
    /// (the promise every retry relies on) and an operator's forget. The
    /// rest may be lost with the machine (see the module documentation).
    fn needs_sync(&self) -> bool {
        matches!(self, Op::Complete { .. } | Op::Forget { .. })
    }

    /// The storage id whose waiters must wake if this op applied.
    fn wakes(&self, outcome: &Outcome) -> Option<&str> {
        match (self, outcome) {
            (Op::Complete { owner, .. } | Op::Release { owner, .. }, Outcome::Applied(true)) => {
                Some(&owner.id)
            }
            (Op::Forget { id, .. }, Outcome::Applied(true)) => Some(id),
            _ => None,
        }
    }

    /// Sends the result of a committed op to its caller.
    fn answer(self, outcome: Outcome) {
        // A send fails only when the caller stopped waiting (its future was
        // dropped): the write stands, nobody is left to tell.
        match (self, outcome) {
            (Op::Claim { reply, .. }, Outcome::Claimed(c)) => {
                let _ = reply.send(Ok(c));
            }
            (Op::Renew { reply, .. }, Outcome::Renewed(r)) => {
                let _ = reply.send(Ok(r));
            }
            (
                Op::Complete { reply, .. } | Op::Release { reply, .. } | Op::Forget { reply, .. },
                Outcome::Applied(a),
            ) => {
                let _ = reply.send(Ok(a));
            }
            (Op::Purge { reply, .. }, Outcome::Purged(n)) => {
                let _ = reply.send(Ok(n));
            }
            (Op::Attempt { .. }, Outcome::Recorded) => {}
            (op, outcome) => op.fail(corrupt(format!(
                "internal: outcome {outcome:?} does not match the operation"
            ))),
        }
    }

    /// Sends an error to the op's caller.
    pub(crate) fn fail(self, e: StoreError) {
        match self {
            Op::Claim { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Op::Renew { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Op::Complete { reply, .. } | Op::Release { reply, .. } | Op::Forget { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Op::Purge { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Op::Attempt { attempt, .. } => {
                tracing::warn!(error = %e, outcome = attempt.outcome.as_str(), "timeline entry not recorded");
            }
        }
    }
}

/// Writer settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterConfig {
    pub(crate) max_batch: usize,
    pub(crate) purge_interval: Duration,
    pub(crate) purge_batch: usize,
}

/// Commits made by the writer, by whether they were fsynced.
#[derive(Debug, Default)]
pub(crate) struct Commits {
    pub(crate) synced: AtomicU64,
    pub(crate) unsynced: AtomicU64,
}

/// The writer connection's `synchronous` setting, changed between
/// transactions only when a batch needs the other one.
#[derive(Debug)]
struct Durability {
    /// The setting the connection has now (FULL after `prepare_writer`).
    synced: bool,
    /// Fences the last batch left below the durable ceiling: claims beyond
    /// that need a synced commit.
    headroom: i64,
    commits: Arc<Commits>,
}

impl Durability {
    /// Whether `batch` is committed with an fsync.
    fn wanted(&self, batch: &[Op]) -> bool {
        let claims = batch
            .iter()
            .filter(|op| matches!(op, Op::Claim { .. }))
            .count();
        batch.iter().any(Op::needs_sync)
            || i64::try_from(claims).unwrap_or(i64::MAX) > self.headroom
    }

    fn set(&mut self, conn: &Connection, synced: bool) -> rusqlite::Result<()> {
        if self.synced != synced {
            conn.pragma_update(None, "synchronous", if synced { "FULL" } else { "NORMAL" })?;
            self.synced = synced;
        }
        Ok(())
    }

    fn committed(&self) {
        let n = if self.synced {
            &self.commits.synced
        } else {
            &self.commits.unsynced
        };
        n.fetch_add(1, Ordering::Relaxed);
    }
}

/// The writer loop. Returns when told to stop or when every sender is gone.
pub(crate) fn run(
    mut conn: Connection,
    rx: Receiver<Msg>,
    notify: Arc<KeyedNotify>,
    config: WriterConfig,
    commits: Arc<Commits>,
) {
    let mut durability = Durability {
        synced: true,
        headroom: 0,
        commits,
    };
    let max_batch = config.max_batch.max(1);
    let mut batch: Vec<Op> = Vec::with_capacity(max_batch);
    let mut next_purge = Instant::now() + config.purge_interval;
    let mut stopping = false;
    let mut gather = Gather::default();
    while !stopping {
        let wait = next_purge.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Msg::Op(op)) => batch.push(op),
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stopping = true,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let gather_until = Instant::now() + gather.window;
        while !stopping && batch.len() < max_batch {
            match rx.try_recv() {
                Ok(Msg::Op(op)) => batch.push(op),
                Ok(Msg::Stop) => stopping = true,
                Err(_) => {
                    let left = gather_until.saturating_duration_since(Instant::now());
                    if batch.is_empty() || gather.satisfied(&batch) || left.is_zero() {
                        break;
                    }
                    match rx.recv_timeout(left) {
                        Ok(Msg::Op(op)) => batch.push(op),
                        Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stopping = true,
                        Err(RecvTimeoutError::Timeout) => break,
                    }
                }
            }
        }
        if !batch.is_empty() {
            let waiters = waiters(&batch);
            // The writes that need no fsync are committed and answered
            // first, so a claim never waits for the fsync of the results
            // queued beside it; the results and forgets follow, fsynced.
            // Every op of one batch was sent before any was answered, so
            // any order among them is a valid serial order.
            let (mut synced, mut relaxed): (Vec<Op>, Vec<Op>) =
                batch.drain(..).partition(Op::needs_sync);
            let mut commit_time = Duration::ZERO;
            for part in [&mut relaxed, &mut synced] {
                if !part.is_empty() {
                    commit_time = commit_batch(&mut conn, part, &notify, &mut durability);
                }
            }
            gather.learn(waiters, commit_time);
        }
        if !stopping && Instant::now() >= next_purge {
            // Deleting what expired need not be synced: a lost purge is
            // done again by the next one.
            let full = match durability
                .set(&conn, false)
                .and_then(|()| purge_step(&mut conn, config.purge_batch))
            {
                Ok((records, timelines)) => records.max(timelines) >= config.purge_batch,
                Err(e) => {
                    tracing::warn!(error = %e, "purge of expired rows failed");
                    false
                }
            };
            // A full step means more is waiting: come back soon, but let
            // queued writes go first.
            let again = if full {
                Duration::from_millis(10)
            } else {
                config.purge_interval
            };
            next_purge = Instant::now() + again;
        }
    }
    // Anything still queued arrived after the stop: refuse it.
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Op(op) = msg {
            op.fail(closed());
        }
    }
}

/// How long to wait for more writes before committing a batch.
///
/// Callers answered by one commit usually send their next write right away
/// (a complete follows a claim). Committing the first of them alone would
/// spend a whole fsync on it and split the rest over later ones, so the
/// writer waits until as many callers as the last batch answered are
/// queued again, but never longer than half a commit: waiting is worth it
/// only while it costs less than the fsync it saves. A lone caller (last
/// batch of one) never waits.
#[derive(Debug, Default)]
struct Gather {
    /// Callers answered by the last batch.
    expected: usize,
    /// Longest wait for them.
    window: Duration,
}

impl Gather {
    /// Upper bound of the wait, whatever the disk.
    const MAX_WINDOW: Duration = Duration::from_millis(1);

    fn satisfied(&self, batch: &[Op]) -> bool {
        waiters(batch) >= self.expected
    }

    fn learn(&mut self, waiters: usize, commit_time: Duration) {
        self.expected = waiters;
        self.window = (commit_time / 2).min(Self::MAX_WINDOW);
    }
}

/// Ops in `batch` whose caller waits for the commit (not best-effort ones).
fn waiters(batch: &[Op]) -> usize {
    batch
        .iter()
        .filter(|op| !matches!(op, Op::Attempt { .. }))
        .count()
}

/// Applies `batch` in one transaction and answers every op. An op whose
/// statement fails is answered with its error and the rest are re-applied
/// without it, so one bad op does not fail its neighbours. Returns how long
/// the commit (the fsync) took.
fn commit_batch(
    conn: &mut Connection,
    batch: &mut Vec<Op>,
    notify: &KeyedNotify,
    durability: &mut Durability,
) -> Duration {
    let mut synced = durability.wanted(batch);
    loop {
        if let Err(e) = durability.set(conn, synced) {
            let e = map_error(e);
            let message = e.to_string();
            for op in batch.drain(..) {
                op.fail(StoreError::new(e.kind(), BACKEND, message.clone()));
            }
            return Duration::ZERO;
        }
        match try_batch(conn, batch, synced) {
            Ok((outcomes, commit_time, headroom)) => {
                durability.headroom = headroom;
                durability.committed();
                let mut wake = Vec::new();
                for (op, outcome) in batch.drain(..).zip(outcomes) {
                    if !notify.is_empty()
                        && let Some(id) = op.wakes(&outcome)
                    {
                        wake.push(id.to_owned());
                    }
                    op.answer(outcome);
                }
                for id in wake {
                    notify.notify(&id);
                }
                return commit_time;
            }
            Err(BatchError::Unsynced) => {
                // Claims ran past the durable fence ceiling (another process
                // used the headroom): apply the batch again, synced.
                synced = true;
            }
            Err(BatchError::Op(index, e)) => {
                let op = batch.remove(index);
                op.fail(map_error(e));
                if batch.is_empty() {
                    return Duration::ZERO;
                }
            }
            Err(BatchError::Transaction(e)) => {
                // BEGIN or COMMIT failed: nothing of the batch is written.
                let e = map_error(e);
                let message = e.to_string();
                for op in batch.drain(..) {
                    op.fail(StoreError::new(e.kind(), BACKEND, message.clone()));
                }
                return Duration::ZERO;
            }
        }
    }
}

#[derive(Debug)]
enum BatchError {
    /// The op at this index failed; the transaction was rolled back.
    Op(usize, rusqlite::Error),
    /// The transaction itself failed.
    Transaction(rusqlite::Error),
    /// The batch needs a synced commit it was not going to get; it was
    /// rolled back.
    Unsynced,
}

/// Applies `batch` in one transaction; returns the outcomes, how long the
/// commit took and the fence headroom left.
fn try_batch(
    conn: &mut Connection,
    batch: &[Op],
    synced: bool,
) -> Result<(Vec<Outcome>, Duration, i64), BatchError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(BatchError::Transaction)?;
    let now = monotonic_ms();
    let mut fences = FenceCounter::read(&tx, synced).map_err(BatchError::Transaction)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for (index, op) in batch.iter().enumerate() {
        // Dropping `tx` on the error path rolls the batch back.
        let outcome = apply(&tx, now, &mut fences, op).map_err(|e| BatchError::Op(index, e))?;
        outcomes.push(outcome);
    }
    if fences.short() {
        // Dropping `tx` rolls the batch back.
        return Err(BatchError::Unsynced);
    }
    fences.write(&tx).map_err(BatchError::Transaction)?;
    let started = Instant::now();
    tx.commit().map_err(BatchError::Transaction)?;
    Ok((outcomes, started.elapsed(), fences.headroom()))
}

mod apply;
pub(crate) use apply::skip_to_ceiling;
use apply::{FenceCounter, apply, purge_step};

#[cfg(test)]
mod tests;
