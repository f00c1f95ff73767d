//! Request bodies with read deadlines: [`with_timeouts`] and the
//! [`BodyTimeout`] error it ends a stalled body with.
//!
//! A client that sends its headers and then trickles the body (one byte
//! every few seconds, or nothing at all) would otherwise hold its
//! connection, its task and, once the body is forwarded, an upstream
//! connection for as long as it likes. Two clocks bound it: the gap
//! between two pieces of the body (`idle`), and the whole body (`total`),
//! which starts when the body is wrapped, that is when its request head
//! was read. The layer answers a body that ran out of either with 408
//! `request-body-timeout` before anything is stored or forwarded; the
//! gateway's proxy does the same for the unkeyed requests it streams.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use idemgate_telemetry::Telemetry;
use tokio::time::{Instant, Sleep};

/// The two read deadlines of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyTimeouts {
    /// Longest wait for the next piece of the body.
    pub idle: Duration,
    /// Longest time to read the whole body, from its request head on.
    pub total: Duration,
}

/// Which deadline a body ran out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyDeadline {
    /// No piece of the body arrived within the idle timeout.
    Idle,
    /// The whole body took longer than the total timeout.
    Total,
}

impl BodyDeadline {
    /// The label of `idemgate_connection_limits_total{limit}`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Idle => "body_idle_time",
            Self::Total => "body_read_time",
        }
    }
}

/// The error a timed body ends with when a deadline passed.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
#[error("the request body was not received in time ({})", match .0 {
    BodyDeadline::Idle => "it stalled",
    BodyDeadline::Total => "it took too long in all",
})]
pub struct BodyTimeout(pub BodyDeadline);

impl BodyTimeout {
    /// The [`BodyTimeout`] somewhere in `error`'s source chain, if any.
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<Self>() {
                return Some(*t);
            }
            next = e.source();
        }
        None
    }
}

/// `body` with `timeouts`: it ends with a [`BodyTimeout`] error (counted in
/// `idemgate_connection_limits_total`) when a deadline passes before its
/// end. A body already known to be empty is returned as it is.
pub fn with_timeouts(body: Body, timeouts: BodyTimeouts) -> Body {
    if http_body::Body::is_end_stream(&body) {
        return body;
    }
    Body::new(TimedBody {
        inner: body,
        idle_after: timeouts.idle,
        idle: Box::pin(tokio::time::sleep(timeouts.idle)),
        total: Box::pin(tokio::time::sleep_until(Instant::now() + timeouts.total)),
        failed: false,
    })
}

/// A body with an idle and a total deadline.
struct TimedBody {
    inner: Body,
    idle_after: Duration,
    /// Reset after every frame.
    idle: Pin<Box<Sleep>>,
    total: Pin<Box<Sleep>>,
    /// A deadline passed: the body yields nothing more.
    failed: bool,
}

impl TimedBody {
    fn fail(&mut self, deadline: BodyDeadline) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.failed = true;
        Telemetry::shared().connection_limit(deadline.label());
        Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(deadline)))))
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_some() {
                let next = Instant::now() + this.idle_after;
                this.idle.as_mut().reset(next);
            }
            return Poll::Ready(frame);
        }
        if this.total.as_mut().poll(cx).is_ready() {
            return this.fail(BodyDeadline::Total);
        }
        ready!(this.idle.as_mut().poll(cx));
        this.fail(BodyDeadline::Idle)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const TIMEOUTS: BodyTimeouts = BodyTimeouts {
        idle: Duration::from_secs(5),
        total: Duration::from_secs(30),
    };

    /// A body fed by hand, one piece at a time.
    fn fed() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        });
        (tx, Body::from_stream(stream))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_ends_with_the_idle_timeout() {
        let (tx, body) = fed();
        let mut body = with_timeouts(body, TIMEOUTS);
        tx.send(Bytes::from_static(b"{")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"{"));
        let err = body.frame().await.unwrap().unwrap_err();
        let found = BodyTimeout::find(&err);
        assert_eq!(found, Some(BodyTimeout(BodyDeadline::Idle)), "{err}");
        assert!(body.frame().await.is_none(), "nothing after the timeout");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_that_never_stalls_ends_with_the_total_timeout() {
        let (tx, body) = fed();
        let mut body = with_timeouts(body, TIMEOUTS);
        let feeder = tokio::spawn(async move {
            // A byte every 4 s: never idle for 5 s, never done.
            while tx.send(Bytes::from_static(b"a")).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
        });
        let mut bytes = 0;
        let err = loop {
            match body.frame().await {
                Some(Ok(f)) => bytes += f.into_data().map_or(0, |d| d.len()),
                Some(Err(e)) => break e,
                None => panic!("the trickle ended"),
            }
        };
        assert_eq!(
            BodyTimeout::find(&err),
            Some(BodyTimeout(BodyDeadline::Total))
        );
        // 30 s at a byte per 4 s: the clock is paused, so this is exact.
        assert_eq!(bytes, 8, "the pieces before the deadline were delivered");
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_within_both_deadlines_is_read_whole() {
        let (tx, body) = fed();
        let body = with_timeouts(body, TIMEOUTS);
        let feeder = tokio::spawn(async move {
            for part in ["{\"a\":", "1}"] {
                tokio::time::sleep(Duration::from_secs(4)).await;
                tx.send(Bytes::from(part)).await.unwrap();
            }
        });
        let read = body.collect().await.unwrap().to_bytes();
        assert_eq!(read, Bytes::from_static(b"{\"a\":1}"));
        feeder.await.unwrap();
    }

    #[test]
    fn an_empty_body_is_not_wrapped() {
        let body = with_timeouts(Body::empty(), TIMEOUTS);
        assert!(http_body::Body::is_end_stream(&body));
    }
}
