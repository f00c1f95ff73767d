//! The nemesis: random faults on random replicas, one at a time, from the
//! run's seed, each logged (stderr) and recorded as a [`Fault`].
//!
//! - `kill`: SIGKILL, a pause of 0.3–1.5 s, a restart;
//! - `pause`: SIGSTOP held past the lease (`pending_ttl` + 0.5–2.5 s),
//!   then SIGCONT;
//! - `terminate`: SIGTERM (a rolling restart's stop, with the replicas'
//!   short `shutdown_grace`, so generations in flight are cut), then a
//!   restart once the process has exited;
//! - `store-cut`: every connection to the store aborted (RST) by the
//!   FaultProxy in front of it;
//! - `store-stall`: the store's connections stalled for 0.3–1.5 s, then
//!   healed.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::sync::watch;

use idemgate_testkit::FaultProxy;

use crate::cluster::Replica;
use crate::error::Result;
use crate::history::{Fault, FaultKind, now_ms};

/// Injects faults until `stop` turns true, then heals every replica
/// (continued, restarted) and returns the faults.
///
/// # Errors
/// A replica cannot be restarted.
pub async fn run(
    replicas: &mut [Replica],
    store: Option<&FaultProxy>,
    kinds: &[FaultKind],
    pending_ttl: Duration,
    rng: &mut StdRng,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<Fault>> {
    let mut faults = Vec::new();
    if kinds.is_empty() || replicas.is_empty() {
        let _ = stop.wait_for(|s| *s).await;
        return Ok(faults);
    }
    loop {
        let quiet = Duration::from_millis(rng.random_range(1_000..4_000));
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(faults),
            () = tokio::time::sleep(quiet) => {}
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        let start_ms = now_ms();
        if kind.on_store() {
            let Some(proxy) = store else { continue };
            eprintln!("nemesis: {}", kind.as_str());
            if kind == FaultKind::StoreCut {
                proxy.reset().await;
            } else {
                proxy.stall(true);
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
                proxy.stall(false);
            }
            faults.push(Fault {
                kind,
                replica: None,
                start_ms,
                end_ms: now_ms(),
            });
            continue;
        }
        let index = rng.random_range(0..replicas.len());
        let replica = &mut replicas[index];
        eprintln!("nemesis: {} replica {index}", kind.as_str());
        match kind {
            FaultKind::StoreCut | FaultKind::StoreStall => {}
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
        });
    }
}
