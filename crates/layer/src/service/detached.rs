//! The owner's work, detached from its client: it holds the key's lease,
//! calls the inner service, reads (or relays) its response, stores the
//! result or releases the key, and only then tells the client and any
//! attached duplicate how it ended.
//!
//! A client that times out or disconnects does not cancel the work: the
//! work runs inside the client's request future only until it answers the
//! client, and moves to a task of its own (`Detachable`) when the request
//! is dropped or the answer is a stream. It finishes (bounded by
//! `completion_timeout`, counted from the call or, with
//! `CompletionClock::Sent`, from when the inner service says it sent the
//! request on), is stored DONE, and the client's retry is a replay instead
//! of a second execution (and a second bill). A non-streaming result is
//! stored *before* the client is answered, and a stream's end is sent only
//! after it is stored, so a retry sent right after an answer always
//! replays.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::future::Either;
use futures_util::{FutureExt, StreamExt};
use http::{Request, StatusCode, header};
use idemgate_engine::{AttemptOutcome, Completion, Fenced, LeaseGuard, ScopedKey};
use idemgate_telemetry::RunningKey;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use super::admit::Keyed;
use super::body::Chunk;
use super::detachable::Detachable;
use super::inner::{self, Inner, OutcomeUnknown, RetryableFailure, SendSignal};
use super::listeners::{Attachers, Client};
use super::record::kept_headers;
use super::traceparent::continue_trace;
use crate::config::{CompletionClock, OnInflight, OutcomeUnknownMode};
use crate::live::LiveStream;
use crate::operations;
use crate::problem::Problem;
use crate::replay::mark;
use crate::shared::Shared;
use crate::sse::{Resume, STREAM_RESTARTED, is_event_stream};
use crate::stored::{StoredBody, StoredResponse, usage_of_json};
use crate::telemetry::{ReleaseReason, RequestOutcome, counted};

mod stream;

/// Runs the work as the key's owner, detachable from the client, and
/// answers the client (or, with `Prefer: respond-async`, points it at the
/// operation).
pub(super) async fn own<S: Inner>(
    shared: Arc<Shared>,
    inner: S,
    keyed: Keyed,
    guard: LeaseGuard,
) -> Response {
    let cfg = &shared.config;
    let publisher = matches!(cfg.on_inflight, OnInflight::Attach(_)).then(|| {
        shared.live.publish(LiveStream {
            key: keyed.scoped.clone(),
            fence: guard.lease().fence,
            horizon: cfg.completion_timeout,
        })
    });
    let (reply, replied) = oneshot::channel();
    let task = Detached {
        _running: shared.metrics.running(&keyed.scoped),
        shared: Arc::clone(&shared),
        key: keyed.scoped.clone(),
        client: Client::new(reply),
        attachers: Attachers::new(publisher),
        run: guard.lease().fence,
        events: 0,
        relay: None,
    };
    // A panic ends the work as a spawned task's would: its state (the
    // lease guard, the client's reply) is dropped, so the key is released
    // and the client answered 500. Caught here, it does not unwind through
    // the client's request.
    let run = AssertUnwindSafe(task.run(inner, keyed.request(), guard).in_current_span())
        .catch_unwind()
        .map(|ended| {
            if ended.is_err() {
                idemgate_telemetry::Telemetry::shared().panicked("execution");
                tracing::error!("the execution panicked; key released");
            }
        });
    let mut work = Detachable::new(&shared.tracker, Box::pin(run));
    if keyed.prefer_async {
        work.detach();
        // Counted when the execution ends, like any owner's.
        return operations::accepted_for(cfg, &keyed.scoped.key, &keyed.fingerprint);
    }
    let mut replied = std::pin::pin!(replied);
    let reply = tokio::select! {
        biased;
        reply = &mut replied => {
            // A stream's head, or an answer sent just before the work's
            // last step: finish here if that step is all that is left.
            if (&mut work).now_or_never().is_none() {
                work.detach();
            }
            reply
        }
        () = &mut work => replied.await,
    };
    let mut res = match reply {
        Ok(res) => res,
        Err(_) => Problem::internal().into_response(),
    };
    // A client resuming a run that broke gets this new run whole: say so,
    // so it does not take these events for the rest of the old ones.
    if keyed.resume != Resume::Whole
        && is_event_stream(res.headers().get(http::header::CONTENT_TYPE))
    {
        res.headers_mut()
            .insert(STREAM_RESTARTED, http::HeaderValue::from_static("true"));
    }
    res
}

