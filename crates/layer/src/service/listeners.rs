//! Who hears from a detached execution, and what each has been told: the
//! owner's own [`Client`] (waiting for the response, or reading a stream)
//! and the [`Attachers`], duplicates that follow the execution live.
//!
//! The client's side is a state machine: each [`Client`] state holds what
//! that phase has and nothing else, so a held response always has a client
//! to go to, a stream's body never coexists with an unsent head, and the
//! inner service's status exists exactly once it has answered. The
//! detached execution drives it; this module keeps it consistent.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::{mpsc, oneshot};

use super::body::{Chunk, channel_body};
use crate::live::LivePublisher;
use crate::problem::Problem;
use crate::replay::{IDEMPOTENT_REPLAYED, IDEMPOTENT_STORED, mark};

/// Where the owner's client stands.
pub(super) enum Client {
    /// The inner service is called; the client waits for the head.
    Calling { reply: oneshot::Sender<Response> },
    /// The inner service answered `status`; its body is being read.
    Reading {
        status: u16,
        reply: oneshot::Sender<Response>,
    },
    /// The client's response is ready (the inner service's, or the problem
    /// replacing it); it is sent once the store has been written.
    Holding {
        status: u16,
        reply: oneshot::Sender<Response>,
        response: Response,
    },
    /// The inner service answered `status` with an event stream: the head
    /// is sent, the events follow through `body`.
    Streaming {
        status: u16,
        body: mpsc::UnboundedSender<Chunk>,
    },
    /// As `Streaming`, but the client went away: the work goes on, for the
    /// store and for attached duplicates.
    Gone { status: u16 },
    /// The client has its answer: nothing more to send.
    Answered,
}

impl Client {
    /// A client waiting for the response on `reply`.
    pub(super) fn new(reply: oneshot::Sender<Response>) -> Self {
        Self::Calling { reply }
    }

    /// The inner service's status, once it has answered.
    pub(super) fn status(&self) -> Option<u16> {
        match self {
            Self::Calling { .. } | Self::Answered => None,
            Self::Reading { status, .. }
            | Self::Holding { status, .. }
            | Self::Streaming { status, .. }
            | Self::Gone { status } => Some(*status),
        }
    }

    /// The inner service answered `status`: its body comes next.
    pub(super) fn answered(&mut self, status: u16) {
        *self = match std::mem::replace(self, Self::Answered) {
            Self::Calling { reply } => Self::Reading { status, reply },
            other => other,
        };
    }

    /// Keeps `response` for the client until the store is written (also
    /// when the inner service never answered: a timeout's problem).
    pub(super) fn hold(&mut self, response: Response) {
        *self = match std::mem::replace(self, Self::Answered) {
            Self::Reading { status, reply } => Self::Holding {
                status,
                reply,
                response,
            },
            Self::Calling { reply } => Self::Holding {
                status: response.status().as_u16(),
                reply,
                response,
            },
            other => other,
        };
    }

    /// Replaces the response held for the client, if it has not been sent:
    /// the store did not take the result it carries.
    pub(super) fn replace_held(&mut self, replacement: Response) {
        if let Self::Holding { response, .. } = self {
            *response = replacement;
        }
    }

    /// Sends the head of a stream whose events follow through [`send`].
    ///
    /// [`send`]: Self::send
    pub(super) fn send_head(&mut self, parts: http::response::Parts) {
        let (tx, rx) = mpsc::unbounded_channel();
        let head = mark(Response::from_parts(parts, channel_body(rx)), false);
        *self = match std::mem::replace(self, Self::Answered) {
            Self::Reading { status, reply } => {
                // The client may be gone already; the work goes on regardless.
                let _ = reply.send(head);
                Self::Streaming { status, body: tx }
            }
            other => other,
        };
    }

    /// Marks the response held for the client `Idempotent-Stored: false`:
    /// the store never took it, and a retry may run the work again. (A
    /// stream's head is long gone: it ends broken instead.)
    pub(super) fn mark_not_stored(&mut self) {
        if let Self::Holding { response, .. } = self {
            response
                .headers_mut()
                .insert(IDEMPOTENT_STORED, HeaderValue::from_static("false"));
        }
    }

    /// Sends a piece of the stream, if the client still listens.
    pub(super) fn send(&mut self, chunk: Chunk) {
        if let Self::Streaming { status, body } = self
            && body.send(chunk).is_err()
        {
            tracing::debug!("client went away; the execution goes on");
            *self = Self::Gone { status: *status };
        }
    }

    /// Sends the held response, or the problem `fallback` makes if the
    /// client still waits for a head; nothing once a stream's head is sent.
    pub(super) fn answer(&mut self, fallback: impl FnOnce() -> Problem) {
        let (reply, res) = match std::mem::replace(self, Self::Answered) {
            Self::Holding {
                reply, response, ..
            } => (reply, response),
            Self::Calling { reply } | Self::Reading { reply, .. } => {
                (reply, fallback().into_response())
            }
            Self::Streaming { .. } | Self::Gone { .. } | Self::Answered => return,
        };
        let _ = reply.send(res);
    }
}

/// Duplicates following the execution live (`Attach` mode only; nobody
/// otherwise). They are told the end once: after [`Attachers::fail`] or
/// [`Attachers::complete`], nothing more is published.
///
/// This is apart from [`Client`]: whether duplicates follow does not
/// depend on where the client stands (either may be gone while the other
/// listens).
pub(super) struct Attachers(Option<Box<dyn LivePublisher>>);

impl Attachers {
    /// Duplicates following through `publisher`, or nobody.
    pub(super) fn new(publisher: Option<Box<dyn LivePublisher>>) -> Self {
        Self(publisher)
    }

    /// The response is an event stream with this head.
    pub(super) fn streaming(&self, status: StatusCode, headers: &HeaderMap) {
        if let Some(p) = &self.0 {
            let mut attached = headers.clone();
            attached.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            p.streaming(status, attached);
        }
    }

    /// The response is not an event stream.
    pub(super) fn not_streaming(&self) {
        if let Some(p) = &self.0 {
            p.not_streaming();
        }
    }

    /// One more event, with its sequential id.
    pub(super) fn event(&self, event: Bytes) {
        if let Some(p) = &self.0 {
            p.event(event);
        }
    }

    /// The stream broke (or will not be stored): stop following.
    pub(super) fn fail(&mut self) {
        if let Some(p) = self.0.take() {
            p.fail();
        }
    }

    /// The stream is stored.
    pub(super) fn complete(&mut self) {
        if let Some(p) = self.0.take() {
            p.complete();
        }
    }
}
