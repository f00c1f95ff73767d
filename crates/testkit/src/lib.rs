//! The store conformance suite: one set of behaviour tests every store runs.
//!
//! A store crate plugs in with one line in its tests:
//!
//! ```ignore
//! async fn make() -> std::sync::Arc<dyn idemgate_engine::Store> { /* ... */ }
//! idemgate_testkit::conformance_suite!(conformance_sqlite, make);
//! ```
//!
//! which generates `conformance_sqlite::<case>` tests. Each case uses its own
//! random tenant, so one store (one server) can serve every case at once.
//! The cases live in `cases/`; the build script generates the macro's case
//! list from them, so a new case cannot be left out of any store's run.
//! The suite is never edited to make a backend pass: a backend that fails a
//! case is wrong. Lease expiry cases sleep through real TTLs (a server's own
//! clock is involved), sized so a loaded machine does not flake them.
//!
//! [`tls`] makes the certificates of the suites that run over TLS: each
//! store runs the whole suite once more on a server of its own that only
//! speaks TLS.
//!
//! # Layout
//! - [`cases`]: the conformance cases, one function per behaviour.
//! - [`blinking`]: [`BlinkingStore`], a wrapper that fails completions
//!   and renewals on command (a store outage, a lost reply).
//! - [`counting`]: [`CountingStore`], a wrapper that counts store calls.
//! - `http` (feature `http`): the replay header of an answer, for the HTTP
//!   crates' tests.
//! - `execute_bench` (feature `bench`): the `Engine::execute` cases the
//!   engine's and the SQLite store's benches run.
//! - [`latency`]: the measuring loop and report of the networked stores'
//!   latency benches.
//! - [`fault`]: the [`FaultProxy`] (a TCP proxy that cuts, stalls and drops)
//!   and the store fault scenarios run through it.
//! - [`redis_server`]: private `redis-server` processes (single nodes,
//!   replicas, cluster nodes) for the suites that need their own.
//! - [`postgres_server`]: private PostgreSQL servers (`initdb` in a temporary
//!   directory) for the tests that restart one, count its statements or
//!   speak TLS to it.
//! - [`tls`]: certificates for the suites over TLS.
//! - [`stall`]: a watchdog that records stalls of the whole host, which
//!   freeze every process as a SIGSTOP freezes one.
//! - [`round_trips`]: the steps of the tests that count what a store sends
//!   to its server.
//!
//! The small values every store, engine, seal and telemetry test needs are
//! here too, defined once: [`key`], [`key_n`] and [`fresh_key`], [`fp`], [`attempt`]
//! and [`executed`], [`acquired`], [`eventually`], [`require`] and the
//! [`watchdog`] of a private server; [`closed_port`], [`assert_hidden`] and
//! [`assert_error_hides`] for the tests that a secret never shows.

#![allow(clippy::unwrap_used, clippy::panic)] // a test suite: failing loudly is its job

pub mod blinking;
pub mod counting;
#[cfg(feature = "bench")]
pub mod execute_bench;
pub mod fault;
#[cfg(feature = "http")]
pub mod http;
pub mod latency;
pub mod postgres_server;
pub mod redis_server;
pub mod round_trips;
pub mod stall;
pub use blinking::{BlinkingStore, Switches};
pub use counting::{Calls, CountingStore};
pub use fault::FaultProxy;
pub mod tls;

use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{AttemptOutcome, Claim, ClientKey, Fingerprint, Lease, ScopedKey};

/// Lease length in expiry cases: long enough that two back-to-back calls on a
/// loaded machine never straddle it.
pub const SHORT_TTL: Duration = Duration::from_millis(1000);
/// Sleep that outlasts [`SHORT_TTL`].
pub const PAST_SHORT_TTL: Duration = Duration::from_millis(1500);
pub(crate) const LONG: Duration = Duration::from_secs(300);

/// Fails loudly when a server a suite needs is missing. A suite never skips
/// silently: under CI that would hide a broken setup, and outside CI a
/// missing server is worth fixing (`scripts/services.sh` starts it).
pub fn require(what: &str, ok: bool) {
    if !ok {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        panic!(
            "{what} is not available{}: start it with `bash scripts/services.sh`",
            if ci { " under CI" } else { "" }
        );
    }
}

