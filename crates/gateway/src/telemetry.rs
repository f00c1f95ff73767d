//! Prometheus exposition of the `metrics` facade.
//!
//! Installing a global recorder is the program's decision, not a library's:
//! the binary calls [`install_prometheus`] once at start, and [`crate::serve`]
//! then answers `GET /metrics` on the admin listener (404 without it).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Histogram buckets in seconds: from a fast replay to a ten-minute
/// generation. Buckets (not summaries) so replicas aggregate.
const BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0,
];

/// Why the Prometheus recorder was not installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the Prometheus recorder")]
pub struct MetricsInstallError(#[source] metrics_exporter_prometheus::BuildError);

/// Installs the process-wide Prometheus recorder (idempotent: a second call
/// returns the first handle).
///
/// # Errors
/// Another recorder is already installed.
pub fn install_prometheus() -> Result<&'static PrometheusHandle, MetricsInstallError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h);
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .map_err(MetricsInstallError)?
        .install_recorder()
        .map_err(MetricsInstallError)?;
    Ok(HANDLE.get_or_init(|| handle))
}

/// The installed handle, if any.
pub(crate) fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE.get()
}

/// Runs the recorder's upkeep (drains histogram buffers) until dropped.
pub(crate) async fn upkeep(handle: &'static PrometheusHandle) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        handle.run_upkeep();
    }
}
