//! Why the gateway could not start, or stopped with an error.
//!
//! A leaf module: the errors name what failed (the store and its URL, a
//! route's upstream client, a listener, a refused configuration) and depend
//! on no other module of the gateway, so every module that fails can use
//! them without depending on the modules that orchestrate it.

use std::net::SocketAddr;

use idemgate_check::Finding;

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration has a finding that refuses a start (a key that
    /// would merge different operations); see
    /// [`crate::plan::REFUSED_AT_START`].
    #[error("{}", refusal(.0))]
    Refused(Vec<Finding>),
    /// The store could not be opened.
    #[error("cannot open the {backend} store at {url}")]
    StoreOpen {
        /// The backend.
        backend: &'static str,
        /// The store URL (password hidden).
        url: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The admin listener would be reachable from other machines without an
    /// admin token.
    #[error(
        "refusing to start: the admin listener {addr} is not a loopback address and no admin token is configured; set `admin_token` (or IDEMGATE_ADMIN_TOKEN), or bind the admin listener to 127.0.0.1"
    )]
    AdminWithoutToken {
        /// The admin address.
        addr: SocketAddr,
    },
    /// The encryption key file could not be loaded.
    #[error("cannot load the encryption key file {}: {source}", path.display())]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why (names the line, never the key text).
        source: idemgate_seal::KeyFileError,
    },
    /// A route's upstream client could not be built.
    #[error(transparent)]
    Proxy(#[from] ProxyBuildError),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}{}", if *.admin { " (admin)" } else { "" })]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Whether it is the admin listener's.
        admin: bool,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A listener failed.
    #[error("listener failed")]
    Io(#[from] std::io::Error),
}

/// One line naming every refusing finding, its route and its fix.
fn refusal(findings: &[Finding]) -> String {
    let why: Vec<String> = findings
        .iter()
        .map(|f| {
            format!(
                "route {}: {} (fix: {})",
                f.route.as_deref().unwrap_or("-"),
                f.message,
                f.fix
            )
        })
        .collect();
    format!(
        "refusing to start: {}; `idemgate check` lists every finding",
        why.join("; ")
    )
}

/// Why a route's upstream client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the upstream client for route `{route}`")]
pub struct ProxyBuildError {
    /// The route id.
    pub(crate) route: String,
    /// Why (the HTTP client's own error).
    #[source]
    pub(crate) source: Box<dyn std::error::Error + Send + Sync>,
}
