//! [`Sim`], the state every request of one simulator shares: its
//! configuration, its counters and its shutdown signal.
//!
//! A leaf module: the request handlers (`respond`) and the server that
//! routes to them (`server`) both hold an `Arc<Sim>`, and neither needs the
//! other to name it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::control::SimConfig;
use crate::stats::Stats;

/// State shared by every request of one simulator.
#[derive(Debug)]
pub(crate) struct Sim {
    pub(crate) config: SimConfig,
    pub(crate) stats: Arc<Stats>,
    /// Flips to `true` once, at shutdown. Every wait inside a request also
    /// watches it, so that stalled and hanging responses end and graceful
    /// shutdown does not wait for them forever. Owned here, so it never
    /// closes while a request can still look at it.
    shutdown: watch::Sender<bool>,
}

impl Sim {
    /// A simulator not shutting down.
    pub(crate) fn new(config: SimConfig, stats: Arc<Stats>) -> Self {
        Self {
            config,
            stats,
            shutdown: watch::Sender::new(false),
        }
    }

    /// Completes once shutdown has begun.
    pub(crate) async fn shutdown_signal(&self) {
        let mut rx = self.shutdown.subscribe();
        // The sender lives in `self`, so this only returns once it is true.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Sleeps `delay`; false if shutdown began first.
    pub(crate) async fn sleep(&self, delay: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.shutdown_signal() => false,
        }
    }

    /// Starts shutdown: every watched wait ends.
    pub(crate) fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }
}
