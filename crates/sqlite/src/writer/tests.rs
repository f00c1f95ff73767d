#![allow(clippy::unwrap_used)]

use super::*;
use idemgate_testkit::executed;

fn owner() -> Owner {
    Owner {
        id: "k".into(),
        token: 1,
        fence: 1,
    }
}

fn claim() -> Op {
    Op::Claim {
        id: "k".into(),
        fingerprint: [0; 32],
        token: 1,
        ttl_ms: 1,
        reply: oneshot::channel().0,
    }
}

fn complete() -> Op {
    Op::Complete {
        owner: owner(),
        payload: Bytes::new(),
        ttl_ms: 1,
        attempt: executed(),
        reply: oneshot::channel().0,
    }
}

fn durability(headroom: i64) -> Durability {
    Durability {
        synced: true,
        headroom,
        commits: Arc::default(),
    }
}

#[test]
fn claims_within_the_fence_ceiling_are_not_synced() {
    assert!(!durability(10).wanted(&[claim(), claim()]));
    let renew = Op::Renew {
        owner: owner(),
        ttl_ms: 1,
        reply: oneshot::channel().0,
    };
    let release = Op::Release {
        owner: owner(),
        attempt: executed(),
        ttl_ms: 1,
        reply: oneshot::channel().0,
    };
    let entry = Op::Attempt {
        id: "k".into(),
        attempt: executed(),
        ttl_ms: 1,
    };
    assert!(!durability(10).wanted(&[renew, release, entry]));
}

#[test]
fn a_batch_with_a_result_or_a_forget_is_synced() {
    assert!(durability(10).wanted(&[claim(), complete(), claim()]));
    let forget = Op::Forget {
        id: "k".into(),
        attempt: executed(),
        ttl_ms: 1,
        reply: oneshot::channel().0,
    };
    assert!(durability(10).wanted(&[forget]));
}

#[test]
fn claims_past_the_fence_ceiling_are_synced() {
    assert!(durability(1).wanted(&[claim(), claim()]));
    assert!(durability(0).wanted(&[claim()]));
}
