//! I1 and I2, and the windows that excuse a second execution: a crashed
//! or frozen owner, a store outage past the lease, a stall of the whole
//! host (`check/once.rs`).

use super::{execution, history, key, only, op};
use crate::check::{Invariant, check};
use crate::history::{Answer, Fault, FaultKind, Forget, Stall};

#[test]
fn i1_clean_replays_repeat_the_answer() {
    let h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 2_000, 1, "A", true),
    ]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
}

#[test]
fn i1_a_later_final_answer_with_other_bytes_is_caught() {
    let h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 2_000, 2, "B", false),
    ]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 2_001)];
    let report = check(&h, &log);
    assert!(report.count(Invariant::I1) >= 1, "{report:?}");
}

#[test]
fn i1_an_execution_after_a_final_answer_is_caught_unless_its_owner_was_frozen() {
    // Request 2 was answered in flight (409), but its execution started
    // after request 1 had the key's final answer.
    let mut late = op(2, "plain", 900, 0, "", false);
    late.answer = Answer {
        status: Some(409),
        problem: Some("in-flight".into()),
        complete: true,
        ..Answer::default()
    };
    late.replica = 1;
    let mut h = history(vec![op(1, "plain", 1_000, 1, "A", false), late]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 1_500)];
    assert_eq!(only(&h, &log, Invariant::I1), 1);
    // Replica 1 was frozen between request 2 and its execution: the
    // stalled owner fencing speaks of, excused.
    h.faults.push(Fault {
        kind: FaultKind::Pause,
        replica: Some(1),
        start_ms: 950,
        end_ms: 1_450,
        detail: None,
    });
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.excused, 1);
}

#[test]
fn i1_a_forget_starts_a_new_epoch() {
    let mut h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 5_000, 2, "B", false),
    ]);
    h.forgets.push(Forget {
        key: key("plain"),
        replica: 0,
        invoke_ms: 2_000,
        complete_ms: 3_000,
        status: Some(200),
    });
    let log = [execution(1, 1, 1_001), execution(2, 2, 5_001)];
    assert!(check(&h, &log).is_clean());
}

#[test]
fn i2_clean_one_execution_per_charging_key() {
    let mut unknown = op(1, "charged", 1_000, 0, "U", false);
    unknown.answer.status = Some(502);
    unknown.answer.problem = Some("outcome-unknown".into());
    unknown.answer.executions.clear();
    let mut replay = unknown.clone();
    replay.id = 2;
    replay.invoke_ms = 2_000;
    replay.complete_ms = 2_010;
    replay.answer.replayed = Some(true);
    let h = history(vec![unknown, replay]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
}

#[test]
fn i2_a_second_execution_of_a_charging_key_is_caught_unless_its_owner_crashed() {
    // Request 1 was cut (no answer); request 2 ran the charge again.
    let mut cut = op(1, "charged", 1_000, 1, "", false);
    cut.answer = Answer {
        error: Some("connection closed".into()),
        ..Answer::default()
    };
    let mut h = history(vec![cut, op(2, "charged", 3_000, 2, "B", false)]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 3_001)];
    assert_eq!(only(&h, &log, Invariant::I2), 1);
    // A SIGTERM does not excuse it (a rolling restart must not charge
    // twice) ...
    h.faults.push(Fault {
        kind: FaultKind::Terminate,
        replica: Some(0),
        start_ms: 1_500,
        end_ms: 2_000,
        detail: None,
    });
    assert_eq!(only(&h, &log, Invariant::I2), 1);
    // ... a kill -9 does: at-least-once after a crash.
    h.faults.push(Fault {
        kind: FaultKind::Kill,
        replica: Some(0),
        start_ms: 1_500,
        end_ms: 2_000,
        detail: None,
    });
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.excused, 1);
}

