//! The gateway's one metrics pipeline: [`idemgate_telemetry`]'s process-wide
//! Prometheus recorder, with bucketed histograms for every `_seconds` metric
//! (buckets, not summaries, so replicas aggregate).
//!
//! [`crate::serve()`] installs it (through [`Telemetry::global`]) before it
//! builds its routes, and answers `GET /metrics` on the admin listener with
//! [`Telemetry::render`]. A program that installed another recorder first
//! keeps it; `/metrics` then says so.

use idemgate_telemetry::Telemetry;

/// Why the Prometheus recorder was not installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the Prometheus recorder: another metrics recorder is installed")]
pub struct MetricsInstallError;

/// Installs the process-wide Prometheus recorder (idempotent: a second call
/// returns the same telemetry).
///
/// # Errors
/// Another recorder is already installed.
pub fn install_prometheus() -> Result<&'static Telemetry, MetricsInstallError> {
    let t = Telemetry::global();
    if t.is_exporting() {
        Ok(t)
    } else {
        Err(MetricsInstallError)
    }
}

/// Runs the recorder's upkeep (drains histogram buffers) until dropped.
pub(crate) async fn upkeep(telemetry: &'static Telemetry) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        telemetry.run_upkeep();
    }
}
