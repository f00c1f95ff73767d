//! The state every clone of the layer and of its services shares: the
//! engine, the configuration, the live stream registry, the detached tasks
//! and the route's metrics.
//!
//! It sits in a leaf module, below everything that uses it (the request
//! path in `service`, the operation resource in `operations`), so those
//! depend on it and never on each other for it.

use std::sync::Arc;

use idemgate_engine::Engine;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::LayerConfig;
use crate::latency::RouteLatency;
use crate::live::LiveEvents;
use crate::telemetry::Metrics;

/// State shared by every clone of the layer and its services.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The store of records, behind the engine's lease protocol.
    pub(crate) engine: Engine,
    /// The route's configuration.
    pub(crate) config: LayerConfig,
    /// Streams being generated, for `Attach` (this process's, or shared
    /// between replicas).
    pub(crate) live: Arc<dyn LiveEvents>,
    /// Detached executions, so shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    /// Cancels detached executions once the shutdown grace has run out.
    pub(crate) cancel: CancellationToken,
    /// The route's counters (labelled with the namespace).
    pub(crate) metrics: Metrics,
    /// How long the route's executions take, for the 409's poll interval.
    pub(crate) latency: RouteLatency,
}

impl Shared {
    /// Fresh state for a route: no detached task, nothing cancelled.
    pub(crate) fn new(engine: Engine, config: LayerConfig, live: Arc<dyn LiveEvents>) -> Self {
        Self {
            engine,
            metrics: Metrics::new(&config),
            config,
            live,
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            latency: RouteLatency::default(),
        }
    }
}