/// The whole host stalled (the run's watchdog saw it; no fault was
/// injected): every replica froze, the owner past its lease, and the next
/// request ran the charge again. Excused and counted as `stalled` only
/// for a stall of at least half the lease between the two executions, and
/// only when the owner's client got no final answer: a stored answer's
/// loss is never excused.
#[test]
fn a_host_stall_past_half_the_lease_is_counted_not_hidden() {
    let mut owner = op(1, "charged", 1_000, 1, "A", false);
    owner.complete_ms = 6_000;
    owner.answer = Answer {
        status: Some(503),
        problem: Some("lease-lost".into()),
        complete: true,
        ..Answer::default()
    };
    let mut h = history(vec![owner, op(2, "charged", 4_500, 2, "B", false)]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 4_501)];
    assert_eq!(only(&h, &log, Invariant::I2), 1);
    let stall = |start_ms, end_ms| Stall { start_ms, end_ms };
    // Shorter than half the lease (1.5 s): no lease was lost to it.
    h.stalls.push(stall(1_100, 2_500));
    assert_eq!(only(&h, &log, Invariant::I2), 1);
    // Long enough, but after both executions: it explains nothing.
    h.stalls = vec![stall(5_000, 8_000)];
    assert_eq!(only(&h, &log, Invariant::I2), 1);
    h.stalls = vec![stall(1_100, 4_000)];
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.stalled, 1, "{report:?}");
    assert_eq!(report.excused, 0);
    // Had the owner's client got a final answer, the second execution
    // lost the key's answer: never excused.
    h.ops[0].answer = op(1, "charged", 1_000, 1, "A", false).answer;
    let report = check(&h, &log);
    assert_eq!(report.count(Invariant::I2), 1, "{report:?}");
    assert_eq!(report.stalled, 0);
}

/// A held result released when a store outage outlasted its lease: the
/// owner's client got the result marked `Idempotent-Stored: false`, the
/// key was not stored, the next request ran the charge again and got
/// other bytes. Excused as `held` only when the answer said it was not
/// stored and a store restart or failover of at least half the lease came
/// between the two; an unmarked answer is the key's, and its loss is
/// never excused.
#[test]
fn a_result_released_in_a_store_outage_past_the_lease_is_counted_not_hidden() {
    let mut owner = op(1, "charged", 1_000, 1, "A", false);
    owner.complete_ms = 2_900;
    owner.answer.stored = Some(false);
    // Request 3 replays the answer the store holds: the second one.
    let mut h = history(vec![
        owner,
        op(2, "charged", 3_000, 2, "B", false),
        op(3, "charged", 4_000, 2, "B", true),
    ]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 3_001)];
    // Without an outage, a second execution of a charging key.
    let report = check(&h, &log);
    assert_eq!(report.count(Invariant::I2), 1, "{report:?}");
    let fault = |kind, start_ms, end_ms| Fault {
        kind,
        replica: None,
        start_ms,
        end_ms,
        detail: None,
    };
    // Shorter than half the lease (1.5 s): the result was stored in time.
    h.faults.push(fault(FaultKind::Failover, 1_500, 2_900));
    h.faults.push(fault(FaultKind::StoreCut, 1_500, 2_900));
    assert_eq!(check(&h, &log).count(Invariant::I2), 1);
    h.faults.clear();
    h.faults.push(fault(FaultKind::Failover, 1_200, 2_950));
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.held, 1, "{report:?}");
    assert_eq!(report.excused, 0);
    // The same answer unmarked was the key's: its loss is I1 and I2,
    // whatever the outage.
    h.ops[0].answer.stored = None;
    let report = check(&h, &log);
    assert!(report.count(Invariant::I1) >= 1, "{report:?}");
    assert_eq!(report.count(Invariant::I2), 1, "{report:?}");
    // A store restart is such an outage too; after both executions it
    // excuses nothing.
    h.ops[0].answer.stored = Some(false);
    h.faults.clear();
    h.faults.push(fault(FaultKind::StoreRestart, 3_500, 6_000));
    assert_eq!(check(&h, &log).count(Invariant::I2), 1);
}

/// Replicas sharing one SQLite file: replica 1 frozen while it held the
/// file's write lock stalled every write for longer than the lease, so
/// the owner on replica 0 could not renew, and the first claim after the
/// thaw (replica 2) ran the charge again while the owner's call went on.
/// The owner's client never got a final answer. That is a store outage
/// past the lease (counted as `held`), only where the file is shared,
/// only for a freeze of another replica, and only one of at least half
/// the lease.
#[test]
fn a_frozen_peer_holding_the_shared_file_is_a_store_outage() {
    let mut owner = op(1, "charged", 1_000, 1, "A", false);
    owner.complete_ms = 1_300;
    owner.answer.complete = false;
    let mut next = op(2, "charged", 5_000, 2, "B", false);
    next.replica = 2;
    let mut h = history(vec![owner, next]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 5_001)];
    let freeze = |replica, start_ms, end_ms| Fault {
        kind: FaultKind::Pause,
        replica: Some(replica),
        start_ms,
        end_ms,
        detail: None,
    };
    h.faults.push(freeze(1, 1_200, 4_990));
    // Replicas on a networked store: another replica's freeze stalls
    // nobody else's writes.
    assert_eq!(check(&h, &log).count(Invariant::I2), 1);
    h.shared_file = true;
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.held, report.excused), (1, 0), "{report:?}");
    // A freeze shorter than half the lease (1.5 s) outlasts no lease.
    h.faults[0] = freeze(1, 3_600, 4_990);
    assert_eq!(check(&h, &log).count(Invariant::I2), 1);
    // The owner's answer was final: its loss is never excused.
    h.faults[0] = freeze(1, 1_200, 4_990);
    h.ops[0].answer.complete = true;
    assert_eq!(check(&h, &log).count(Invariant::I2), 1);
}

