//! The nemesis: random faults, one at a time, from the run's seed, each
//! logged (stderr) and recorded as a [`Fault`].
//!
//! On a replica:
//! - `kill`: SIGKILL, a pause of 0.3–1.5 s, a restart;
//! - `pause`: SIGSTOP held past the lease (`pending_ttl` + 0.5–2.5 s),
//!   then SIGCONT;
//! - `terminate`: SIGTERM (a rolling restart's stop, with the replicas'
//!   short `shutdown_grace`, so generations in flight are cut), then a
//!   restart once the process has exited;
//!
//! On every replica at once:
//! - `clock-step`: the wall clock stepped 10 s–1 h forward or back
//!   (libfaketime's offset file, which the replicas re-read), as an NTP
//!   step of the host would; the monotonic clock is untouched.
//!
//! On the store:
//! - `store-cut`: every connection to the store aborted (RST) by the
//!   FaultProxy in front of it;
//! - `store-stall`: the store's connections stalled for 0.3–1.5 s, then
//!   healed;
//! - `drop-reply`: the next store call reaches the server, which applies
//!   it; its reply is discarded and its connection aborted;
//! - `store-restart`: the primary (a random node of a cluster) killed and,
//!   0.3–1.5 s later, started again on its data;
//! - `failover`: the primary (a random master of a cluster) killed and its
//!   replica promoted, the store's address moved to it; the fault ends
//!   when the store has a replica in sync again.

use std::path::Path;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::sync::watch;

use idemgate_testkit::FaultProxy;

use crate::cluster::Replica;
use crate::error::Result;
use crate::history::{Fault, FaultKind, now_ms};
use crate::servers::Servers;

/// What the nemesis can reach.
#[derive(Debug)]
pub struct Targets<'a> {
    /// The gateway replicas.
    pub replicas: &'a mut [Replica],
    /// The FaultProxy in front of the store, if any.
    pub proxy: Option<&'a FaultProxy>,
    /// The store servers the run started, if any.
    pub servers: Option<&'a mut Servers>,
    /// libfaketime's offset file every replica reads, if the replicas run
    /// under it.
    pub clock: Option<&'a Path>,
}

/// Injects faults until `stop` turns true, then heals every replica
/// (continued, restarted) and returns the faults.
///
/// # Errors
/// A replica cannot be restarted, or a store server cannot be restarted
/// or failed over.
pub async fn run(
    mut targets: Targets<'_>,
    kinds: &[FaultKind],
    pending_ttl: Duration,
    rng: &mut StdRng,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<Fault>> {
    let mut faults = Vec::new();
    if kinds.is_empty() || targets.replicas.is_empty() {
        let _ = stop.wait_for(|s| *s).await;
        return Ok(faults);
    }
    // The clock's offset from the true wall clock, in seconds.
    let mut offset: i64 = 0;
    loop {
        let quiet = Duration::from_millis(rng.random_range(1_000..4_000));
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(faults),
            () = tokio::time::sleep(quiet) => {}
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        let start_ms = now_ms();
        if kind == FaultKind::ClockStep {
            let Some(file) = targets.clock else { continue };
            let step = rng.random_range(10..3_600) * if rng.random_bool(0.5) { 1 } else { -1 };
            // Within two hours of the truth, so steps do not pile up.
            offset = (offset + step).clamp(-7_200, 7_200);
            std::fs::write(file, format!("{offset:+}"))?;
            let detail = format!("step {step:+} s, offset {offset:+} s");
            eprintln!("nemesis: clock-step {detail}");
            faults.push(Fault {
                kind,
                replica: None,
                start_ms,
                end_ms: now_ms(),
                detail: Some(detail),
            });
            continue;
        }
        if kind.on_store() {
            let Some(detail) = store_fault(&mut targets, kind, rng).await? else {
                continue;
            };
            let end_ms = now_ms();
            eprintln!(
                "nemesis: {} {detail}, over after {} ms",
                kind.as_str(),
                end_ms - start_ms
            );
            faults.push(Fault {
                kind,
                replica: None,
                start_ms,
                end_ms,
                detail: Some(detail),
            });
            continue;
        }
        let index = rng.random_range(0..targets.replicas.len());
        let replica = &mut targets.replicas[index];
        eprintln!("nemesis: {} replica {index}", kind.as_str());
        match kind {
            FaultKind::Kill => {
                replica.signal("KILL").await?;
                replica.wait_exit(Duration::from_secs(5)).await?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
                replica.start().await?;
            }
            FaultKind::Pause => {
                replica.signal("STOP").await?;
                let hold = pending_ttl + Duration::from_millis(rng.random_range(500..2_500));
                tokio::time::sleep(hold).await;
                replica.signal("CONT").await?;
            }
            FaultKind::Terminate => {
                replica.signal("TERM").await?;
                replica.wait_exit(Duration::from_secs(20)).await?;
                replica.start().await?;
            }
            _ => {}
        }
        let end_ms = now_ms();
        eprintln!(
            "nemesis: replica {index} back after {} ms",
            end_ms - start_ms
        );
        faults.push(Fault {
            kind,
            replica: Some(index),
            start_ms,
            end_ms,
            detail: None,
        });
    }
}

/// One fault on the store; what it did, or `None` when this run cannot
/// inject it (the run's configuration was checked before).
async fn store_fault(
    targets: &mut Targets<'_>,
    kind: FaultKind,
    rng: &mut StdRng,
) -> Result<Option<String>> {
    let proxy = targets.proxy;
    Ok(match kind {
        FaultKind::StoreCut => match proxy {
            Some(p) => Some(format!("{} connections aborted", p.reset().await)),
            None => None,
        },
        FaultKind::StoreStall => match proxy {
            Some(p) => {
                let hold = Duration::from_millis(rng.random_range(300..1_500));
                p.stall(true);
                tokio::time::sleep(hold).await;
                p.stall(false);
                Some(format!("{} ms", hold.as_millis()))
            }
            None => None,
        },
        FaultKind::DropReply => match proxy {
            Some(p) => Some(drop_reply(p).await),
            None => None,
        },
        FaultKind::StoreRestart => match targets.servers.as_deref_mut() {
            Some(s) => {
                let down = Duration::from_millis(rng.random_range(300..1_500));
                Some(s.restart(down, rng.random_range(0..64)).await?)
            }
            None => None,
        },
        FaultKind::Failover => match targets.servers.as_deref_mut() {
            Some(s) => Some(s.failover(proxy, rng.random_range(0..64)).await?),
            None => None,
        },
        _ => None,
    })
}

/// Arms the proxy to drop the next reply and waits (at most 3 s) until a
/// call has taken it; disarms it if none did.
async fn drop_reply(proxy: &FaultProxy) -> String {
    let before = proxy.stats().replies_dropped;
    proxy.drop_next_reply();
    for _ in 0..150 {
        if proxy.stats().replies_dropped > before {
            return "a reply dropped".into();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.heal();
    "no store call within 3 s: disarmed".into()
}
