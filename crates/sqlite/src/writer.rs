//! The writer thread: one connection, group commit.
//!
//! Every write (claim, renew, complete, release, timeline entry) is a
//! message to this thread. It takes whatever is queued (up to the batch
//! limit), applies it in order inside one `BEGIN IMMEDIATE … COMMIT`, and
//! only then answers the callers: one fsync covers the whole batch, and no
//! caller hears "done" before its write is on disk. Applying in queue order
//! inside one transaction is a valid serial order, so each operation stays
//! atomic. `BEGIN IMMEDIATE` plus the busy timeout serializes this thread
//! with the writers of other processes sharing the file.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::notify::KeyedNotify;
use idemgate_engine::record::monotonic_ms;
use idemgate_engine::{Attempt, MAX_TIMELINE, Record, StoreError};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use tokio::sync::oneshot;

use crate::error::{BACKEND, closed, corrupt, store_error};
use crate::rows::{RECORD_COLUMNS, int, raw_record, token_bytes};

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

/// The writer loop. Returns when told to stop or when every sender is gone.
pub(crate) fn run(
    mut conn: Connection,
    rx: Receiver<Msg>,
    notify: Arc<KeyedNotify>,
    config: WriterConfig,
) {
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
            let commit_time = commit_batch(&mut conn, &mut batch, &notify);
            gather.learn(waiters, commit_time);
        }
        if !stopping && Instant::now() >= next_purge {
            let full = match purge_step(&mut conn, config.purge_batch) {
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
fn commit_batch(conn: &mut Connection, batch: &mut Vec<Op>, notify: &KeyedNotify) -> Duration {
    loop {
        match try_batch(conn, batch) {
            Ok((outcomes, commit_time)) => {
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
            Err(BatchError::Op(index, e)) => {
                let op = batch.remove(index);
                op.fail(store_error(e));
                if batch.is_empty() {
                    return Duration::ZERO;
                }
            }
            Err(BatchError::Transaction(e)) => {
                // BEGIN or COMMIT failed: nothing of the batch is written.
                let e = store_error(e);
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
}

fn try_batch(conn: &mut Connection, batch: &[Op]) -> Result<(Vec<Outcome>, Duration), BatchError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(BatchError::Transaction)?;
    let now = monotonic_ms();
    let mut fences = FenceCounter::read(&tx).map_err(BatchError::Transaction)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for (index, op) in batch.iter().enumerate() {
        // Dropping `tx` on the error path rolls the batch back.
        let outcome = apply(&tx, now, &mut fences, op).map_err(|e| BatchError::Op(index, e))?;
        outcomes.push(outcome);
    }
    fences.write(&tx).map_err(BatchError::Transaction)?;
    let started = Instant::now();
    tx.commit().map_err(BatchError::Transaction)?;
    Ok((outcomes, started.elapsed()))
}

/// The store-wide fence counter, read once per batch and written back once.
struct FenceCounter {
    stored: i64,
    next: i64,
}

impl FenceCounter {
    fn read(tx: &Transaction<'_>) -> rusqlite::Result<Self> {
        let stored: i64 = tx
            .prepare_cached("SELECT value FROM counters WHERE name = 'fence'")?
            .query_row([], |row| row.get(0))
            .optional()?
            .unwrap_or(0);
        Ok(Self {
            stored,
            next: stored,
        })
    }

    fn peek(&self) -> i64 {
        self.next.saturating_add(1)
    }

    fn take(&mut self) {
        self.next = self.peek();
    }

    fn write(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        if self.next != self.stored {
            tx.prepare_cached(
                "INSERT INTO counters(name, value) VALUES ('fence', ?1)
                 ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            )?
            .execute([self.next])?;
        }
        Ok(())
    }
}

/// Claims when the row is absent or expired: one statement, evaluated inside
/// the write transaction, so no other writer can slip in between the check
/// and the write.
const CLAIM_SQL: &str = "
INSERT INTO records(id, fingerprint, token, fence, done, expires_at, payload)
VALUES (?1, ?2, ?3, ?4, 0, ?5, NULL)
ON CONFLICT(id) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    token = excluded.token,
    fence = excluded.fence,
    done = 0,
    expires_at = excluded.expires_at,
    payload = NULL
WHERE records.expires_at <= ?6";

fn apply(
    tx: &Transaction<'_>,
    now: u64,
    fences: &mut FenceCounter,
    op: &Op,
) -> rusqlite::Result<Outcome> {
    match op {
        Op::Claim {
            id,
            fingerprint,
            token,
            ttl_ms,
            ..
        } => {
            let expires_at_ms = now.saturating_add(*ttl_ms);
            let fence = fences.peek();
            let changed = tx.prepare_cached(CLAIM_SQL)?.execute(params![
                id,
                &fingerprint[..],
                &token_bytes(*token)[..],
                fence,
                int(expires_at_ms),
                int(now),
            ])?;
            if changed == 1 {
                fences.take();
                return Ok(Outcome::Claimed(Claimed::Acquired {
                    fence: u64::try_from(fence).unwrap_or(u64::MAX),
                    expires_at_ms,
                }));
            }
            let raw = tx
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS} FROM records WHERE id = ?1"
                ))?
                .query_row([id], raw_record)?;
            let record = raw.decode().map_err(to_driver)?;
            Ok(Outcome::Claimed(Claimed::Existing(record)))
        }
        Op::Renew { owner, ttl_ms, .. } => {
            let expires = now.saturating_add(*ttl_ms);
            let changed = tx
                .prepare_cached(
                    "UPDATE records SET expires_at = ?1
                     WHERE id = ?2 AND done = 0 AND token = ?3 AND fence = ?4",
                )?
                .execute(params![
                    int(expires),
                    owner.id,
                    &token_bytes(owner.token)[..],
                    int(owner.fence)
                ])?;
            Ok(Outcome::Renewed((changed == 1).then_some(expires)))
        }
        Op::Complete {
            owner,
            payload,
            ttl_ms,
            attempt,
            ..
        } => {
            let expires = now.saturating_add(*ttl_ms);
            let changed = tx
                .prepare_cached(
                    "UPDATE records SET done = 1, payload = ?1, expires_at = ?2
                     WHERE id = ?3 AND done = 0 AND token = ?4 AND fence = ?5",
                )?
                .execute(params![
                    &payload[..],
                    int(expires),
                    owner.id,
                    &token_bytes(owner.token)[..],
                    int(owner.fence)
                ])?;
            if changed == 1 {
                append_attempt(tx, &owner.id, attempt, expires)?;
                return Ok(Outcome::Applied(true));
            }
            // The DONE row this very lease wrote with this payload: a retry
            // of a complete whose reply was lost, acknowledged unchanged.
            let again = tx
                .prepare_cached(
                    "SELECT count(*) FROM records WHERE id = ?1 AND done = 1 AND token = ?2
                     AND fence = ?3 AND payload = ?4 AND expires_at > ?5",
                )?
                .query_row(
                    params![
                        owner.id,
                        &token_bytes(owner.token)[..],
                        int(owner.fence),
                        &payload[..],
                        int(now)
                    ],
                    |row| row.get::<_, i64>(0),
                )?;
            Ok(Outcome::Applied(again == 1))
        }
        Op::Release {
            owner,
            attempt,
            ttl_ms,
            ..
        } => {
            let changed = tx
                .prepare_cached(
                    "DELETE FROM records WHERE id = ?1 AND done = 0 AND token = ?2 AND fence = ?3",
                )?
                .execute(params![
                    owner.id,
                    &token_bytes(owner.token)[..],
                    int(owner.fence)
                ])?;
            if changed == 1 {
                append_attempt(tx, &owner.id, attempt, now.saturating_add(*ttl_ms))?;
            }
            Ok(Outcome::Applied(changed == 1))
        }
        Op::Forget {
            id,
            attempt,
            ttl_ms,
            ..
        } => {
            let changed = tx
                .prepare_cached("DELETE FROM records WHERE id = ?1")?
                .execute(params![id])?;
            if changed == 1 {
                append_attempt(tx, id, attempt, now.saturating_add(*ttl_ms))?;
            }
            Ok(Outcome::Applied(changed == 1))
        }
        Op::Attempt {
            id,
            attempt,
            ttl_ms,
        } => {
            append_attempt(tx, id, attempt, now.saturating_add(*ttl_ms))?;
            Ok(Outcome::Recorded)
        }
        Op::Purge { limit, .. } => Ok(Outcome::Purged(purge_in(tx, now, *limit)?)),
    }
}

/// Appends to a key's timeline, extends its retention, and drops the oldest
/// entries beyond [`MAX_TIMELINE`].
fn append_attempt(
    tx: &Transaction<'_>,
    id: &str,
    attempt: &Attempt,
    keep_until: u64,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO attempts(id, at_ms, replica, outcome, status, latency_us)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        id,
        int(attempt.at_ms),
        attempt.replica,
        attempt.outcome.as_str(),
        attempt.status,
        int(attempt.latency_us),
    ])?;
    let entries: i64 = tx
        .prepare_cached(
            "INSERT INTO timelines(id, keep_until, entries) VALUES (?1, ?2, 1)
             ON CONFLICT(id) DO UPDATE SET
                 keep_until = max(keep_until, excluded.keep_until),
                 entries = entries + 1
             RETURNING entries",
        )?
        .query_row(params![id, int(keep_until)], |row| row.get(0))?;
    let max = i64::try_from(MAX_TIMELINE).unwrap_or(i64::MAX);
    if entries > max {
        tx.prepare_cached(
            "DELETE FROM attempts WHERE seq IN
                 (SELECT seq FROM attempts WHERE id = ?1 ORDER BY seq LIMIT ?2)",
        )?
        .execute(params![id, entries - max])?;
        tx.prepare_cached("UPDATE timelines SET entries = ?1 WHERE id = ?2")?
            .execute(params![max, id])?;
    }
    Ok(())
}

/// One bounded purge step in its own transaction.
fn purge_step(conn: &mut Connection, limit: usize) -> rusqlite::Result<(usize, usize)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = purge_in(&tx, monotonic_ms(), limit)?;
    tx.commit()?;
    Ok(n)
}

/// Deletes up to `limit` expired records and up to `limit` expired timelines
/// (their attempts go with them); returns both counts.
fn purge_in(tx: &Transaction<'_>, now: u64, limit: usize) -> rusqlite::Result<(usize, usize)> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let records = tx
        .prepare_cached(
            "DELETE FROM records WHERE rowid IN
                 (SELECT rowid FROM records WHERE expires_at <= ?1 LIMIT ?2)",
        )?
        .execute(params![int(now), limit])?;
    let timelines = tx
        .prepare_cached(
            "DELETE FROM timelines WHERE rowid IN
                 (SELECT rowid FROM timelines WHERE keep_until <= ?1 LIMIT ?2)",
        )?
        .execute(params![int(now), limit])?;
    Ok((records, timelines))
}

/// Carries a decoding failure through a driver-typed result; the kind is
/// restored by [`store_error`] (a conversion failure reads as corrupt).
fn to_driver(e: StoreError) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
}
