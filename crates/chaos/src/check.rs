//! The checker: a pure function from a [`History`] and the upstream's
//! execution log to the violations of the promise it finds.
//!
//! The invariants are stated in docs/design.md ("The promise, as
//! invariants"); each function below judges one. What the checker
//! cannot see, it does not guess: an execution is tied to the request
//! that caused it by the tag the upstream logged (`x-sim-tag`, the
//! request's id), requests that overlap an operator's forget are judged
//! in neither the epoch before nor the one after, and the at-least-once
//! window the design states for a crashed or stalled owner (kill -9,
//! SIGSTOP past the lease) is excused, counted, and never hidden; so is a
//! second execution after a store outage that outlasted the lease of an
//! owner holding its result, whose client was told the result was not
//! stored (`held`, the rule in `check/once.rs`), and one after a stall of
//! the whole host that froze the owner past half its lease while no fault
//! was injected (`stalled`: an overloaded machine or a paused VM freezes
//! every replica as a `pause` freezes one; `idemgate_testkit::stall`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use idemgate_llm_sim::Execution;
use serde::{Deserialize, Serialize};

use crate::history::{FaultKind, History, KeyId, Op};

mod once;
use once::{i1, i2, references, same_answer};

/// The invariants of docs/design.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Invariant {
    /// A final answer is the key's answer: every later final answer is the
    /// same bytes, and no later upstream execution starts for the key.
    I1,
    /// On a charging route, a key gets at most one upstream execution.
    I2,
    /// No answer crosses tenants, keys or fingerprints.
    I3,
    /// A stream assembled across resumptions is one run's events, in
    /// order, with no gap and no splice.
    I4,
    /// A response marked `Idempotent-Replayed: true` is the key's stored
    /// answer.
    I5,
    /// Once the faults stop, every key is answered within `pending_ttl`
    /// plus the stated bound.
    I6,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Self; 6] = [Self::I1, Self::I2, Self::I3, Self::I4, Self::I5, Self::I6];
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One breach of the promise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// The key it concerns, when there is one.
    pub key: Option<KeyId>,
    /// What was seen, naming the requests and executions.
    pub detail: String,
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Every violation.
    pub violations: Vec<Violation>,
    /// Repeated executions excused by the at-least-once window of a
    /// crashed or stalled owner.
    pub excused: usize,
    /// Repeated executions of a charging key excused because its owner
    /// held its result through a store outage that outlasted the lease,
    /// then released it and told its client the result was not stored
    /// (`Idempotent-Stored: false`; docs/design.md, "A store blink does not
    /// lose a result").
    #[serde(default)]
    pub held: usize,
    /// Repeated executions excused because the whole host stalled for at
    /// least half a lease between them (the run's watchdog saw it; no
    /// fault injected it) and the first owner's client got no final
    /// answer: a frozen owner, as a `pause` makes one (`idemgate_testkit::stall`).
    #[serde(default)]
    pub stalled: usize,
    /// Executions the log could not tie to a request of the history.
    pub unattributed: usize,
}

impl Report {
    /// Violations of `invariant`.
    pub fn count(&self, invariant: Invariant) -> usize {
        self.violations
            .iter()
            .filter(|v| v.invariant == invariant)
            .count()
    }

    /// True when nothing was violated.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    fn push(&mut self, invariant: Invariant, key: Option<&KeyId>, detail: String) {
        self.violations.push(Violation {
            invariant,
            key: key.cloned(),
            detail,
        });
    }
}

/// How long after its delete a forget returns: the replay cache's copies
/// are trusted for that second (docs/design.md, "Replays answered from
/// memory").
const FORGET_WAIT_MS: u64 = 1_000;

/// Judges `history` against the invariants, with `executions`, the
/// upstream's log of every execution of the run.
pub fn check(history: &History, executions: &[Execution]) -> Report {
    let mut report = Report::default();
    let ix = Index::new(history, executions, &mut report);
    for (key, ops) in &ix.by_key {
        let windows = ix.windows(key);
        i1(&ix, key, ops, &windows, &mut report);
        i2(&ix, history, key, &windows, &mut report);
        i5(key, ops, &windows, &mut report);
        i6(history, key, ops, &mut report);
    }
    i3(&ix, history, &mut report);
    i4(&ix, history, &mut report);
    report
}

/// The history, looked up the ways the invariants need it.
struct Index<'a> {
    ops: HashMap<u64, &'a Op>,
    /// Requests per key, in the order they were sent.
    by_key: BTreeMap<&'a KeyId, Vec<&'a Op>>,
    /// Executions per key (through the request that caused them), oldest
    /// first.
    runs: HashMap<&'a KeyId, Vec<(&'a Execution, &'a Op)>>,
    /// Executions by number.
    by_sequence: HashMap<u64, &'a Execution>,
    history: &'a History,
}

