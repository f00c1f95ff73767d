//! Store scenarios under injected faults, run by every networked store
//! through [`fault_suite!`](crate::fault_suite).
//!
//! Each scenario gets a [`Rig`]: a store whose connections go through a
//! fresh [`FaultProxy`], and a second store on the same server and
//! keyspace that bypasses the proxy, to see what the server really holds.
//! Scenarios assert on behaviour — which calls fail, whether errors are
//! temporary, what the record and its timeline hold — never on how long
//! anything takes; "recovers" means within [`RECOVERY`] of retries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    AttemptOutcome, Engine, Fenced, Lease, Record, RecordState, ScopedKey, Store, StoreError,
};

use super::FaultProxy;
use crate::{PAST_SHORT_TTL, SHORT_TTL, acquired, eventually, executed, existing, fp, fresh_key};

/// How long a store may keep failing with temporary errors after a fault
/// is healed before a scenario calls it broken.
pub const RECOVERY: Duration = Duration::from_secs(6);
/// A lease long enough to outlast every outage a scenario injects.
const LEASE: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(300);

/// A store behind a fault proxy, and a direct handle on the same data.
pub struct Rig {
    /// The proxy every connection of `store` goes through.
    pub proxy: FaultProxy,
    /// The store under test: its URL points at the proxy. Give it the
    /// backend's usual reconnecting client, and a single connection where
    /// the backend pools them (so that warming it up prepares everything
    /// the scenario sends while replies are held).
    pub store: Arc<dyn Store>,
    /// The same server and keyspace (prefix, schema), without the proxy.
    pub direct: Arc<dyn Store>,
    /// Whether `store` has nothing of its own in flight on its
    /// connections — e.g. a pool checking a connection it just got back.
    /// Scenarios that hold the next request's reply wait for it first,
    /// so that the held request is theirs. `None`: always quiet.
    pub quiet: Option<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("proxy", &self.proxy)
            .field("store", &self.store)
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

/// Waits until the store has nothing of its own in flight.
async fn settle(rig: &Rig) {
    if let Some(quiet) = &rig.quiet {
        let settled = eventually(|| {
            let q = quiet();
            async move { q }
        })
        .await;
        assert!(settled, "the store never went quiet");
    }
}

/// Whether the server's record of `key`, read past the proxy, comes to
/// satisfy `pred` (polled as [`eventually`] does).
async fn server_record_comes_to(
    rig: &Rig,
    key: &ScopedKey,
    pred: impl Fn(Option<&Record>) -> bool,
) -> bool {
    let pred = &pred;
    eventually(|| async move { rig.direct.get(key).await.is_ok_and(|r| pred(r.as_ref())) }).await
}

/// Holds the reply to the store's next request (see
/// [`FaultProxy::stall_replies_from_next_request`]) once the store is
/// quiet.
async fn hold_next_reply(rig: &Rig) {
    settle(rig).await;
    rig.proxy.stall_replies_from_next_request();
}

/// Sends `call` with its reply held: once the server's record of `key`
/// comes to satisfy `reached` (the request was applied), the connection is
/// cut and the proxy healed. Returns the call's error, which must be
/// temporary (`what` names the call).
async fn reply_lost<T: std::fmt::Debug + Send + 'static>(
    rig: &Rig,
    key: &ScopedKey,
    what: &str,
    reached: impl Fn(Option<&Record>) -> bool,
    call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> StoreError {
    hold_next_reply(rig).await;
    let first = tokio::spawn(call);
    let applied = server_record_comes_to(rig, key, reached).await;
    assert!(applied, "the stalled {what} never reached the server");
    assert!(rig.proxy.cut().await >= 1);
    rig.proxy.heal();
    let err = match first.await.expect("the call's task") {
        Ok(v) => panic!("a {what} whose reply was lost succeeded: {v:?}"),
        Err(e) => e,
    };
    assert!(err.is_temporary(), "{what} with a lost reply: {err}");
    err
}

/// Completes `lease` on `store` with `payload` as an executed attempt and
/// asserts that the write was applied (`when`: the step, should it fail).
async fn complete_applied(store: &dyn Store, lease: &Lease, payload: &'static [u8], when: &str) {
    let w = store
        .complete(lease, Bytes::from_static(payload), LONG, &executed())
        .await
        .expect(when);
    assert_eq!(w, Fenced::Applied, "{when}");
}

/// Runs `op` again while it fails with a temporary error; panics on any
/// other error, or when it still fails after [`RECOVERY`]. Returns the
/// value and how many temporary errors came first.
pub async fn until_ok<T, F, Fut>(what: &str, mut op: F) -> (T, usize)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + RECOVERY;
    let mut failures = 0;
    loop {
        match op().await {
            Ok(v) => return (v, failures),
            Err(e) if e.is_temporary() => {
                failures += 1;
                assert!(
                    Instant::now() < deadline,
                    "{what}: still failing after {failures} tries: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: failed with a non-temporary error: {e}"),
        }
    }
}

/// Runs every kind of operation once through the proxy, so that scripts
/// are loaded and statements prepared before faults are injected.
async fn warm_up(rig: &Rig) {
    let key = fresh_key();
    let s = &rig.store;
    let mut lease = acquired(
        s.claim(&key, &fp("warm"), LONG)
            .await
            .expect("warm-up claim"),
    );
    let w = s.renew(&mut lease, LONG).await.expect("warm-up renew");
    assert_eq!(w, Fenced::Applied);
    complete_applied(s.as_ref(), &lease, b"w", "warm-up complete").await;
    existing(
        s.claim(&key, &fp("warm"), LONG)
            .await
            .expect("warm-up replay"),
    );
    s.get(&key).await.expect("warm-up get");
    let other = fresh_key();
    let lease = acquired(
        s.claim(&other, &fp("warm"), LONG)
            .await
            .expect("warm-up claim"),
    );
    let w = s
        .release(&lease, &executed(), LONG)
        .await
        .expect("warm-up release");
    assert_eq!(w, Fenced::Applied);
    assert!(
        rig.proxy.stats().live >= 1,
        "the store does not use the proxy"
    );
}

/// The payload of the DONE record at `key` (seen without the proxy) and
/// how many `Executed` attempts its timeline holds.
async fn done_once(rig: &Rig, key: &ScopedKey) -> (Bytes, usize) {
    let rec = rig
        .direct
        .get(key)
        .await
        .expect("direct get")
        .expect("a record");
    let payload = rec.payload().cloned().expect("a DONE record");
    let executed = rig
        .direct
        .timeline(key)
        .await
        .expect("direct timeline")
        .iter()
        .filter(|a| a.outcome == AttemptOutcome::Executed)
        .count();
    (payload, executed)
}

fn assert_pending(rec: &Record, lease: &Lease) {
    assert!(
        matches!(rec.state, RecordState::Pending { fence, .. } if fence == lease.fence),
        "expected PENDING under fence {}, got {rec:?}",
        lease.fence
    );
}

/// (1) Claims while the server cannot be reached fail with temporary
/// errors and write nothing; once it is back, the same store handle
/// reconnects by itself and works.
pub async fn claim_refused_then_recovers(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let fa = fp("a");
    rig.proxy.set_refusing(true);
    assert!(rig.proxy.cut().await >= 1, "no live connection to cut");
    for i in 0..3 {
        let err = rig
            .store
            .claim(&key, &fp("a"), LONG)
            .await
            .expect_err("a claim through a refusing proxy succeeded");
        assert!(err.is_temporary(), "claim #{i} while refused: {err}");
    }
    assert_eq!(rig.direct.get(&key).await.expect("direct get"), None);
    rig.proxy.set_refusing(false);
    let (claim, failures) =
        until_ok("claim after recovery", || rig.store.claim(&key, &fa, LONG)).await;
    let lease = acquired(claim);
    eprintln!("claim after recovery: {failures} temporary errors first");
    complete_applied(
        rig.store.as_ref(),
        &lease,
        b"back",
        "complete once reconnected",
    )
    .await;
    assert_eq!(
        done_once(&rig, &key).await,
        (Bytes::from_static(b"back"), 1)
    );
}

/// (2) The connection is cut between claim and complete, and the server
/// stays unreachable for a while: the lease survives (the record stays
/// PENDING under it), and complete with the original lease succeeds once
/// the server is back, exactly once. A replay after another cut returns
/// the stored result.
pub async fn cut_between_claim_and_complete(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let fa = fp("a");
    let executed = crate::executed();
    let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
    rig.proxy.set_refusing(true);
    assert!(rig.proxy.cut().await >= 1);
    let payload = Bytes::from_static(b"{\"charged\":1}");
    let err = rig
        .store
        .complete(&lease, payload.clone(), LONG, &crate::executed())
        .await
        .expect_err("a complete through a refusing proxy succeeded");
    assert!(err.is_temporary(), "complete while refused: {err}");
    let rec = rig.direct.get(&key).await.expect("direct get");
    assert_pending(&rec.expect("the record survives the outage"), &lease);
    rig.proxy.set_refusing(false);
    let (w, _) = until_ok("complete after recovery", || {
        rig.store.complete(&lease, payload.clone(), LONG, &executed)
    })
    .await;
    assert_eq!(w, Fenced::Applied, "the original lease was lost");
    assert_eq!(done_once(&rig, &key).await, (payload.clone(), 1));
    // Replay, on a fresh connection.
    assert!(rig.proxy.cut().await >= 1);
    let (claim, _) = until_ok("replay after a cut", || rig.store.claim(&key, &fa, LONG)).await;
    assert_eq!(existing(claim).payload(), Some(&payload));
    assert_eq!(done_once(&rig, &key).await, (payload, 1));
}

/// (3) A complete reaches the server and is applied, but its reply is
/// lost (replies stalled, then the connection cut). The caller saw a
/// temporary error, so it retries with the same lease and payload: the
/// retry must be idempotent — acknowledged as applied, the record DONE
/// once with the first payload, one `Executed` attempt — not `Stale`,
/// which would tell the caller that another owner took over.
pub async fn complete_reply_lost_retry_is_idempotent(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let executed = crate::executed();
    let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
    let payload = Bytes::from_static(b"{\"charged\":1}");
    let first = {
        let (store, lease, payload, executed) = (
            Arc::clone(&rig.store),
            lease.clone(),
            payload.clone(),
            executed.clone(),
        );
        async move { store.complete(&lease, payload, LONG, &executed).await }
    };
    let done = |r: Option<&Record>| r.is_some_and(Record::is_done);
    reply_lost(&rig, &key, "complete", done, first).await;
    let (retry, _) = until_ok("complete retried after a lost reply", || {
        rig.store.complete(&lease, payload.clone(), LONG, &executed)
    })
    .await;
    assert_eq!(done_once(&rig, &key).await, (payload, 1));
    assert_eq!(
        retry,
        Fenced::Applied,
        "retrying an applied complete with its own lease and payload must be \
         acknowledged, not reported as fenced by another owner"
    );
}

/// A caller stops waiting while its claim's reply is held: the claim
/// reached the server (the key is PENDING), but its owner never learned
/// it had the key. The engine must see the claim through once the reply
/// comes and give the key back, not leave it PENDING (holding or refusing
/// every retry) until its 30 s lease runs out.
pub async fn caller_gone_while_its_claim_is_on_the_wire(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let engine = Engine::new(Arc::clone(&rig.store));
    hold_next_reply(&rig).await;
    let caller = {
        let (engine, key) = (engine.clone(), key.clone());
        tokio::spawn(async move { engine.begin(&key, &fp("a")).await.is_ok() })
    };
    let claimed = server_record_comes_to(&rig, &key, |r| r.is_some_and(|r| !r.is_done())).await;
    assert!(claimed, "the held claim never reached the server");
    caller.abort();
    assert!(
        caller
            .await
            .expect_err("the caller was aborted")
            .is_cancelled(),
        "the caller finished although its claim's reply was held"
    );
    rig.proxy.heal();
    let released = server_record_comes_to(&rig, &key, |r| r.is_none()).await;
    assert!(
        released,
        "a claim whose caller was gone stayed PENDING until its lease expired"
    );
}

/// (4) Heartbeats fail while the server is unreachable (connections
/// reset, new ones refused), for less than the lease: meanwhile nobody
/// else can take the key, and once the server is back the heartbeat
/// renews the same lease and the owner completes.
pub async fn heartbeat_outage_within_the_lease(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let mut lease = acquired(
        rig.store
            .claim(&key, &fp("hb"), LEASE)
            .await
            .expect("claim"),
    );
    let first_expiry = lease.expires_at_ms;
    rig.proxy.set_refusing(true);
    assert!(rig.proxy.reset().await >= 1);
    for i in 0..3 {
        let mut l = lease.clone();
        let err = rig
            .store
            .renew(&mut l, LEASE)
            .await
            .expect_err("a renew through a refusing proxy succeeded");
        assert!(err.is_temporary(), "renew #{i} during the outage: {err}");
        assert_eq!(l, lease, "a failed renew changed the lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Another replica, unaffected by the outage, finds the key held.
    let rec = existing(
        rig.direct
            .claim(&key, &fp("hb"), LEASE)
            .await
            .expect("direct claim"),
    );
    assert_pending(&rec, &lease);
    rig.proxy.set_refusing(false);
    let ((w, renewed), _) = until_ok("renew after the outage", || {
        let (store, mut l) = (Arc::clone(&rig.store), lease.clone());
        async move {
            let w = store.renew(&mut l, LEASE).await?;
            Ok((w, l))
        }
    })
    .await;
    assert_eq!(w, Fenced::Applied, "the lease was lost during the outage");
    lease = renewed;
    assert!(lease.expires_at_ms > first_expiry, "renew did not extend");
    complete_applied(
        rig.store.as_ref(),
        &lease,
        b"hb",
        "complete after the outage",
    )
    .await;
    assert_eq!(done_once(&rig, &key).await, (Bytes::from_static(b"hb"), 1));
}

/// A claim's reply is lost: the retry (a new token) finds the key
/// PENDING under a lease nobody holds — by the `Store` contract it gets
/// `Existing` — and the key is free again once that lease expires.
pub async fn claim_reply_lost_blocks_until_lease_expiry(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let fa = fp("a");
    let first = {
        let (store, key) = (Arc::clone(&rig.store), key.clone());
        async move { store.claim(&key, &fp("a"), SHORT_TTL).await }
    };
    reply_lost(&rig, &key, "claim", |r| r.is_some(), first).await;
    let (retry, _) = until_ok("claim retried after a lost reply", || {
        rig.store.claim(&key, &fa, SHORT_TTL)
    })
    .await;
    let rec = existing(retry);
    assert!(matches!(rec.state, RecordState::Pending { .. }), "{rec:?}");
    tokio::time::sleep(PAST_SHORT_TTL).await;
    let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
    complete_applied(rig.store.as_ref(), &lease, b"late", "complete").await;
}

/// Every step of a record's life works, unchanged, over a slow link.
pub async fn slow_link_full_lifecycle(rig: Rig) {
    warm_up(&rig).await;
    rig.proxy.delay(Duration::from_millis(20));
    let key = fresh_key();
    let s = &rig.store;
    let mut lease = acquired(s.claim(&key, &fp("a"), LONG).await.expect("claim"));
    assert_eq!(
        s.renew(&mut lease, LONG).await.expect("renew"),
        Fenced::Applied
    );
    let payload = Bytes::from_static(b"slow");
    let w = s
        .complete(&lease, payload.clone(), LONG, &executed())
        .await
        .expect("complete");
    assert_eq!(w, Fenced::Applied);
    let rec = existing(s.claim(&key, &fp("a"), LONG).await.expect("replay"));
    assert_eq!(rec.payload(), Some(&payload));
    assert_eq!(done_once(&rig, &key).await, (payload, 1));
}

/// The store's connections go silent (frozen, never closed) while the
/// server itself is fine: after operations on them fail with temporary
/// errors, the store must stop using them and open new connections.
pub async fn frozen_connection_is_replaced(rig: Rig) {
    warm_up(&rig).await;
    let key = fresh_key();
    let fa = fp("a");
    settle(&rig).await;
    assert!(rig.proxy.freeze_live() >= 1);
    let (claim, failures) = until_ok("claim after the connection froze", || {
        rig.store.claim(&key, &fa, LONG)
    })
    .await;
    eprintln!("claim after a freeze: {failures} temporary errors first");
    let lease = acquired(claim);
    complete_applied(
        rig.store.as_ref(),
        &lease,
        b"thawed",
        "complete on a new connection",
    )
    .await;
}