/// Sends `kill -SIGNAL` to process `pid` once this test process has exited
/// (panics and statics included: statics are never dropped), so that a
/// private server never outlives its test. Panics if the shell cannot be
/// started; [`try_watchdog`] reports it instead.
pub fn watchdog(pid: &str, signal: &str) {
    try_watchdog(pid, signal).expect("spawn a watchdog shell");
}

/// [`watchdog`], for a harness that reports errors rather than panics. The
/// watchdog shell ends by itself with either process and is deliberately
/// never waited for.
///
/// # Errors
/// The shell cannot be started.
pub fn try_watchdog(pid: &str, signal: &str) -> std::io::Result<()> {
    #[allow(clippy::zombie_processes)]
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -{signal} {pid} 2>/dev/null",
            me = std::process::id()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    Ok(())
}

/// A loopback port nothing listens on (bound, then released at once).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Fails if `shown` (what `what` shows) contains `secret`.
pub fn assert_hidden(secret: &str, what: &str, shown: &str) {
    assert!(!shown.contains(secret), "{what} shows the secret: {shown}");
}

/// Fails if `err`, or any error in its source chain, shows `secret` in its
/// `Display` or its `Debug`.
pub fn assert_error_hides(secret: &str, what: &str, err: &(dyn std::error::Error + 'static)) {
    let mut next = Some(err);
    while let Some(e) = next {
        assert_hidden(secret, what, &format!("{e} | {e:?}"));
        next = e.source();
    }
}

/// The key named `name` (a valid client key such as `k1`) under tenant
/// `tenant-a` and namespace `test`: the same name is the same key, in every
/// process of a test (a key shared with a child process is named).
pub fn key(name: &str) -> ScopedKey {
    ScopedKey::new(
        "tenant-a",
        "test",
        ClientKey::parse(name).expect("a valid client key"),
    )
}

/// The key named `k{n}` ([`key`]): the `n`th of a test's keys.
pub fn key_n(n: usize) -> ScopedKey {
    key(&format!("k{n}"))
}

/// A key under a tenant no other test uses.
pub fn fresh_key() -> ScopedKey {
    let tenant = format!("t{:016x}", rand::random::<u64>());
    ScopedKey::new(tenant, "conformance", ClientKey::mint())
}

/// A fingerprint of `s`.
pub fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_request("POST", "/test", s.as_bytes(), &[])
}

/// The lease of a claim that must have acquired the key.
pub fn acquired(c: Claim) -> Lease {
    match c {
        Claim::Acquired(l) => l,
        Claim::Existing(r) => panic!("expected Acquired, got Existing({r:?})"),
    }
}

pub(crate) fn existing(c: Claim) -> idemgate_engine::Record {
    match c {
        Claim::Existing(r) => r,
        Claim::Acquired(l) => panic!("expected Existing, got Acquired({l:?})"),
    }
}

pub(crate) fn payload(bytes: &[u8]) -> Bytes {
    Bytes::copy_from_slice(bytes)
}

/// An attempt with `outcome`, stamped now.
pub fn attempt(outcome: AttemptOutcome) -> idemgate_engine::Attempt {
    idemgate_engine::Attempt {
        at_ms: idemgate_engine::backend::now_ms(),
        replica: "conformance".into(),
        outcome,
        status: Some(200),
        latency_us: 1,
        repeated: None,
    }
}

/// The attempt most tests record: executed, status 200, stamped now.
pub fn executed() -> idemgate_engine::Attempt {
    attempt(AttemptOutcome::Executed)
}

/// Completes `lease` with `body`, kept for `ttl`, as an [`executed`]
/// attempt; returns what the store said (a store error panics).
pub async fn complete_executed(
    store: &dyn idemgate_engine::Store,
    lease: &Lease,
    body: &'static [u8],
    ttl: Duration,
) -> idemgate_engine::Fenced {
    cases::complete(store, lease, body, ttl, &executed()).await
}

/// Polls `check` until it is true or 5 s pass (for best-effort writes).
pub async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub mod cases;
pub use cases::*;

// `conformance_suite!` and `CASES`, generated by build.rs from the
// `pub async fn` cases in cases/.
include!(concat!(env!("OUT_DIR"), "/suite.rs"));
