//! Lease renewals without a task per claim.
//!
//! A claimed key's lease must be renewed every `heartbeat` while its work
//! runs. Nearly every run ends long before its first renewal is due (a
//! third of the lease, 10 s by default), so a heartbeat task spawned per
//! claim and aborted at its end would cost two schedules, a timer and, on
//! a multi-thread runtime, a wake of another worker, for a renewal that
//! never happens.
//!
//! Instead an [`Engine`](crate::Engine) keeps one [`Renewals`] registry. A
//! claim registers its run (one lock and one insert), its end deregisters
//! it, and neither wakes anything. One ticker per registry looks at the runs
//! every quarter of the interval. A run still going after half the interval
//! gets its own heartbeat task, which sends the first renewal at the
//! interval, when a task spawned at the claim would have sent it, and then
//! one every interval, as before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use slab::Slab;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::{Fenced, Lease, Store};

/// What a claimed run shares with its heartbeat: the lease, and what the
/// renewals found.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) lease: Lease,
    /// When the claim was handed out, on this process's monotonic clock.
    pub(crate) started: Instant,
    pub(crate) pending_ttl: Duration,
    /// Whether a renewal found the lease taken over.
    pub(crate) lost: AtomicBool,
    /// When the last renewal that applied was sent, in ms after `started`
    /// (0: none yet).
    pub(crate) renewed_at: AtomicU64,
    /// Held while a renewal is on its way, so pausing can wait for it.
    pub(crate) renewing: tokio::sync::Mutex<()>,
}

impl Run {
    pub(crate) fn new(store: Arc<dyn Store>, lease: Lease, pending_ttl: Duration) -> Self {
        Self {
            store,
            lease,
            started: Instant::now(),
            pending_ttl,
            lost: AtomicBool::new(false),
            renewed_at: AtomicU64::new(0),
            renewing: tokio::sync::Mutex::new(()),
        }
    }
}

/// The runs of one engine whose leases are renewed every `every`.
#[derive(Debug)]
pub(crate) struct Renewals {
    every: Duration,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    runs: Slab<Registered>,
    ticker: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Registered {
    run: Arc<Run>,
    /// The runtime the run was claimed on, where its heartbeat runs.
    runtime: Handle,
    /// On tokio's clock (so paused time in tests moves it too).
    claimed: tokio::time::Instant,
    /// The run's heartbeat task, once the ticker gave it one.
    heartbeat: Option<JoinHandle<()>>,
}

/// A run's place in its registry; [`Registration::end`] takes it out and
/// stops its heartbeat.
#[derive(Debug)]
pub(crate) struct Registration {
    renewals: Arc<Renewals>,
    slot: usize,
}

impl Renewals {
    pub(crate) fn new(every: Duration) -> Arc<Self> {
        Arc::new(Self {
            every,
            registry: Mutex::new(Registry::default()),
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `run` for renewals. `None` outside a tokio runtime: there
    /// is nothing to renew from, and the lease then lasts `pending_ttl`.
    pub(crate) fn register(self: &Arc<Self>, run: &Arc<Run>) -> Option<Registration> {
        let runtime = Handle::try_current().ok()?;
        let claimed = tokio::time::Instant::now();
        let mut registry = self.registry();
        // The ticker lives as long as the registry, on the runtime that first
        // needed it; if that runtime has shut down, the next claim starts one
        // on its own.
        if registry.ticker.as_ref().is_none_or(JoinHandle::is_finished) {
            let tick = (self.every / 4).max(Duration::from_millis(1));
            registry.ticker = Some(runtime.spawn(ticker(Arc::downgrade(self), tick)));
        }
        let slot = registry.runs.insert(Registered {
            run: Arc::clone(run),
            runtime,
            claimed,
            heartbeat: None,
        });
        Some(Registration {
            renewals: Arc::clone(self),
            slot,
        })
    }

    /// Gives each run that has lived half an interval its heartbeat task.
    fn start_due_heartbeats(&self, now: tokio::time::Instant) {
        let mut registry = self.registry();
        for (_, registered) in registry.runs.iter_mut() {
            if registered.heartbeat.is_some() || now < registered.claimed + self.every / 2 {
                continue;
            }
            let first = registered.claimed + self.every;
            registered.heartbeat = Some(registered.runtime.spawn(heartbeat(
                Arc::clone(&registered.run),
                first,
                self.every,
            )));
        }
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        let registry = self
            .registry
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(ticker) = registry.ticker.take() {
            ticker.abort();
        }
    }
}

impl Registration {
    /// Takes the run out of the registry and stops its heartbeat, if it
    /// has one. A renewal on its way is abandoned where it stands.
    pub(crate) fn end(self) {
        let registered = self.renewals.registry().runs.try_remove(self.slot);
        // Out of the registry, the ticker can no longer give it a task.
        if let Some(task) = registered.and_then(|r| r.heartbeat) {
            task.abort();
        }
    }
}

async fn ticker(renewals: Weak<Renewals>, tick: Duration) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = interval.tick().await;
        let Some(renewals) = renewals.upgrade() else {
            return;
        };
        renewals.start_due_heartbeats(now);
    }
}

async fn heartbeat(run: Arc<Run>, first: tokio::time::Instant, every: Duration) {
    let mut lease = run.lease.clone();
    tokio::time::sleep_until(first).await;
    loop {
        let inflight = run.renewing.lock().await;
        let sent = run.started.elapsed();
        let renewed = run.store.renew(&mut lease, run.pending_ttl).await;
        drop(inflight);
        match renewed {
            Ok(Fenced::Applied) => {
                let ms = u64::try_from(sent.as_millis()).unwrap_or(u64::MAX);
                run.renewed_at.fetch_max(ms, Ordering::Relaxed);
            }
            Ok(Fenced::Stale) => {
                run.lost.store(true, Ordering::Relaxed);
                tracing::warn!(key = %lease.key.key, "lease lost: another owner took the key over");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "lease renewal failed; retrying"),
        }
        tokio::time::sleep(every).await;
    }
}