impl<'a> Index<'a> {
    fn new(history: &'a History, executions: &'a [Execution], report: &mut Report) -> Self {
        let ops: HashMap<u64, &Op> = history.ops.iter().map(|o| (o.id, o)).collect();
        let mut by_key: BTreeMap<&KeyId, Vec<&Op>> = BTreeMap::new();
        for op in &history.ops {
            by_key.entry(&op.key).or_default().push(op);
        }
        let mut runs: HashMap<&KeyId, Vec<(&Execution, &Op)>> = HashMap::new();
        for e in executions {
            match e.tag.parse::<u64>().ok().and_then(|id| ops.get(&id)) {
                Some(op) => runs.entry(&op.key).or_default().push((e, op)),
                None => report.unattributed += 1,
            }
        }
        for list in runs.values_mut() {
            list.sort_by_key(|(e, _)| (e.started_ms, e.sequence));
        }
        let by_sequence = executions.iter().map(|e| (e.sequence, e)).collect();
        Self {
            ops,
            by_key,
            runs,
            by_sequence,
            history,
        }
    }

    /// The forgets of `key`, as windows from their sending to their
    /// return. A forget that never returned (its replica killed or frozen
    /// meanwhile) may have deleted the record at any time its replica
    /// still ran, and replicas may answer from a copy for a second after
    /// the delete (the wait a returning forget does): its window lasts
    /// until a second after its replica's fault ended, or after it gave up.
    fn windows(&self, key: &KeyId) -> Windows {
        let mut w: Vec<(u64, u64)> = self
            .history
            .forgets
            .iter()
            .filter(|f| &f.key == key)
            .map(|f| {
                let end = f.complete_ms.max(f.invoke_ms);
                if f.status.is_some() {
                    return (f.invoke_ms, end);
                }
                let fault_end = self
                    .history
                    .faults
                    .iter()
                    .filter(|x| {
                        x.replica == Some(f.replica) && x.start_ms <= end && x.end_ms >= f.invoke_ms
                    })
                    .map(|x| x.end_ms)
                    .max()
                    .unwrap_or(end);
                (
                    f.invoke_ms,
                    end.max(fault_end).saturating_add(FORGET_WAIT_MS),
                )
            })
            .collect();
        w.sort_unstable();
        Windows(w)
    }

    /// Whether the whole host stalled for at least half a lease at some
    /// time in `[from, to]`: every replica was frozen, long enough to cost
    /// an owner its lease (renewals come every third of it).
    fn host_stalled(&self, from: u64, to: u64) -> bool {
        let half_lease = self.history.pending_ttl_ms / 2;
        self.history
            .stalls
            .iter()
            .any(|s| s.duration_ms() >= half_lease && s.start_ms <= to && s.end_ms >= from)
    }

    /// Whether `replica` was frozen or killed by a fault of `kinds` at some
    /// time in `[from, to]`.
    fn faulted(&self, replica: usize, kinds: &[FaultKind], from: u64, to: u64) -> bool {
        self.history.faults.iter().any(|f| {
            f.replica == Some(replica)
                && kinds.contains(&f.kind)
                && f.start_ms <= to
                && f.end_ms >= from
        })
    }
}

/// An operator's forgets of one key: each starts a new epoch, in which the
/// key may get a new answer. What overlaps a forget belongs to no epoch.
struct Windows(Vec<(u64, u64)>);

impl Windows {
    /// The epoch of something that happened from `start` to `end`, or
    /// `None` if that overlaps a forget.
    fn epoch(&self, start: u64, end: u64) -> Option<usize> {
        if self.0.iter().any(|&(s, e)| start <= e && end >= s) {
            return None;
        }
        Some(self.0.iter().filter(|&&(_, e)| e < start).count())
    }
}

/// I3: every execution an answer names ran for that answer's tenant,
/// route, key and request body.
fn i3(ix: &Index<'_>, history: &History, report: &mut Report) {
    for op in &history.ops {
        for seq in &op.answer.executions {
            let Some(e) = ix.by_sequence.get(seq) else {
                report.push(
                    Invariant::I3,
                    Some(&op.key),
                    format!("request {} names execution {seq}, which never ran", op.id),
                );
                continue;
            };
            let route = e
                .tag
                .parse::<u64>()
                .ok()
                .and_then(|id| ix.ops.get(&id))
                .map(|o| o.key.route.as_str());
            let crossed = if e.credential != op.key.credential {
                Some("tenant")
            } else if e.key != op.key.key {
                Some("key")
            } else if route.is_some_and(|r| r != op.key.route) {
                Some("route")
            } else if e.body_sha256 != op.body_sha256 {
                Some("fingerprint")
            } else {
                None
            };
            if let Some(what) = crossed {
                report.push(
                    Invariant::I3,
                    Some(&op.key),
                    format!(
                        "request {} got execution {seq}, which ran for another {what}",
                        op.id
                    ),
                );
            }
        }
    }
}

