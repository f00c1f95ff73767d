//! The bodies a client receives while an execution runs, and the error they
//! end with when the stream they carry breaks.
//!
//! An owner's client gets a body fed through a channel by the detached
//! execution; a duplicate that attached gets a body fed by the live stream
//! it follows. Both must end with an error, never cleanly, when the stream
//! breaks: a client must not mistake a cut stream for a whole one.

use axum::body::Body;
use bytes::Bytes;
use tokio::sync::mpsc;

/// The error a client's stream ends with when the stream it follows broke:
/// the key was released, and the client should retry.
#[derive(Debug, thiserror::Error)]
#[error("the response stream broke before its end; the idempotency key was released")]
pub(super) struct StreamBroken;

/// What the client's streaming body receives from the detached execution.
pub(super) enum Chunk {
    /// Events for the client.
    Data(Bytes),
    /// The stream is stored: end the body cleanly.
    End,
    /// The stream broke: end the body with an error.
    Abort,
}

/// A body fed by the detached execution. Ends with an error unless told
/// the stream completed, so an execution that dies (panics) never looks
/// like a complete stream to the client.
pub(super) fn channel_body(rx: mpsc::UnboundedReceiver<Chunk>) -> Body {
    let stream = futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Chunk::Data(b)) => Some((Ok(b), Some(rx))),
            Some(Chunk::End) => None,
            Some(Chunk::Abort) | None => {
                before_error().await;
                Some((Err(StreamBroken), None))
            }
        }
    });
    Body::from_stream(stream)
}

/// Lets the connection write out what the body already yielded before the
/// body fails: the server drops unwritten bytes when a body errors, and the
/// last events (an error event above all) are the ones the client needs to
/// see. One pending poll is enough for the server to flush.
pub(super) async fn before_error() {
    tokio::task::yield_now().await;
}
