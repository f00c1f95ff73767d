//! One history per invariant that breaks it, and one that keeps it: I3 to
//! I6 here, I1 and I2 with their excuse windows in `tests/once.rs`.

#![allow(clippy::unwrap_used)]

use idemgate_llm_sim::Execution;

mod once;

use super::{Invariant, check};
use crate::history::{Answer, EventSeen, History, KeyId, Op};

const BODY: &str = "b0";

pub(super) fn key(route: &str) -> KeyId {
    KeyId {
        credential: "Bearer t1".into(),
        route: route.into(),
        key: "k1".into(),
    }
}

pub(super) fn history(ops: Vec<Op>) -> History {
    History {
        ops,
        charging_routes: vec!["charged".into()],
        pending_ttl_ms: 3_000,
        settle_bound_ms: 20_000,
        quiet_ms: 100_000,
        ..History::default()
    }
}

/// A complete JSON answer naming execution `exec`, whose bytes are
/// `bytes`.
pub(super) fn op(id: u64, route: &str, at: u64, exec: u64, bytes: &str, replayed: bool) -> Op {
    Op {
        id,
        key: key(route),
        body_sha256: BODY.into(),
        stream: false,
        replica: 0,
        last_event_id: None,
        last_event_run: None,
        resumes: None,
        upstream_fault: None,
        timeout_ms: 10_000,
        invoke_ms: at,
        complete_ms: at + 10,
        answer: Answer {
            status: Some(200),
            replayed: Some(replayed),
            complete: true,
            body_sha256: bytes.into(),
            executions: vec![exec],
            ..Answer::default()
        },
        final_read: false,
    }
}

pub(super) fn execution(sequence: u64, op: u64, at: u64) -> Execution {
    Execution {
        sequence,
        key: "k1".into(),
        credential: "Bearer t1".into(),
        body_sha256: BODY.into(),
        started_ms: at,
        tag: op.to_string(),
    }
}

pub(super) fn only(h: &History, log: &[Execution], invariant: Invariant) -> usize {
    let report = check(h, log);
    for v in &report.violations {
        assert_eq!(
            v.invariant, invariant,
            "only {invariant} is broken here: {v:?}"
        );
    }
    report.count(invariant)
}