/// What cut an execution short before it ended by itself.
enum Cut {
    /// `completion_timeout` ran out.
    Deadline,
    /// The layer shut down and its grace period ran out.
    Shutdown,
    /// The work panicked (the payload, to go on unwinding with).
    Panic(Box<dyn std::any::Any + Send>),
}

/// How a detached execution ends for the store.
enum Decision {
    /// Store this response (PENDING → DONE).
    Store(StoredResponse),
    /// Store this `outcome-unknown` problem as the key's final answer
    /// (PENDING → DONE, the attempt recorded as outcome unknown).
    StoreUnknown(StoredResponse),
    /// Give the key back, for this reason.
    Release(ReleaseReason),
}

/// One detached execution.
struct Detached {
    /// Lists the key in flight on the dashboard while the execution lives.
    _running: RunningKey,
    shared: Arc<Shared>,
    /// The key this execution owns (for the requests-per-key count).
    key: ScopedKey,
    /// Where the owner's client stands.
    client: Client,
    /// Duplicates following the execution live.
    attachers: Attachers,
    /// The run this execution is: its lease's fence, named by its events'
    /// ids.
    run: u64,
    /// Events relayed so far (0 unless the response is a stream).
    events: usize,
    /// The stream being relayed, if the response is one.
    relay: Option<stream::Relay>,
}

impl Detached {
    async fn run<S: Inner>(mut self, inner: S, mut request: Request<Body>, guard: LeaseGuard) {
        let shared = Arc::clone(&self.shared);
        let started = tokio::time::Instant::now();
        let limit = shared.config.completion_timeout;
        let keeps_unknown = shared.config.on_outcome_unknown == OutcomeUnknownMode::Store;
        // The deadline, and whether the request may have reached the
        // upstream: with `CompletionClock::Call` the inner service is
        // trusted to act as soon as it is called; with `Sent`, from its
        // signal on.
        let (deadline, sent) = match shared.config.completion_clock {
            CompletionClock::Call => (
                Either::Left(tokio::time::sleep(limit)),
                Arc::new(AtomicBool::new(true)),
            ),
            CompletionClock::Sent => {
                let (signal, signalled, fired) = SendSignal::new();
                request.extensions_mut().insert(signal);
                let deadline = async move {
                    // Unfired and dropped: nothing was sent; count from now.
                    let from = signalled.await.unwrap_or_else(|_| Instant::now());
                    tokio::time::sleep_until(from + limit).await;
                };
                (Either::Right(deadline), fired)
            }
        };
        let decision = {
            // A panic after the request was sent cuts the work short too
            // (below); before, or on a route that releases, it goes on to
            // the catch in `own`, which releases the key.
            let work = AssertUnwindSafe(self.execute(inner, request)).catch_unwind();
            tokio::select! {
                d = work => d.map_err(Cut::Panic),
                () = deadline => Err(Cut::Deadline),
                () = shared.cancel.cancelled() => Err(Cut::Shutdown),
            }
        };
        let shut_down = matches!(decision, Err(Cut::Shutdown));
        let decision = decision.unwrap_or_else(|cut| {
            let was_sent = sent.load(Ordering::Relaxed);
            match cut {
                // A charging route's request cut short after it was sent
                // (out of time, or a shutdown past its grace): the upstream
                // may have run it, so it is kept as outcome-unknown, like a
                // proxy's own timeout. Releasing it would let the retry
                // charge a second time.
                Cut::Deadline if was_sent && keeps_unknown => {
                    let timeout = Problem::upstream_timeout("total").into_response();
                    self.outcome_unknown(timeout, "total")
                }
                Cut::Shutdown if was_sent && keeps_unknown => {
                    let cut = Problem::shutting_down().into_response();
                    self.outcome_unknown(cut, "shutdown")
                }
                Cut::Panic(_) if was_sent && keeps_unknown => {
                    idemgate_telemetry::Telemetry::shared().panicked("execution");
                    tracing::error!("the execution panicked after the request was sent");
                    self.outcome_unknown(Problem::internal().into_response(), "panic")
                }
                Cut::Deadline => Decision::Release(ReleaseReason::CompletionTimeout),
                Cut::Shutdown => Decision::Release(ReleaseReason::Shutdown),
                Cut::Panic(panic) => std::panic::resume_unwind(panic),
            }
        });
        // A shutdown cut the work short: its duration says nothing about
        // the route.
        if !shut_down {
            shared.latency.observe(started.elapsed());
        }
        self.finish(decision, guard).await;
    }

