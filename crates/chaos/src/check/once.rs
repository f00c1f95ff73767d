//! I1 and I2, what must happen once: the key's answer, and on a charging
//! route its execution. Both are judged with the windows the design
//! states for a second execution: the at-least-once window of an owner
//! killed or frozen past its lease, and a store outage that outlasted an
//! owner's lease (the owner's client then got its result marked
//! `Idempotent-Stored: false`, or 503 `lease-lost`: no final answer). Each is excused only by its stated rule, and counted
//! ([`Report::excused`], [`Report::held`]).

use std::collections::BTreeMap;

use idemgate_llm_sim::Execution;

use super::{Index, Invariant, Report, Windows};
use crate::history::{FaultKind, History, KeyId, Op};

/// The first final answer of each epoch that is a whole answer (not a
/// resumption), by the time it was received: the key's answer. (A result
/// released unstored is marked `Idempotent-Stored: false`, and is no
/// final answer.)
pub(super) fn references<'a>(ops: &[&'a Op], windows: &Windows) -> BTreeMap<usize, &'a Op> {
    let mut refs: BTreeMap<usize, &Op> = BTreeMap::new();
    for op in ops {
        if !op.answer.is_final() || op.last_event_id.is_some() {
            continue;
        }
        let Some(epoch) = windows.epoch(op.invoke_ms, op.complete_ms) else {
            continue;
        };
        let slot = refs.entry(epoch).or_insert(op);
        if op.complete_ms < slot.complete_ms {
            *slot = op;
        }
    }
    refs
}

/// Whether `other` carries the same answer as `reference` (a whole
/// answer): the same status and bytes, or, for a resumption, the same
/// events under the same ids.
pub(super) fn same_answer(reference: &Op, other: &Op) -> Result<(), String> {
    if reference.answer.status != other.answer.status {
        return Err(format!(
            "status {:?} after {:?}",
            other.answer.status, reference.answer.status
        ));
    }
    if other.last_event_id.is_none() {
        if reference.answer.body_sha256 != other.answer.body_sha256 {
            return Err(format!(
                "other bytes (executions {:?} after {:?})",
                other.answer.executions, reference.answer.executions
            ));
        }
        return Ok(());
    }
    for ev in &other.answer.events {
        let Some(id) = ev.id else { continue };
        let same = reference
            .answer
            .events
            .iter()
            .find(|r| r.id == Some(id))
            .is_some_and(|r| r.sha256 == ev.sha256);
        if !same {
            return Err(format!(
                "event {id} differs (executions {:?} after {:?})",
                other.answer.executions, reference.answer.executions
            ));
        }
    }
    Ok(())
}

/// I1: within an epoch, every final answer is the first one's bytes, and
/// no execution of the key starts after the first final answer was
/// received (unless its owner was frozen between its request and its
/// start: the stalled owner the design's fencing speaks of, by a `pause`,
/// or by a stall of the whole host while its client got no final answer).
pub(super) fn i1(ix: &Index<'_>, key: &KeyId, ops: &[&Op], windows: &Windows, report: &mut Report) {
    let refs = references(ops, windows);
    for op in ops {
        if !op.answer.is_final() {
            continue;
        }
        let Some(epoch) = windows.epoch(op.invoke_ms, op.complete_ms) else {
            continue;
        };
        let Some(reference) = refs.get(&epoch) else {
            continue;
        };
        if reference.id == op.id {
            continue;
        }
        if let Err(why) = same_answer(reference, op) {
            report.push(
                Invariant::I1,
                Some(key),
                format!(
                    "request {} got a final answer unlike request {}'s: {why}",
                    op.id, reference.id
                ),
            );
        }
    }
    for (e, op) in ix.runs.get(key).map(Vec::as_slice).unwrap_or_default() {
        let Some(epoch) = windows.epoch(e.started_ms, e.started_ms) else {
            continue;
        };
        let Some(reference) = refs.get(&epoch) else {
            continue;
        };
        if e.started_ms <= reference.complete_ms {
            continue;
        }
        if ix.faulted(op.replica, &[FaultKind::Pause], op.invoke_ms, e.started_ms) {
            report.excused += 1;
            continue;
        }
        if !op.answer.is_final() && ix.host_stalled(op.invoke_ms, e.started_ms) {
            report.stalled += 1;
            continue;
        }
        report.push(
            Invariant::I1,
            Some(key),
            format!(
                "execution {} (request {}, replica {}) started {} ms after request {} got the key's final answer",
                e.sequence,
                op.id,
                op.replica,
                e.started_ms - reference.complete_ms,
                reference.id
            ),
        );
    }
}