/// Request 1's execution was in flight on replica 0 when a forget deleted
/// the key; its result was then held in memory through a store restart.
/// A held result is its owner's alone: a replay of it from memory, marked
/// replayed, is an answer the store never held, and no outage excuses it.
#[test]
fn a_held_copy_replayed_in_a_store_outage_is_a_violation() {
    let mut owner = op(1, "plain", 1_000, 1, "", false);
    owner.answer = Answer {
        error: Some("client timeout".into()),
        ..Answer::default()
    };
    let held = op(2, "plain", 4_000, 1, "A", true);
    let fresh = op(3, "plain", 6_000, 2, "B", false);
    let mut read = op(4, "plain", 9_000, 2, "B", true);
    read.final_read = true;
    let mut h = history(vec![owner, held, fresh, read]);
    h.forgets.push(Forget {
        key: key("plain"),
        replica: 1,
        invoke_ms: 1_500,
        complete_ms: 2_500,
        status: Some(200),
    });
    let log = [execution(1, 1, 1_001), execution(2, 3, 6_001)];
    h.faults.push(Fault {
        kind: FaultKind::StoreRestart,
        replica: None,
        start_ms: 3_000,
        end_ms: 4_500,
        detail: None,
    });
    let report = check(&h, &log);
    assert!(report.count(Invariant::I1) >= 1, "{report:?}");
    assert!(report.count(Invariant::I5) >= 1, "{report:?}");
    assert_eq!(report.held, 0, "{report:?}");
}

#[test]
fn i2_does_not_apply_to_routes_that_do_not_charge() {
    let mut cut = op(1, "plain", 1_000, 1, "", false);
    cut.answer = Answer::default();
    let h = history(vec![cut, op(2, "plain", 3_000, 2, "B", false)]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 3_001)];
    assert!(check(&h, &log).is_clean());
}

#[test]
fn i1_a_forget_that_never_returned_still_ends_the_epoch() {
    // The forget's replica was killed before it answered: the delete may
    // have landed, and a replica may still answer from its copy for a
    // second after it.
    let mut h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 2_200, 2, "B", false),
        op(3, "plain", 2_500, 1, "A", true),
    ]);
    h.forgets.push(Forget {
        key: key("plain"),
        replica: 1,
        invoke_ms: 2_000,
        complete_ms: 2_030,
        status: None,
    });
    h.faults.push(Fault {
        kind: FaultKind::Kill,
        replica: Some(1),
        start_ms: 2_020,
        end_ms: 2_600,
        detail: None,
    });
    let log = [execution(1, 1, 1_001), execution(2, 2, 2_201)];
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    // Answered, the same forget's window ends when it returned.
    h.forgets[0].status = Some(200);
    h.forgets[0].complete_ms = 2_100;
    let report = check(&h, &log);
    assert!(report.count(Invariant::I1) >= 1, "{report:?}");
}

#[test]
fn i1_an_answer_marked_not_stored_is_not_the_keys_answer() {
    // Request 1 got its result although the store never took it (the
    // lease ran out during a store outage): `Idempotent-Stored: false`.
    // The key was released, and request 2 ran the work again.
    let mut unstored = op(1, "plain", 1_000, 1, "A", false);
    unstored.answer.stored = Some(false);
    let h = history(vec![unstored, op(2, "plain", 2_000, 2, "B", false)]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 2_001)];
    let report = check(&h, &log);
    assert!(report.is_clean(), "{report:?}");
    // The same history without the mark: request 1's answer was final,
    // and a second execution and other bytes followed it.
    let h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 2_000, 2, "B", false),
    ]);
    let report = check(&h, &log);
    assert!(report.count(Invariant::I1) >= 1, "{report:?}");
}
