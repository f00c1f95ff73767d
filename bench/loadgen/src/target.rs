//! The endpoint under load: its URL parsed once, and [`Conn`], one
//! HTTP/1.1 keep-alive connection to it that reconnects after an error.
//!
//! One connection per worker, each carrying one request at a time: the
//! number of connections bounds the requests in flight, as with any HTTP/1.1
//! client, and no pool sits between the schedule and the socket.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// The URL is not `http://host:port/path`.
    #[error("{0}")]
    Url(String),
    /// The target could not be reached.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The HTTP handshake failed.
    #[error("HTTP handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        source: hyper::Error,
    },
    /// A request could not be built (a bad header).
    #[error("bad request: {0}")]
    Request(String),
    /// Warming the replay keys failed.
    #[error("warming key {key}: {why}")]
    Warm { key: String, why: String },
}

/// Where requests go.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    /// `host:port` as given, for the `Host` header.
    pub(crate) authority: String,
    /// Path and query.
    pub(crate) path: String,
}

impl Target {
    /// Parses `http://host:port/path` and resolves the host.
    pub(crate) async fn parse(url: &str) -> Result<Self, LoadError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| LoadError::Url(format!("{url}: only http:// URLs are supported")))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(LoadError::Url(format!("{url}: no host")));
        }
        let with_port = if authority.contains(':') {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        let addr = tokio::net::lookup_host(&with_port)
            .await
            .map_err(|e| LoadError::Url(format!("{url}: {e}")))?
            .next()
            .ok_or_else(|| LoadError::Url(format!("{url}: the host has no address")))?;
        Ok(Self {
            addr,
            authority: authority.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// How one request ended.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A whole response with this status.
    Status(StatusCode),
    /// The connection failed (it is reopened for the next request).
    Failed,
}

/// One keep-alive connection.
pub(crate) struct Conn {
    target: Target,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    /// Opens a connection to `target`.
    pub(crate) async fn open(target: Target) -> Result<Self, LoadError> {
        let sender = connect(&target).await?;
        Ok(Self {
            target,
            sender: Some(sender),
        })
    }

    /// Sends `req` and reads the whole response body.
    pub(crate) async fn send(&mut self, req: Request<Full<Bytes>>) -> Answer {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => match connect(&self.target).await {
                Ok(s) => s,
                Err(_) => return Answer::Failed,
            },
        };
        if sender.ready().await.is_err() {
            return Answer::Failed;
        }
        let answer = match sender.send_request(req).await {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(_) => Answer::Status(status),
                    Err(_) => Answer::Failed,
                }
            }
            Err(_) => Answer::Failed,
        };
        if matches!(answer, Answer::Status(_)) {
            self.sender = Some(sender);
        }
        answer
    }
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, LoadError> {
    let tcp = tokio::net::TcpStream::connect(target.addr)
        .await
        .map_err(|source| LoadError::Connect {
            addr: target.addr,
            source,
        })?;
    // Requests are small and answered one at a time: no Nagle delay.
    let _ = tcp.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|source| LoadError::Handshake {
            addr: target.addr,
            source,
        })?;
    tokio::spawn(async move {
        // Ends when the connection closes; the next send reconnects.
        let _ = conn.await;
    });
    Ok(sender)
}
