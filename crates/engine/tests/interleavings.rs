//! Randomized interleavings of claim / renew / complete / release / expiry on
//! the in-memory store, checked against a model.
//!
//! The safety property: while an owner's lease is valid (by the expiry its own
//! `Lease` reports), no other caller acquires the key — so the work never runs
//! twice for one key while a lease is valid — and a stale owner's writes are
//! refused. Time is a [`ManualClock`] stepped by the test, so expiry is an
//! explicit operation in the interleaving rather than a race with a real clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::backend::ManualClock;
use idemgate_engine::{
    Claim, ClientKey, Fenced, Fingerprint, Lease, MemoryStore, RecordState, ScopedKey, Store,
};
use idemgate_testkit::executed;
use proptest::prelude::*;

const ACTORS: usize = 4;
const PENDING_TTL: Duration = Duration::from_millis(1000);
const DONE_TTL: Duration = Duration::from_millis(3000);

#[derive(Clone, Debug)]
enum Op {
    Claim(usize),
    Renew(usize),
    Complete(usize),
    Release(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..ACTORS).prop_map(Op::Claim),
        2 => (0..ACTORS).prop_map(Op::Renew),
        2 => (0..ACTORS).prop_map(Op::Complete),
        1 => (0..ACTORS).prop_map(Op::Release),
        2 => (0u64..1600).prop_map(Op::Advance),
    ]
}

/// What the model says the store holds.
#[derive(Clone, Debug, PartialEq)]
enum Model {
    Absent,
    Pending { token: u128, expires: u64 },
    Done { by: usize, expires: u64 },
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    // Built outside the runtime: no background purge, so every change of
    // state is one of the test's operations.
    let store = MemoryStore::with_clock(clock.clone());
    let key = ScopedKey::new(
        "t",
        "n",
        ClientKey::parse("k").map_err(|e| TestCaseError::fail(e.to_string()))?,
    );
    let fp = Fingerprint::of_request("POST", "/", b"{}", &[]);
    let mut model = Model::Absent;
    let mut leases: [Option<Lease>; ACTORS] = Default::default();
    let mut executions_started = 0u32;

    rt.block_on(async {
        for op in ops {
            let now = idemgate_engine::backend::Clock::now_ms(&*clock);
            match op {
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Op::Claim(a) => {
                    let claim = store.claim(&key, &fp, PENDING_TTL).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let live = match model {
                        Model::Pending { expires, .. } | Model::Done { expires, .. } => expires > now,
                        Model::Absent => false,
                    };
                    match claim {
                        Claim::Acquired(lease) => {
                            prop_assert!(!live, "acquired a live key: model {model:?}");
                            for (b, other) in leases.iter().enumerate() {
                                if let Some(l) = other.as_ref().filter(|_| b != a) {
                                    prop_assert!(
                                        l.expires_at_ms <= now,
                                        "actor {a} acquired while actor {b}'s lease is valid until {} (now {now})",
                                        l.expires_at_ms
                                    );
                                }
                            }
                            executions_started += 1;
                            model = Model::Pending { token: lease.token, expires: lease.expires_at_ms };
                            leases[a] = Some(lease);
                        }
                        Claim::Existing(rec) => {
                            prop_assert!(live, "existing returned for a non-live key: {rec:?}");
                            match (&model, &rec.state) {
                                (Model::Pending { .. }, RecordState::Pending { .. }) => {}
                                (Model::Done { by, .. }, RecordState::Done { payload, .. }) => {
                                    prop_assert_eq!(payload.to_vec(), format!("by-{by}").into_bytes());
                                }
                                (m, s) => prop_assert!(false, "model {m:?} vs store {s:?}"),
                            }
                        }
                    }
                }
                Op::Renew(a) => {
                    let Some(lease) = leases[a].as_mut() else { continue };
                    let w = store.renew(lease, PENDING_TTL).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let owner = matches!(model, Model::Pending { token, .. } if token == lease.token);
                    prop_assert_eq!(w == Fenced::Applied, owner);
                    if owner {
                        model = Model::Pending { token: lease.token, expires: lease.expires_at_ms };
                    } else {
                        leases[a] = None;
                    }
                }
                Op::Complete(a) => {
                    let Some(lease) = leases[a].take() else { continue };
                    let payload = Bytes::from(format!("by-{a}"));
                    let w = store.complete(&lease, payload, DONE_TTL, &executed()).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let owner = matches!(model, Model::Pending { token, .. } if token == lease.token);
                    prop_assert_eq!(w == Fenced::Applied, owner, "complete by actor {} (model {:?})", a, model);
                    if owner {
                        model = Model::Done { by: a, expires: now + DONE_TTL.as_millis() as u64 };
                    }
                }
                Op::Release(a) => {
                    let Some(lease) = leases[a].take() else { continue };
                    let w = store.release(&lease, &executed(), DONE_TTL).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let owner = matches!(model, Model::Pending { token, .. } if token == lease.token);
                    prop_assert_eq!(w == Fenced::Applied, owner);
                    if owner {
                        model = Model::Absent;
                    }
                }
            }
            // After every step the store's visible record matches the model.
            let now = idemgate_engine::backend::Clock::now_ms(&*clock);
            let got = store.get(&key).await.map_err(|e| TestCaseError::fail(e.to_string()))?;
            match (&model, got) {
                (Model::Pending { expires, .. }, Some(r)) if *expires > now => {
                    let pending = matches!(r.state, RecordState::Pending { .. });
                    prop_assert!(pending, "store record is not pending");
                }
                (Model::Done { expires, .. }, Some(r)) if *expires > now => prop_assert!(r.is_done()),
                (Model::Pending { expires, .. } | Model::Done { expires, .. }, None) if *expires <= now => {}
                (Model::Absent, None) => {}
                (m, g) => prop_assert!(false, "model {m:?} but store shows {g:?}"),
            }
        }
        prop_assert!(executions_started <= 64);
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn no_key_executes_twice_while_its_lease_is_valid(ops in prop::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
