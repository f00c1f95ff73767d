//! [`Endpoint`]: what a Redis URL names — one node or a cluster's seed
//! nodes, plain or TLS, and the certificate authority to trust — turned
//! into the driver's clients.
//!
//! A leaf module. The store's shared connection (`conn`) and the live
//! event streams' dedicated connections (`idemgate-redis-live`) both open
//! their clients here, so a TLS setting written in the URL applies to
//! every connection a deployment makes, not only to the first one.
//!
//! # Why TLS settings sit in the URL
//! The store URL is the one setting an operator writes for a store
//! (`store = "rediss://…"`); managed Redis services hand out exactly such a
//! URL. A private certificate authority is one more query parameter,
//! `tls_ca=/path/ca.pem`, the way PostgreSQL URLs carry `sslrootcert=`,
//! rather than a second setting that could be forgotten on one replica.
//! The parameter is removed before the URL reaches the driver.

use std::fmt;

use redis::cluster::ClusterClientBuilder;
use redis::io::tcp::TcpSettings;
use redis::{ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError};

/// The query parameter naming a PEM file of trusted certificate
/// authorities for `rediss://` (replacing the system's roots).
pub const TLS_CA_PARAM: &str = "tls_ca";

/// A parsed Redis URL: `redis://` or `rediss://` (one node),
/// `redis+cluster://` or `rediss+cluster://` (a cluster; the hosts are
/// seed nodes, any reachable one is enough to discover the rest).
#[derive(Clone)]
pub struct Endpoint {
    /// The driver's URLs: one for a node, one per seed node for a cluster.
    /// They may hold a password: never printed.
    urls: Vec<String>,
    cluster: bool,
    tls: bool,
    /// The PEM text of the `tls_ca` file.
    ca: Option<Vec<u8>>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("nodes", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("tls", &self.tls)
            .field("custom_ca", &self.ca.is_some())
            .finish()
    }
}

fn invalid(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, detail))
}

impl Endpoint {
    /// Parses `url`, reading the `tls_ca` file if it names one.
    ///
    /// # Errors
    /// `InvalidClientConfig` when `tls_ca` is given without TLS, names a
    /// file that cannot be read, or this build has no TLS; a cluster URL
    /// without hosts. Messages never hold the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<Self, RedisError> {
        let url = url.trim();
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (cluster, tls) = match scheme {
            "redis+cluster" => (true, false),
            "rediss+cluster" => (true, true),
            "rediss" => (false, true),
            _ => (false, false),
        };
        // The query starts after the authority; a password holds no raw
        // '?', '/' or '@' (they are percent-encoded in a valid URL).
        let at = rest.rfind('@').map_or(0, |i| i + 1);
        let (head, query) = match rest[at..].find('?') {
            Some(i) => rest.split_at(at + i),
            None => (rest, ""),
        };
        // The URL up to its query (scheme included).
        let base = &url[..url.len() - query.len()];
        let mut ca_path = None;
        let kept: Vec<(String, String)> =
            url::form_urlencoded::parse(query.trim_start_matches('?').as_bytes())
                .filter_map(|(k, v)| {
                    if k == TLS_CA_PARAM {
                        ca_path = Some(v.into_owned());
                        None
                    } else {
                        Some((k.into_owned(), v.into_owned()))
                    }
                })
                .collect();
        let query = if kept.is_empty() {
            String::new()
        } else {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            q.extend_pairs(kept);
            format!("?{}", q.finish())
        };
        let ca = match ca_path {
            None => None,
            Some(_) if !tls => {
                return Err(invalid(
                    "tls_ca needs TLS",
                    "use a rediss:// or rediss+cluster:// URL".to_owned(),
                ));
            }
            Some(path) => Some(read_ca(&path)?),
        };
        if tls {
            tls_support()?;
        }
        let urls = if cluster {
            let node_scheme = if tls { "rediss" } else { "redis" };
            let (auth, hosts) = head.split_at(at);
            let (hosts, tail) = match hosts.find('/') {
                Some(i) => hosts.split_at(i),
                None => (hosts, ""),
            };
            let urls: Vec<String> = hosts
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{node_scheme}://{auth}{h}{tail}{query}"))
                .collect();
            if urls.is_empty() {
                return Err(invalid(
                    "a cluster URL needs at least one host",
                    "e.g. redis+cluster://10.0.0.1:6379,10.0.0.2:6379".to_owned(),
                ));
            }
            urls
        } else {
            vec![format!("{base}{query}")]
        };
        Ok(Self {
            urls,
            cluster,
            tls,
            ca,
        })
    }

    /// Whether the URL names a cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// A client for a single node (for a cluster URL, its first seed node).
    ///
    /// # Errors
    /// The driver's: a malformed URL or certificate file.
    pub fn node_client(&self) -> Result<redis::Client, RedisError> {
        let url = self.urls.first().map_or("", String::as_str);
        let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
        match &self.ca {
            None => redis::Client::open(info),
            Some(pem) => with_ca_node(info, pem),
        }
    }

    /// A builder of a cluster client over the nodes the URL names.
    pub fn cluster_builder(&self) -> ClusterClientBuilder {
        let builder =
            redis::cluster::ClusterClient::builder(self.urls.clone()).tcp_settings(tcp_settings());
        match &self.ca {
            None => builder,
            Some(pem) => with_ca_cluster(builder, pem),
        }
    }
}

/// The driver leaves Nagle's algorithm on. Its multiplexed connection
/// writes each command as it comes, so with Nagle a command sent while an
/// earlier one awaits its answer waits for that answer's ACK before it
/// leaves: concurrent requests' commands leave in batches, one per round
/// trip.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// The `tls_ca` file's text: one or more PEM certificates.
fn read_ca(path: &str) -> Result<Vec<u8>, RedisError> {
    let pem = std::fs::read(path)
        .map_err(|e| invalid("cannot read the tls_ca file", format!("{path}: {e}")))?;
    if !pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(invalid(
            "the tls_ca file holds no PEM certificate",
            path.to_owned(),
        ));
    }
    Ok(pem)
}

#[cfg(feature = "tls")]
fn tls_support() -> Result<(), RedisError> {
    // The driver builds its TLS configuration with the process's default
    // provider; install ours unless the application installed one.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is installed.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    Ok(())
}

#[cfg(not(feature = "tls"))]
fn tls_support() -> Result<(), RedisError> {
    Err(invalid(
        "TLS is not built in",
        "rebuild idemgate-redis with its `tls` feature for rediss:// URLs".to_owned(),
    ))
}

#[cfg(feature = "tls")]
fn certificates(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}

#[cfg(feature = "tls")]
fn with_ca_node(info: ConnectionInfo, pem: &[u8]) -> Result<redis::Client, RedisError> {
    redis::Client::build_with_tls(info, certificates(pem))
}

#[cfg(feature = "tls")]
fn with_ca_cluster(builder: ClusterClientBuilder, pem: &[u8]) -> ClusterClientBuilder {
    builder.certs(certificates(pem))
}

// Unreachable without TLS (`parse` refuses TLS URLs then); kept so the
// callers need no `cfg`.
#[cfg(not(feature = "tls"))]
fn with_ca_node(info: ConnectionInfo, _pem: &[u8]) -> Result<redis::Client, RedisError> {
    redis::Client::open(info)
}

#[cfg(not(feature = "tls"))]
fn with_ca_cluster(builder: ClusterClientBuilder, _pem: &[u8]) -> ClusterClientBuilder {
    builder
}

#[cfg(test)]
mod tests;