/// I2: on a charging route, at most one execution per key and epoch. An
/// execution followed by another is excused only when its owner was
/// killed or frozen between the two (at-least-once after a crash), by a
/// fault or by a stall of the whole host while its client got no final
/// answer, or held its result through a store outage past its lease.
pub(super) fn i2(
    ix: &Index<'_>,
    history: &History,
    key: &KeyId,
    windows: &Windows,
    report: &mut Report,
) {
    if !history.charging_routes.contains(&key.route) {
        return;
    }
    let mut epochs: BTreeMap<usize, Vec<(&Execution, &Op)>> = BTreeMap::new();
    for &(e, op) in ix.runs.get(key).map(Vec::as_slice).unwrap_or_default() {
        if let Some(epoch) = windows.epoch(e.started_ms, e.started_ms) {
            epochs.entry(epoch).or_default().push((e, op));
        }
    }
    for runs in epochs.values() {
        for pair in runs.windows(2) {
            let [(first, owner), (next, _)] = pair else {
                continue;
            };
            let kinds = [FaultKind::Kill, FaultKind::Pause];
            if ix.faulted(owner.replica, &kinds, first.started_ms, next.started_ms) {
                report.excused += 1;
                continue;
            }
            // The whole host stalled past half the lease: the owner froze
            // as under a `pause`. Its client was told (no final answer).
            if !owner.answer.is_final() && ix.host_stalled(first.started_ms, next.started_ms) {
                report.stalled += 1;
                continue;
            }
            // A store outage outlasted the owner's lease: it held its
            // result and released it unstored, or lost the key mid-call
            // (its renewals waited on the store). Its client got the
            // result marked not stored or a 503 `lease-lost` (no final
            // answer), or had given up. A stored answer's loss is never
            // excused.
            if !owner.answer.is_final()
                && outage(ix, owner.replica, first.started_ms, next.started_ms)
            {
                report.held += 1;
                continue;
            }
            report.push(
                Invariant::I2,
                Some(key),
                format!(
                    "charging key executed again: execution {} (request {}, replica {}) then {}",
                    first.sequence, owner.id, owner.replica, next.sequence
                ),
            );
        }
    }
}

/// Whether a store outage that may have outlasted the lease of an owner
/// on replica `owner` overlaps `[from, to]`, lasting at least half the
/// lease: a store restart or failover (the store takes no write the
/// promise can rely on until its replica is in sync again), or, where the
/// replicas share one SQLite file, another replica frozen (it may hold
/// the file's write lock: every replica's writes, the owner's renewals
/// among them, wait until it resumes, and the first claim after that takes
/// the expired record over). An owner holds a result the store
/// refuses until its lease runs out (docs/design.md, "A store blink does
/// not lose a result"), at least half a lease since renewals come every
/// third of it; then the key is released, the owner's client gets the
/// result marked `Idempotent-Stored: false`, and the next request runs the
/// work again (docs/design.md, "A store blink does not lose a result").
fn outage(ix: &Index<'_>, owner: usize, from: u64, to: u64) -> bool {
    let half_lease = ix.history.pending_ttl_ms / 2;
    let shared_file = ix.history.shared_file;
    ix.history.faults.iter().any(|f| {
        let store_out = match f.kind {
            FaultKind::StoreRestart | FaultKind::Failover => true,
            FaultKind::Pause => shared_file && f.replica != Some(owner),
            _ => false,
        };
        store_out
            && f.end_ms.saturating_sub(f.start_ms) >= half_lease
            && f.start_ms <= to
            && f.end_ms >= from
    })
}