#[test]
fn i3_clean_answers_name_their_own_executions() {
    let h = history(vec![op(1, "plain", 1_000, 1, "A", false)]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
}

#[test]
fn i3_an_answer_of_another_tenant_or_fingerprint_is_caught() {
    let h = history(vec![op(1, "plain", 1_000, 7, "A", false)]);
    let mut other_tenant = execution(7, 1, 1_001);
    other_tenant.credential = "Bearer t2".into();
    assert_eq!(only(&h, &[other_tenant], Invariant::I3), 1);
    let mut other_body = execution(7, 1, 1_001);
    other_body.body_sha256 = "b1".into();
    assert_eq!(only(&h, &[other_body], Invariant::I3), 1);
    assert_eq!(
        only(&h, &[], Invariant::I3),
        1,
        "an execution that never ran"
    );
}

fn event(id: u64, exec: u64) -> EventSeen {
    EventSeen {
        id: Some(id),
        run: Some(exec),
        sha256: format!("e{exec}-{id}"),
        execution: Some(exec),
    }
}

/// A stream of `ids` events of execution `exec`, cut or whole.
fn stream(id: u64, at: u64, exec: u64, ids: std::ops::RangeInclusive<u64>, whole: bool) -> Op {
    let mut o = op(id, "plain", at, exec, "S", false);
    o.stream = true;
    o.answer.complete = whole;
    o.answer.events = ids.map(|i| event(i, exec)).collect();
    o
}

#[test]
fn i4_clean_a_resumption_continues_the_same_run() {
    let first = stream(1, 1_000, 1, 1..=3, false);
    let mut resumed = stream(2, 2_000, 1, 4..=6, true);
    resumed.answer.replayed = Some(true);
    resumed.last_event_id = Some(3);
    resumed.resumes = Some(1);
    let h = history(vec![first, resumed]);
    let report = check(&h, &[execution(1, 1, 1_001)]);
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn i4_a_resumption_that_splices_two_runs_is_caught() {
    let first = stream(1, 1_000, 1, 1..=3, false);
    let mut resumed = stream(2, 2_000, 2, 4..=6, true);
    resumed.last_event_id = Some(3);
    resumed.resumes = Some(1);
    let h = history(vec![first, resumed]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 2_001)];
    assert_eq!(only(&h, &log, Invariant::I4), 1);
}

#[test]
fn i4_clean_another_runs_stream_sent_whole_and_marked_restarted() {
    let first = stream(1, 1_000, 1, 1..=3, false);
    let mut resumed = stream(2, 2_000, 2, 1..=6, true);
    resumed.answer.restarted = true;
    resumed.last_event_id = Some(3);
    resumed.resumes = Some(1);
    let h = history(vec![first, resumed]);
    let log = [execution(1, 1, 1_001), execution(2, 2, 2_001)];
    assert_eq!(only(&h, &log, Invariant::I4), 0);
}

#[test]
fn i4_a_gap_is_caught() {
    let first = stream(1, 1_000, 1, 1..=3, false);
    let mut resumed = stream(2, 2_000, 1, 5..=6, true);
    resumed.answer.replayed = Some(true);
    resumed.last_event_id = Some(3);
    resumed.resumes = Some(1);
    let h = history(vec![first, resumed]);
    assert_eq!(only(&h, &[execution(1, 1, 1_001)], Invariant::I4), 1);
}

#[test]
fn i5_clean_a_replay_is_the_stored_answer() {
    let mut read = op(3, "plain", 100_500, 1, "A", true);
    read.final_read = true;
    let h = history(vec![
        op(1, "plain", 1_000, 1, "A", false),
        op(2, "plain", 2_000, 1, "A", true),
        read,
    ]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
}

#[test]
fn i5_a_replayed_answer_the_store_never_held_is_caught() {
    // A follower was told "replayed" for execution 1, whose owner was
    // fenced: execution 2's answer is the one stored, and the final read
    // replays it. Nobody else got a final answer: only I5 sees it.
    let follower = op(2, "plain", 2_000, 1, "A", true);
    let mut taken_over = op(4, "plain", 2_500, 2, "", false);
    taken_over.answer = Answer {
        error: Some("client timeout".into()),
        ..Answer::default()
    };
    let mut read = op(3, "plain", 100_500, 2, "B", true);
    read.final_read = true;
    let h = history(vec![follower, taken_over, read]);
    let log = [execution(1, 2, 1_001), execution(2, 4, 2_501)];
    // The final read's answer differs from the follower's: I1 sees the
    // two final answers differ as well.
    let report = check(&h, &log);
    assert!(report.count(Invariant::I5) >= 1, "{report:?}");

    // Stored nothing: the final read runs the work afresh.
    let follower = op(2, "plain", 2_000, 1, "A", true);
    let mut read = op(3, "plain", 100_500, 3, "C", false);
    read.final_read = true;
    let h = history(vec![follower, read]);
    let log = [execution(1, 2, 1_001), execution(3, 3, 100_501)];
    let report = check(&h, &log);
    assert!(report.count(Invariant::I5) >= 1, "{report:?}");
}

#[test]
fn i6_clean_every_key_answered_after_the_faults() {
    let mut read = op(2, "plain", 100_500, 1, "A", true);
    read.final_read = true;
    let h = history(vec![op(1, "plain", 1_000, 1, "A", false), read]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
}

#[test]
fn i6_a_key_still_in_flight_past_the_bound_is_caught() {
    let mut stuck = op(2, "plain", 100_500, 0, "", false);
    stuck.final_read = true;
    stuck.answer = Answer {
        status: Some(409),
        problem: Some("in-flight".into()),
        complete: true,
        ..Answer::default()
    };
    let mut late = stuck.clone();
    late.id = 3;
    late.invoke_ms = 130_000;
    late.complete_ms = 130_010;
    let h = history(vec![stuck, late]);
    assert_eq!(only(&h, &[], Invariant::I6), 1);
}

/// The harness reached the key only after the deadline: answered by its
/// first read, it kept the promise; refused then, it did not, whatever a
/// later read got. A read sent before the deadline counts when it got
/// the answer, even after it.
#[test]
fn i6_a_key_first_read_after_the_bound_is_judged_by_that_read() {
    let mut late = op(2, "plain", 140_000, 1, "A", true);
    late.final_read = true;
    let h = history(vec![op(1, "plain", 1_000, 1, "A", false), late.clone()]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
    // Sent just before the deadline (128 s), answered just after it.
    let mut straddling = late.clone();
    straddling.invoke_ms = 127_900;
    straddling.complete_ms = 128_300;
    let h = history(vec![op(1, "plain", 1_000, 1, "A", false), straddling]);
    assert!(check(&h, &[execution(1, 1, 1_001)]).is_clean());
    let mut refused = late.clone();
    refused.answer = Answer {
        status: Some(409),
        problem: Some("in-flight".into()),
        complete: true,
        ..Answer::default()
    };
    late.id = 3;
    late.invoke_ms = 141_000;
    late.complete_ms = 141_010;
    let h = history(vec![op(1, "plain", 1_000, 1, "A", false), refused, late]);
    assert_eq!(only(&h, &[execution(1, 1, 1_001)], Invariant::I6), 1);
}
