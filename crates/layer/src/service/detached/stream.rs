//! The owner's relay of an event stream: each event is given its id,
//! sent to the client, published for attachers and recorded, and the
//! stream is judged by its dialect's events before it may be stored.
//!
//! What was relayed lives in the execution ([`Relay`]), not in the relay's
//! own future: a stream cut short from outside (the deadline, a shutdown)
//! still has its events, so a charging route keeps them as the partial
//! answer (`crate::partial`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};

use super::{Decision, Detached};
use crate::config::{OutcomeUnknownMode, StreamDialect};
use crate::partial::{DeltaCount, terminal_event};
use crate::problem::Problem;
use crate::service::body::Chunk;
use crate::service::record::{Recorded, Recording, kept_headers};
use crate::sse::{EventId, EventScanner, rewrite_id};
use crate::telemetry::ReleaseReason;
use crate::verdict::{StreamJudge, StreamVerdict};

/// A stream being relayed: what a store of it needs.
pub(super) struct Relay {
    status: StatusCode,
    /// The headers stored (and sent to followers).
    headers: HeaderMap,
    recording: Recording,
    dialect: StreamDialect,
    deltas: DeltaCount,
}

impl Detached {
    /// Relays an event stream: each event gets a sequential id, is sent to
    /// the client, published for attachers and recorded. A stream whose
    /// events say it failed (`dialect`) is relayed whole but released, never
    /// stored.
    pub(super) async fn stream(
        &mut self,
        parts: http::response::Parts,
        body: Body,
        dialect: StreamDialect,
    ) -> Decision {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        let status = parts.status;
        let stored_headers = kept_headers(&parts.headers, cfg);
        // Followers get the head a replay will: the stored headers only.
        self.attachers.streaming(status, &stored_headers);
        self.client.send_head(parts);
        let max = cfg.max_stored_body;
        self.relay = Some(Relay {
            status,
            headers: stored_headers,
            recording: Recording::new(max),
            dialect,
            deltas: DeltaCount::new(dialect),
        });
        let mut scanner = EventScanner::with_limit(max);
        let mut judge = StreamJudge::new(dialect);
        let mut data = body.into_data_stream();
        let mut blocks = Vec::new();
        let mut too_large = false;
        loop {
            let end = match data.next().await {
                Some(Ok(chunk)) => match scanner.push(&chunk, &mut blocks) {
                    Ok(()) => false,
                    Err(e) => {
                        // The events completed before it still go out.
                        tracing::warn!(error = %e, events = self.events, "event never ended; key released");
                        too_large = true;
                        true
                    }
                },
                Some(Err(e)) if cfg.on_outcome_unknown == OutcomeUnknownMode::Store => {
                    // The upstream was generating when the stream broke:
                    // the work ran, at least in part, and was billed.
                    tracing::warn!(error = %e, events = self.events, "response stream broke after the request was sent");
                    return self.outcome_unknown(
                        Problem::upstream_unavailable("the response stream broke before its end")
                            .into_response(),
                        "stream",
                    );
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, events = self.events, "response stream broke; key released");
                    return Decision::Release(ReleaseReason::StreamError);
                }
                None => {
                    blocks.extend(scanner.finish());
                    true
                }
            };
            let Some(relay) = self.relay.as_mut() else {
                break;
            };
            for block in blocks.drain(..) {
                judge.observe(&block);
                relay.deltas.observe(&block);
                self.events += 1;
                let id = EventId {
                    run: self.run,
                    n: u64::try_from(self.events).unwrap_or(u64::MAX),
                };
                let event = rewrite_id(&block, id);
                match relay.recording.push(&event) {
                    Recorded::Kept => self.attachers.event(event.clone()),
                    Recorded::Overflowed => {
                        tracing::warn!(
                            max,
                            "event stream too large to store; it will not be replayable"
                        );
                        self.attachers.fail();
                    }
                    Recorded::Dropped => {}
                }
                self.client.send(Chunk::Data(event));
            }
            if end {
                break;
            }
        }
        if too_large {
            return Decision::Release(ReleaseReason::EventTooLarge);
        }
        match judge.verdict() {
            StreamVerdict::Complete => {}
            StreamVerdict::ErrorEvent => {
                tracing::warn!(
                    events = self.events,
                    "event stream carried an error event; key released"
                );
                return Decision::Release(ReleaseReason::ErrorEvent);
            }
            StreamVerdict::Unterminated if cfg.on_outcome_unknown == OutcomeUnknownMode::Store => {
                // Stopped mid-generation without saying it failed (a cut
                // that looked like a clean end): as a broken stream.
                tracing::warn!(
                    events = self.events,
                    "event stream ended without its terminal event after the request was sent"
                );
                return self.outcome_unknown(
                    Problem::upstream_unavailable("the response stream ended before its end")
                        .into_response(),
                    "stream",
                );
            }
            StreamVerdict::Unterminated => {
                tracing::warn!(
                    events = self.events,
                    "event stream ended without its terminal event; key released"
                );
                return Decision::Release(ReleaseReason::Unterminated);
            }
        }
        match self.relay.take() {
            Some(relay) => match relay.recording.finish(relay.status, relay.headers) {
                Some(stored) => Decision::Store(stored),
                None => Decision::Release(ReleaseReason::TooLarge),
            },
            None => Decision::Release(ReleaseReason::StreamError),
        }
    }

    /// The stream relayed so far as the key's partial answer, on a charging
    /// route whose stream broke (`phase`): its events, then the terminal
    /// `outcome-unknown` event, which the client and followers get now.
    /// `None` when no stream was relayed or it outgrew the stored-body
    /// limit: the answer is then the problem document.
    pub(super) fn partial(&mut self, phase: &'static str) -> Option<Decision> {
        let relay = self.relay.take()?;
        let events = u64::try_from(self.events).unwrap_or(u64::MAX);
        let tokens = relay.deltas.tokens();
        let id = EventId {
            run: self.run,
            n: events.saturating_add(1),
        };
        let terminal: Bytes = terminal_event(relay.dialect, id, events, tokens, phase);
        let stored = relay
            .recording
            .finish_with(terminal.clone(), relay.status, relay.headers)?;
        tracing::warn!(
            phase,
            events,
            tokens,
            "stream broke after the request was sent; the events relayed are kept as the key's outcome-unknown answer"
        );
        self.attachers.event(terminal.clone());
        self.client.send(Chunk::Data(terminal));
        Some(Decision::StoreUnknown(stored))
    }
}