    /// Calls the inner service and reads its response; returns what to do
    /// with the key. Relays stream events to the client as they arrive.
    async fn execute<S: Inner>(&mut self, inner: S, mut request: Request<Body>) -> Decision {
        let dialect = self.shared.config.stream_dialect_of(request.uri().path());
        // Inside the request span: the upstream becomes its child.
        continue_trace(request.headers_mut());
        let res = inner::call(inner, request).await;
        let status = res.status();
        self.client.answered(status.as_u16());
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        if let Some(unknown) = res.extensions().get::<OutcomeUnknown>().copied() {
            self.attachers.not_streaming();
            return self.outcome_unknown(res, unknown.phase);
        }
        if let Some(failure) = res.extensions().get::<RetryableFailure>() {
            tracing::info!(phase = failure.phase, "upstream failed; key released");
            self.attachers.not_streaming();
            self.client.hold(mark(res, false));
            return Decision::Release(ReleaseReason::RetryableFailure);
        }
        if cfg.is_retryable(status.as_u16()) {
            tracing::info!(status = status.as_u16(), "retryable status; key released");
            self.attachers.not_streaming();
            self.client.hold(mark(res, false));
            return Decision::Release(ReleaseReason::RetryableStatus);
        }
        let (mut parts, body) = res.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::TRANSFER_ENCODING);
        if is_event_stream(parts.headers.get(header::CONTENT_TYPE)) {
            return self.stream(parts, body, dialect).await;
        }
        self.attachers.not_streaming();
        let max = cfg.max_stored_body;
        let mut data = body.into_data_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = data.next().await {
            match chunk {
                Ok(chunk) if buf.len().saturating_add(chunk.len()) > max => {
                    // Too large to store: give the client the response as it
                    // comes (after the key is released), not stored.
                    buf.extend_from_slice(&chunk);
                    let head =
                        futures_util::stream::once(
                            async move { Ok::<_, axum::Error>(buf.freeze()) },
                        );
                    let body = Body::from_stream(head.chain(data));
                    self.client
                        .hold(mark(Response::from_parts(parts, body), false));
                    self.client.mark_not_stored();
                    tracing::warn!(max, "response body too large to store; key released");
                    return Decision::Release(ReleaseReason::TooLarge);
                }
                Ok(chunk) => buf.extend_from_slice(&chunk),
                Err(e) if cfg.on_outcome_unknown == OutcomeUnknownMode::Store => {
                    // The upstream answered, then broke: it ran, at least
                    // in part; a charging route keeps that as the answer.
                    tracing::warn!(error = %e, "response body failed after the request was sent");
                    let res =
                        Problem::upstream_unavailable("the response body broke before its end")
                            .into_response();
                    return self.outcome_unknown(res, "body");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "response body failed; key released");
                    self.client.hold(
                        Problem::upstream_unavailable("the response body broke before its end")
                            .into_response(),
                    );
                    return Decision::Release(ReleaseReason::BodyError);
                }
            }
        }
        let body = buf.freeze();
        let stored = StoredResponse {
            status,
            headers: kept_headers(&parts.headers, cfg),
            usage: usage_of_json(&body),
            body: StoredBody::Bytes(body.clone()),
        };
        self.client
            .hold(mark(Response::from_parts(parts, Body::from(body)), false));
        Decision::Store(stored)
    }

    /// The request was sent and then failed: the work may have run. A
    /// charging route keeps an `outcome-unknown` answer as the key's final
    /// answer (the client gets it now, every retry replayed): a stream
    /// already relayed, its events and a terminal error event
    /// ([`Detached::partial`]); otherwise the problem document. Any other
    /// route releases the key and hands the client the inner service's
    /// response.
    fn outcome_unknown(&mut self, res: Response, phase: &'static str) -> Decision {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        shared.metrics.outcome_unknown();
        match cfg.on_outcome_unknown {
            OutcomeUnknownMode::Release => {
                tracing::warn!(
                    phase,
                    "upstream failed after the request was sent; outcome unknown, key released"
                );
                self.client.hold(mark(res, false));
                Decision::Release(ReleaseReason::OutcomeUnknown)
            }
            OutcomeUnknownMode::Store => {
                if let Some(partial) = self.partial(phase) {
                    return partial;
                }
                // No stream to keep (or too large to store): followers
                // are told it broke, and the answer is the problem.
                self.attachers.fail();
                tracing::warn!(
                    phase,
                    "upstream failed after the request was sent; outcome unknown, stored as the key's answer"
                );
                let status = if res.status() == StatusCode::GATEWAY_TIMEOUT {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let problem = Problem::outcome_unknown(status, phase);
                let body = Bytes::from(problem.body().to_string());
                let (parts, _) = problem.into_response().into_parts();
                let stored = StoredResponse {
                    status,
                    headers: kept_headers(&parts.headers, cfg),
                    usage: None,
                    body: StoredBody::Bytes(body.clone()),
                };
                self.client
                    .hold(mark(Response::from_parts(parts, Body::from(body)), false));
                Decision::StoreUnknown(stored)
            }
        }
    }

    /// Writes the outcome to the store, then tells the client (and
    /// attachers): a retry arriving after the answer finds the key settled.
    async fn finish(mut self, decision: Decision, guard: LeaseGuard) {
        let shared = Arc::clone(&self.shared);
        let metrics = &shared.metrics;
        let status = self.client.status();
        let unknown = matches!(decision, Decision::StoreUnknown(_));
        match decision {
            Decision::Store(mut stored) | Decision::StoreUnknown(mut stored) => {
                // A broken stream kept as its partial answer: its client
                // reads it to the end like any stored stream.
                let partial = unknown && matches!(stored.body, StoredBody::Events(_));
                if !shared.config.store_body {
                    // Minimal data: the retry learns that the operation
                    // ran (status, headers), not what it answered; an
                    // outcome-unknown answer keeps what says so.
                    stored.body = match stored.body {
                        StoredBody::Bytes(_) if !unknown => StoredBody::Bytes(Bytes::new()),
                        StoredBody::Events(events) if unknown => {
                            StoredBody::Events(events.last().cloned().into_iter().collect())
                        }
                        StoredBody::Events(_) => StoredBody::Events(Vec::new()),
                        body @ StoredBody::Bytes(_) => body,
                    };
                }
                // The timeline notes the status of the stored answer.
                let status = if unknown {
                    Some(stored.status.as_u16())
                } else {
                    status
                };
                let mut stored_it = false;
                let outcome = match stored.encode() {
                    Ok(payload) => {
                        // Held by this execution alone: the key stays
                        // PENDING, and a retry meanwhile is one in flight
                        // (wait, attach or 409), never answered from here.
                        let mut held = |e: &idemgate_engine::StoreError| {
                            metrics.completion_held();
                            tracing::warn!(
                                key = %self.key.key,
                                error = %e,
                                "result not stored yet; held in memory, lease kept, retrying"
                            );
                        };
                        let how = if unknown {
                            Completion::outcome_unknown(status)
                        } else {
                            Completion::result(status)
                        };
                        let written = guard.complete(payload, how.holding(&mut held)).await;
                        stored_it = matches!(written, Ok(Fenced::Applied));
                        match written {
                            Ok(Fenced::Applied) if unknown => {
                                tracing::info!(
                                    status,
                                    "outcome unknown; stored as the key's answer"
                                );
                                counted(AttemptOutcome::OutcomeUnknown)
                            }
                            Ok(Fenced::Applied) => {
                                tracing::info!(status, "executed; result stored");
                                counted(AttemptOutcome::Executed)
                            }
                            Ok(Fenced::Stale) => {
                                tracing::warn!("lease lost before completion; result not stored");
                                // The key's answer is another's, or none
                                // yet: the client is not handed this one
                                // as if it were (its retry gets the key's).
                                self.client
                                    .replace_held(Problem::lease_lost().into_response());
                                counted(AttemptOutcome::Fenced)
                            }
                            Err(e) => {
                                tracing::warn!(
                                    key = %self.key.key,
                                    error = %e,
                                    "result not stored before the lease ran out; key released, the result delivered marked not stored"
                                );
                                // Not discarded, and not passed off as the
                                // key's answer: a retry may run again.
                                self.client.mark_not_stored();
                                RequestOutcome::StoreError
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "result cannot be encoded; key released");
                        self.client.mark_not_stored();
                        release(guard, status).await;
                        metrics.released(ReleaseReason::Encode);
                        RequestOutcome::Failed
                    }
                };
                // Counted before the client hears the end.
                metrics.request(outcome, Some(&self.key));
                // Followers are told the stream is the key's answer only
                // when it is: a fenced write (another owner's answer is
                // the key's) or one the lease outlived (the key released)
                // ends their streams as broken, so they retry and get what
                // the store holds.
                if stored_it {
                    self.attachers.complete();
                } else {
                    self.attachers.fail();
                }
                // A stream ends cleanly only when it is the key's stored
                // answer: a broken one kept as its partial answer (its
                // terminal event sent) included, a fenced one or one the
                // store never took not. A stream whose stored answer is
                // the problem document (too large to keep) breaks.
                self.client.send(if stored_it && (partial || !unknown) {
                    Chunk::End
                } else {
                    Chunk::Abort
                });
                self.client.answer(Problem::internal);
            }
            Decision::Release(reason) => {
                release(guard, status).await;
                metrics.released(reason);
                if self.events > 0 && !reason.delivered() {
                    metrics.events_lost(self.events);
                }
                // A response too large to store was still delivered whole.
                let outcome = if reason.delivered() {
                    RequestOutcome::Executed
                } else {
                    RequestOutcome::Failed
                };
                metrics.request(outcome, Some(&self.key));
                self.attachers.fail();
                self.client.send(Chunk::Abort);
                self.client.answer(|| fallback(reason));
            }
        }
    }
}

/// What a client still waiting for its response is told when the key is
/// released before anything was held for it.
fn fallback(reason: ReleaseReason) -> Problem {
    match reason {
        ReleaseReason::CompletionTimeout => Problem::upstream_timeout("total"),
        ReleaseReason::Shutdown => Problem::shutting_down(),
        ReleaseReason::RetryableFailure
        | ReleaseReason::RetryableStatus
        | ReleaseReason::OutcomeUnknown
        | ReleaseReason::TooLarge
        | ReleaseReason::BodyError
        | ReleaseReason::StreamError
        | ReleaseReason::ErrorEvent
        | ReleaseReason::Unterminated
        | ReleaseReason::EventTooLarge
        | ReleaseReason::Encode => Problem::upstream_unavailable("the upstream response failed"),
    }
}

async fn release(guard: LeaseGuard, status: Option<u16>) {
    if let Err(e) = guard.release(status).await {
        tracing::warn!(error = %e, "release failed; the key frees itself when its lease expires");
    }
}
