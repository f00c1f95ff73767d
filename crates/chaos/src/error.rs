//! The harness's errors: what stops a run before it can be judged. A
//! violation of the promise is not an error; it is in the report.

/// A run that could not be carried out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A binary the run needs was not found.
    #[error("{0}")]
    MissingBinary(String),
    /// A process did not start or become ready.
    #[error("{0}")]
    Start(String),
    /// A store server the run started would not do what a fault needs
    /// (start, stop, promote, come back in sync).
    #[error("store server: {0}")]
    Server(String),
    /// The run's configuration is not one the harness can run.
    #[error("{0}")]
    Config(String),
    /// Local I/O: files, processes, sockets.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP exchange the harness itself needs (not a client request of
    /// the workload, whose failures are recorded).
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    /// A file of the run could not be written as JSON.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

/// The harness's results.
pub type Result<T> = std::result::Result<T, Error>;
