//! What each write does inside the batch's transaction: the one-statement
//! claim, fenced complete and release, timeline entries, the store-wide
//! fence counter, and the purge of expired rows.

use idemgate_engine::backend::monotonic_ms;
use idemgate_engine::{Attempt, MAX_TIMELINE, StoreError};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::rows::{RECORD_COLUMNS, int, raw_record, token_bytes};

use super::{Claimed, Op, Outcome};

/// How far ahead of the issued fences the durable ceiling is raised when
/// it runs out: one durable commit per this many claims.
const CEILING_STEP: i64 = 1024;

/// The store-wide fence counter, read once per batch and written back once,
/// and its durable ceiling.
///
/// Claims may be committed without an fsync (`synchronous=NORMAL`), so a
/// power loss can take the last increments of `fence` with them. Fences
/// handed out must still never be handed out again (an owner may have
/// passed its fence on to another system before the power went). So every
/// fence issued is at most `fence_ceiling`, and a batch that would issue a
/// fence above it raises the ceiling by [`CEILING_STEP`] and is committed
/// with an fsync. On open the counter is moved up to the ceiling
/// ([`skip_to_ceiling`]), past anything issued before a power loss.
pub(super) struct FenceCounter {
    stored: i64,
    next: i64,
    ceiling_stored: i64,
    ceiling: i64,
    /// Whether this batch is committed with an fsync: only then may the
    /// ceiling be raised.
    durable: bool,
    /// Set when a batch that is not durable needed a fence above the
    /// ceiling: the batch is then rolled back and applied again, durable.
    short: bool,
}

impl FenceCounter {
    pub(super) fn read(tx: &Transaction<'_>, durable: bool) -> rusqlite::Result<Self> {
        let read = |name: &str| -> rusqlite::Result<Option<i64>> {
            tx.prepare_cached("SELECT value FROM counters WHERE name = ?1")?
                .query_row([name], |row| row.get(0))
                .optional()
        };
        let stored = read("fence")?.unwrap_or(0);
        // No ceiling yet (a file from before ceilings): none to spare.
        let ceiling = read("fence_ceiling")?.unwrap_or(stored).max(stored);
        Ok(Self {
            stored,
            next: stored,
            ceiling_stored: ceiling,
            ceiling,
            durable,
            short: false,
        })
    }

    fn peek(&self) -> i64 {
        self.next.saturating_add(1)
    }

    /// Issues the fence [`FenceCounter::peek`] showed.
    fn take(&mut self) {
        self.next = self.peek();
        if self.next > self.ceiling {
            if self.durable {
                self.ceiling = self.next.saturating_add(CEILING_STEP);
            } else {
                self.short = true;
            }
        }
    }

    /// Whether the batch issued a fence above the ceiling without being
    /// durable (it must then be applied again, durable).
    pub(super) fn short(&self) -> bool {
        self.short
    }

    /// Fences that can still be issued without raising the ceiling.
    pub(super) fn headroom(&self) -> i64 {
        self.ceiling.saturating_sub(self.next)
    }

    pub(super) fn write(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        let set = |name: &str, value: i64| -> rusqlite::Result<()> {
            tx.prepare_cached(
                "INSERT INTO counters(name, value) VALUES (?1, ?2)
                 ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![name, value])?;
            Ok(())
        };
        if self.next != self.stored {
            set("fence", self.next)?;
        }
        if self.ceiling != self.ceiling_stored {
            set("fence_ceiling", self.ceiling)?;
        }
        Ok(())
    }
}

/// Moves the fence counter up to its durable ceiling, in a durable commit:
/// run when a process opens the file, so that fences issued by claims a
/// power loss took away are never issued again. Skipping values costs
/// nothing (fences need only grow); other processes already running just
/// find less headroom.
pub(crate) fn skip_to_ceiling(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "UPDATE counters SET value = (SELECT value FROM counters WHERE name = 'fence_ceiling')
         WHERE name = 'fence'
           AND value < (SELECT value FROM counters WHERE name = 'fence_ceiling')",
        [],
    )?;
    tx.commit()
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

pub(super) fn apply(
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
pub(super) fn append_attempt(
    tx: &Transaction<'_>,
    id: &str,
    attempt: &Attempt,
    keep_until: u64,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO attempts(id, at_ms, replica, outcome, status, latency_us,
                              repeat_count, last_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        id,
        int(attempt.at_ms),
        attempt.replica,
        attempt.outcome.as_str(),
        attempt.status,
        int(attempt.latency_us),
        attempt.repeated.map(|r| int(r.count)),
        attempt.repeated.map(|r| int(r.last_at_ms)),
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
pub(super) fn purge_step(conn: &mut Connection, limit: usize) -> rusqlite::Result<(usize, usize)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = purge_in(&tx, monotonic_ms(), limit)?;
    tx.commit()?;
    Ok(n)
}

/// Deletes up to `limit` expired records and up to `limit` expired timelines
/// (their attempts go with them); returns both counts.
pub(super) fn purge_in(
    tx: &Transaction<'_>,
    now: u64,
    limit: usize,
) -> rusqlite::Result<(usize, usize)> {
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
/// restored by [`map_error`] (a conversion failure reads as corrupt).
pub(super) fn to_driver(e: StoreError) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
}
