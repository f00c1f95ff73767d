//! The body of `POST /reports`, the one type the client and the report
//! service share. A leaf module, so that the service (which drives the
//! client in a run) and the client both name it without depending on each
//! other.

use serde::{Deserialize, Serialize};

/// Body of `POST /reports`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReportRequest {
    /// The business operation.
    pub(crate) operation: String,
    /// The account to report on and charge.
    pub(crate) account: String,
}
