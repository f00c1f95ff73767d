//! The conformance cases: one `pub async fn NAME(store: Arc<dyn Store>)`
//! per behaviour every store must have.
//!
//! The build script reads the files of this directory and generates the list of cases that
//! [`conformance_suite!`](crate::conformance_suite) turns into tests, so a case
//! written here runs on every store without being listed anywhere else. Keep
//! the parameters exactly `(store: Arc<dyn Store>)` (line breaks and a
//! trailing comma do not matter).

mod execution;
mod records;

pub use execution::*;
pub use records::*;
