//! The connection a request came on, so that a handler can close it
//! without answering: the `close` fault, a provider (or a proxy before it)
//! that drops the connection after reading the request. HTTP handlers
//! cannot do that through a response, so the server hands each request a
//! duplicate of its socket. Every accepted socket also gets TCP_NODELAY.

use std::net::Shutdown;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::net::TcpListener;

/// A request's connection (when the server could duplicate its socket).
#[derive(Clone, Debug)]
pub(crate) struct Connection(Option<Arc<std::net::TcpStream>>);

impl Connected<IncomingStream<'_, TcpListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        // As providers' front ends do: without TCP_NODELAY, an event written
        // after the response's head waits on Nagle's algorithm for the
        // reader's delayed ACK (about 40 ms on Linux) on a kept-alive
        // connection.
        let _ = stream.io().set_nodelay(true);
        Self(duplicate(stream.io()).map(Arc::new))
    }
}

impl Connection {
    /// Shuts the connection down both ways; false when that is not
    /// possible (no socket to reach).
    pub(crate) fn close(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|s| s.shutdown(Shutdown::Both).is_ok())
    }
}

#[cfg(unix)]
fn duplicate(io: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    io.as_fd()
        .try_clone_to_owned()
        .ok()
        .map(std::net::TcpStream::from)
}

#[cfg(not(unix))]
fn duplicate(_io: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    None
}