/// I4: a stream resumed with `Last-Event-ID` is, with the events before
/// it, one run's events numbered 1, 2, 3, … without a gap; a resumption
/// answered with another run's stream (marked restarted) is that stream
/// alone, whole.
fn i4(ix: &Index<'_>, history: &History, report: &mut Report) {
    for op in &history.ops {
        let (Some(prev), Some(from)) = (op.resumes, op.last_event_id) else {
            continue;
        };
        let Some(prev) = ix.ops.get(&prev) else {
            continue;
        };
        if op.answer.status != Some(200) {
            continue;
        }
        // Restarted: the client keeps nothing of the events it had.
        let before = prev
            .answer
            .events
            .iter()
            .filter(|e| !op.answer.restarted && e.id.is_some_and(|id| id <= from));
        let assembled: Vec<_> = before.chain(op.answer.events.iter()).collect();
        let mut runs: Vec<u64> = assembled.iter().filter_map(|e| e.execution).collect();
        runs.dedup();
        if runs.len() > 1 {
            report.push(
                Invariant::I4,
                Some(&op.key),
                format!(
                    "request {} resumed request {} after event {from} and spliced executions {runs:?}",
                    op.id, prev.id
                ),
            );
            continue;
        }
        let ids: Vec<u64> = assembled.iter().filter_map(|e| e.id).collect();
        if ids.iter().zip(1u64..).any(|(&id, want)| id != want) {
            report.push(
                Invariant::I4,
                Some(&op.key),
                format!(
                    "request {} resumed request {} after event {from}: event ids {ids:?}",
                    op.id, prev.id
                ),
            );
        }
    }
}

/// I5: a complete answer marked replayed is the key's stored answer: the
/// answer the final reads found stored (replayed) in the same epoch, or,
/// failing that, the epoch's first final answer. Marked replayed in an
/// epoch whose final read found nothing stored (it ran the work afresh),
/// it replayed an answer the store never held.
fn i5(key: &KeyId, ops: &[&Op], windows: &Windows, report: &mut Report) {
    let refs = references(ops, windows);
    let stored: BTreeMap<usize, &Op> = ops
        .iter()
        .filter(|o| o.final_read && o.answer.is_final() && o.last_event_id.is_none())
        .filter_map(|o| Some((windows.epoch(o.invoke_ms, o.complete_ms)?, *o)))
        .collect();
    for op in ops {
        if op.answer.replayed != Some(true) || !op.answer.is_final() {
            continue;
        }
        let Some(epoch) = windows.epoch(op.invoke_ms, op.complete_ms) else {
            continue;
        };
        let truth = match stored.get(&epoch) {
            Some(read)
                if read.answer.replayed == Some(false) && read.invoke_ms > op.complete_ms =>
            {
                report.push(
                    Invariant::I5,
                    Some(key),
                    format!(
                        "request {} was answered as replayed (executions {:?}), yet the store held no answer: the final read {} ran the work",
                        op.id, op.answer.executions, read.id
                    ),
                );
                continue;
            }
            Some(read) if read.answer.replayed == Some(true) => *read,
            _ => match refs.get(&epoch) {
                Some(first) => *first,
                None => continue,
            },
        };
        if truth.id == op.id {
            continue;
        }
        if let Err(why) = same_answer(truth, op) {
            report.push(
                Invariant::I5,
                Some(key),
                format!(
                    "request {} was answered as replayed, unlike the stored answer (request {}): {why}",
                    op.id, truth.id
                ),
            );
        }
    }
}

/// I6: once the faults stopped, every key was answered (or refused with
/// the key-mismatch of a key another body holds) by a final read sent
/// before `quiet + pending_ttl + bound`. A key the harness first asked
/// only after that deadline (its final reads queue behind one another: a
/// long run has thousands of keys) must be answered by that first read: a
/// key still stuck is refused then.
fn i6(history: &History, key: &KeyId, ops: &[&Op], report: &mut Report) {
    let reads: Vec<&&Op> = ops.iter().filter(|o| o.final_read).collect();
    let (Some(first), Some(last)) = (reads.first(), reads.last()) else {
        return;
    };
    let deadline = history
        .quiet_ms
        .saturating_add(history.pending_ttl_ms)
        .saturating_add(history.settle_bound_ms);
    let got = |o: &Op| {
        o.answer.is_final()
            || (o.answer.complete && o.answer.problem.as_deref() == Some("key-mismatch"))
    };
    let answered = if first.invoke_ms > deadline {
        got(first)
    } else {
        reads.iter().any(|o| o.invoke_ms <= deadline && got(o))
    };
    if !answered {
        report.push(
            Invariant::I6,
            Some(key),
            format!(
                "no answer {} ms after the faults stopped (pending_ttl {} + bound {}): last read {} got {:?} {:?}",
                last.complete_ms.saturating_sub(history.quiet_ms),
                history.pending_ttl_ms,
                history.settle_bound_ms,
                last.id,
                last.answer.status,
                last.answer.problem.as_deref().or(last.answer.error.as_deref()),
            ),
        );
    }
}

#[cfg(test)]
mod tests;
