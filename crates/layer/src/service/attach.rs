//! Duplicates that meet their key in flight and wait for it (`Attach` and
//! `Wait` modes): they follow the owner's live stream when there is one,
//! replay the stored result once the key is DONE, take the key over if
//! the execution fails, or give up with a 409 when their wait runs out.
//!
//! A duplicate never runs the work itself while another owner holds the
//! key; this module is everything it does instead.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate_engine::{
    AttemptOutcome, Begin, BeginError, Fingerprint, Inflight, RecordState, ScopedKey, Settled,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::admit::Keyed;
use super::body::StreamBroken;
use super::detached::own;
use super::inner::Inner;
use crate::live::{Joined, LiveFollower, Next};
use crate::problem::Problem;
use crate::refusal::Log;
use crate::replay::mark;
use crate::shared::Shared;
use crate::sse::STREAM_RESTARTED;
use crate::stored::{StoredBody, StoredResponse};
use crate::telemetry::{RequestOutcome, counted};

/// Joins an execution in flight: its live stream if this process runs it
/// and it streams, otherwise its stored result once DONE. Takes the key over
/// if that execution fails. (`Wait` is this without live streams.)
pub(super) async fn attach<S: Inner>(
    shared: Arc<Shared>,
    inner: S,
    keyed: Keyed,
    mut inflight: Inflight,
    max: Duration,
) -> Response {
    let deadline = Instant::now() + max;
    // The last look at the store failed: the store, not the owner, is what
    // keeps this duplicate waiting.
    let mut store_error: Option<idemgate_engine::StoreError> = None;
    loop {
        // Another process (or the instant before the owner registers):
        // look at the store in short slices, and at the registry between.
        let mut slice = Duration::from_millis(100);
        let fence = match inflight.record().state {
            RecordState::Pending { fence, .. } => fence,
            RecordState::Done { .. } => 0,
        };
        match shared.live.join(&keyed.scoped, fence, deadline).await {
            Joined::Streaming {
                status,
                headers,
                follow,
            } => {
                let attached = AttemptOutcome::Attached;
                inflight.note(attached, Some(status.as_u16())).await;
                // Tokens saved are counted when the stored result is
                // replayed; a joined live stream has no stored usage yet.
                shared
                    .metrics
                    .request(counted(attached), Some(&keyed.scoped));
                let head = Head {
                    status,
                    headers,
                    run: fence,
                };
                return attached_response(&shared, &keyed, head, follow, max);
            }
            // The owner stores before answering: wait for DONE.
            Joined::NotStreaming => slice = max,
            Joined::Unknown => {}
            Joined::Failed(e) => return store_failed(&shared, &keyed, &e),
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return match store_error {
                Some(e) => store_failed(&shared, &keyed, &e),
                None => conflict(&shared, &keyed, &inflight).await,
            };
        }
        let looked = inflight.settled(slice.min(remaining)).await;
        if looked.is_ok() {
            store_error = None;
        }
        match looked {
            Ok(Settled::StillPending) => {}
            Ok(Settled::Done(record)) if record.fingerprint == keyed.fingerprint => {
                let attached = AttemptOutcome::Attached;
                inflight.note(attached, None).await;
                return keyed.replay(&shared, &record, counted(attached));
            }
            Ok(Settled::Done(_)) => return keyed.mismatch(&shared),
            Ok(Settled::Free) => {
                match shared.engine.begin(&keyed.scoped, &keyed.fingerprint).await {
                    Ok(Begin::Owner(guard)) => return own(shared, inner, keyed, guard).await,
                    Ok(Begin::Done(record)) => {
                        return keyed.replay(&shared, &record, RequestOutcome::Replayed);
                    }
                    Ok(Begin::Inflight(next)) => inflight = next,
                    Err(BeginError::Mismatch) => return keyed.mismatch(&shared),
                    Err(e) => return store_failed(&shared, &keyed, &e),
                }
            }
            // The owner may be holding its result through the same outage:
            // keep waiting (the next turn looks at what it holds).
            Err(e) => {
                tracing::debug!(error = %e, "store failed while waiting; waiting on");
                store_error = Some(e);
                tokio::time::sleep(slice.min(remaining).min(Duration::from_millis(100))).await;
            }
        }
    }
}

/// Gives up on a key in flight (refused, or the wait ran out). The meeting
/// itself was counted when it happened.
pub(super) async fn conflict(shared: &Shared, keyed: &Keyed, inflight: &Inflight) -> Response {
    inflight.record_conflict().await;
    keyed.refuse(
        shared,
        RequestOutcome::Conflict,
        Log::Info("idempotency key in flight; request refused"),
        Problem::inflight(shared.latency.poll_interval(inflight.retry_after())),
    )
}

