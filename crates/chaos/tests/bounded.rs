//! Bounded chaos runs, for CI: three `idemgate serve` replicas on one
//! SQLite file, on a private Redis master with its replica, and on a
//! private PostgreSQL primary with its synchronous standby, about 40 s of
//! random requests and faults each, then the checker. On the two private
//! stores the nemesis also restarts the store, fails it over (the replica
//! promoted), drops replies the store applied, and steps the replicas'
//! wall clocks. A fourth run breaks the deployment on purpose (the
//! charging routes configured `charges = false`) and expects the checker
//! to say so.
//!
//! The binaries are the workspace's `target/debug/idemgate` and
//! `idemgate-llm-sim` (`scripts/test` builds them first; or set
//! `IDEMGATE_BIN` and `IDEMGATE_LLM_SIM_BIN`). Without them, without
//! `redis-server`, PostgreSQL's server binaries or libfaketime
//! (scripts/setup.sh installs them), the suite fails; it never skips.
//!
//! Every invariant must hold, I1 to I6; results released by a store
//! outage past the lease are counted apart (`released`), as the checker
//! states.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use idemgate_chaos::cluster::Binaries;
use idemgate_chaos::history::FaultKind;
use idemgate_chaos::{Broken, Invariant, Outcome, RunConfig, Store};

fn binaries() -> Binaries {
    match Binaries::locate() {
        Ok(b) => b,
        Err(e) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            panic!(
                "{e}{}",
                if ci {
                    " (under CI: scripts/test builds them before the tests)"
                } else {
                    ""
                }
            )
        }
    }
}

fn config(store: Store, seed: u64) -> RunConfig {
    RunConfig {
        store: store.clone(),
        replicas: 3,
        duration: Duration::from_secs(40),
        max_ops: Some(2_500),
        clients: 6,
        keys_per_route: 4,
        upstream_cuts: 0.05,
        seed,
        faults: store.default_faults(),
        broken: None,
        binaries: binaries(),
        dir: None,
    }
}

async fn run(cfg: RunConfig) -> Outcome {
    let outcome = idemgate_chaos::run(&cfg).await.expect("the run completes");
    println!("{}", outcome.summary());
    for v in &outcome.report.violations {
        println!("violation {}: {:?}: {}", v.invariant, v.key, v.detail);
    }
    println!("files in {}", outcome.dir.display());
    outcome
}

fn keeps_the_promise(outcome: &Outcome) {
    assert!(
        outcome.history.ops.len() > 100,
        "the run did something: {}",
        outcome.summary()
    );
    assert!(!outcome.history.faults.is_empty(), "faults were injected");
    for i in [
        Invariant::I1,
        Invariant::I2,
        Invariant::I3,
        Invariant::I4,
        Invariant::I5,
        Invariant::I6,
    ] {
        assert_eq!(outcome.report.count(i), 0, "{i}: {}", outcome.summary());
    }
    assert_eq!(outcome.report.unattributed, 0, "every execution traced");
    // A run that kept the promise leaves nothing to look at.
    let _ = std::fs::remove_dir_all(&outcome.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replicas_keep_the_promise_under_faults() {
    let outcome = run(config(Store::Sqlite, 27)).await;
    keeps_the_promise(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_keep_the_promise_under_faults_and_failovers() {
    let outcome = run(config(Store::Redis, 28)).await;
    store_faults_were_injected(&outcome);
    keeps_the_promise(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_keep_the_promise_under_faults_and_failovers() {
    let outcome = run(config(Store::Postgres, 30)).await;
    store_faults_were_injected(&outcome);
    keeps_the_promise(&outcome);
}

/// The fixed random choices of these runs put store faults early: the
/// run is not only about the replicas.
fn store_faults_were_injected(outcome: &Outcome) {
    assert!(
        outcome.history.faults.iter().any(|f| f.kind.on_store()),
        "a store fault was injected: {}",
        outcome.summary()
    );
}

/// Charging routes deployed without `charges = true`: a cut after sending
/// (an upstream cut, a rolling restart) releases the key, and the retry
/// charges again. The checker must see I2 broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_turned_off_is_caught_as_a_double_charge() {
    let mut cfg = config(Store::Sqlite, 29);
    cfg.broken = Some(Broken::ChargesOff);
    cfg.duration = Duration::from_secs(25);
    cfg.upstream_cuts = 0.3;
    cfg.faults = vec![FaultKind::Terminate];
    let outcome = run(cfg).await;
    assert!(
        outcome.report.count(Invariant::I2) > 0,
        "the double charges are found: {}",
        outcome.summary()
    );
    let _ = std::fs::remove_dir_all(&outcome.dir);
}