fn store_failed(shared: &Shared, keyed: &Keyed, error: &dyn Display) -> Response {
    keyed.store_unavailable(shared, "store failed while attaching", error)
}

/// The head of the live stream a duplicate joins, and its run.
struct Head {
    status: StatusCode,
    headers: HeaderMap,
    /// The owner's fence: the run its event ids name.
    run: u64,
}

fn attached_response(
    shared: &Arc<Shared>,
    keyed: &Keyed,
    head: Head,
    follow: Box<dyn LiveFollower>,
    wait: Duration,
) -> Response {
    // Resumes within this run only; a client that read another run gets
    // this one whole, and is told so.
    let (skip, restarted) = keyed.resume.skip_for(Some(head.run));
    let following = Following {
        follow,
        cursor: skip,
        first: skip,
        sent: Sha256::new(),
        shared: Arc::clone(shared),
        key: keyed.scoped.clone(),
        fingerprint: keyed.fingerprint,
        wait,
        done: false,
    };
    let stream = futures_util::stream::unfold(Some(following), |state| async move {
        let mut f = state?;
        match f.step().await {
            Some(Ok(chunk)) => Some((Ok(chunk), Some(f))),
            Some(Err(broken)) => {
                super::body::before_error().await;
                Some((Err(broken), None))
            }
            None => None,
        }
    });
    let mut res = Response::new(Body::from_stream(stream));
    *res.status_mut() = head.status;
    *res.headers_mut() = head.headers;
    if restarted {
        res.headers_mut()
            .insert(STREAM_RESTARTED, HeaderValue::from_static("true"));
    }
    mark(res, true)
}

/// An attached client's stream: live events, and the stored record when
/// the live feed cannot say more.
struct Following {
    follow: Box<dyn LiveFollower>,
    /// Events the client has (its `Last-Event-ID`, then what was sent).
    cursor: usize,
    /// The cursor the client came with.
    first: usize,
    /// Hash of the events sent, to check them against a stored result.
    sent: Sha256,
    shared: Arc<Shared>,
    key: ScopedKey,
    fingerprint: Fingerprint,
    /// How long to wait for the record to settle once the feed broke.
    wait: Duration,
    /// The rest came from the stored record: nothing more to send.
    done: bool,
}

impl Following {
    /// The next chunk for the client, `None` at a clean end.
    async fn step(&mut self) -> Option<Result<Bytes, StreamBroken>> {
        if self.done {
            return None;
        }
        loop {
            match self.follow.next(&mut self.cursor).await {
                Next::Events(chunk) => {
                    self.sent.update(&chunk);
                    return Some(Ok(chunk));
                }
                Next::End => return None,
                Next::Failed => return Some(Err(StreamBroken)),
                Next::Unsure => match self.rest_from_store().await {
                    Ok(Some(rest)) => {
                        self.done = true;
                        return Some(Ok(rest));
                    }
                    Ok(None) => {}
                    Err(broken) => return Some(Err(broken)),
                },
            }
        }
    }

    /// Looks at the record: `Ok(None)` while it is PENDING (follow on),
    /// the events after the cursor once it is DONE — provided the events
    /// already sent are the stored ones — and an error otherwise.
    async fn rest_from_store(&self) -> Result<Option<Bytes>, StreamBroken> {
        let store = self.shared.engine.store();
        let record = match store.get(&self.key).await {
            Ok(Some(record)) => record,
            Ok(None) => return Err(StreamBroken),
            Err(e) => {
                tracing::warn!(error = %e, "store failed while following a stream");
                return Err(StreamBroken);
            }
        };
        if record.fingerprint != self.fingerprint {
            return Err(StreamBroken);
        }
        let Some(payload) = record.payload() else {
            store
                .changed(&self.key, self.wait.min(Duration::from_millis(100)))
                .await;
            return Ok(None);
        };
        let stored = StoredResponse::decode(payload).map_err(|_| StreamBroken)?;
        let StoredBody::Events(events) = &stored.body else {
            return Err(StreamBroken);
        };
        let sent = events.get(self.first..self.cursor).ok_or(StreamBroken)?;
        let mut check = Sha256::new();
        for e in sent {
            check.update(e);
        }
        if check.finalize() != self.sent.clone().finalize() {
            tracing::warn!("the stored stream is not the one followed; stream ended");
            return Err(StreamBroken);
        }
        Ok(Some(stored.body_bytes(self.cursor)))
    }
}
