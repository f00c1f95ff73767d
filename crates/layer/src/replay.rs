//! Answers from stored results, and the header that tells a client whether
//! its response was replayed or executed now.
//!
//! Both the request path (a retry of a settled key, a duplicate that waited)
//! and the operation resource (`GET` of a finished operation) replay, so
//! replaying lives here, below both.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use idemgate_engine::{Record, ScopedKey};

use crate::problem::Problem;
use crate::refusal::{Log, refuse};
use crate::shared::Shared;
use crate::sse::{Resume, STREAM_RESTARTED, run_of};
use crate::stored::{DecodeError, StoredBody, StoredResponse};
use crate::telemetry::RequestOutcome;

/// Response header saying whether the response was replayed.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Response header set (`false`) on an owner's result that the store never
/// took (the lease ran out during a store outage before the write landed,
/// or the store refused it): the answer is delivered rather than lost, but
/// it is not the key's stored answer, and a retry may run the work again.
pub const IDEMPOTENT_STORED: HeaderName = HeaderName::from_static("idempotent-stored");

/// Marks `res` as replayed (`true`) or executed now (`false`).
pub(crate) fn mark(mut res: Response, replayed: bool) -> Response {
    let value = if replayed { "true" } else { "false" };
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static(value));
    res
}

/// Answers `key` from a DONE record, counting a hit and the tokens saved;
/// a stored stream starts where `resume` says, if it names this stream's
/// run (the client has the events before), and is sent whole, marked
/// restarted, if it names another.
pub(crate) fn replay_stored(
    shared: &Shared,
    record: &Record,
    key: &ScopedKey,
    resume: Resume,
    outcome: RequestOutcome,
) -> Response {
    replay_payload(shared, record.payload(), key, resume, outcome)
}

/// As [`replay_stored`], from an encoded result (a DONE record's payload).
pub(crate) fn replay_payload(
    shared: &Shared,
    payload: Option<&Bytes>,
    key: &ScopedKey,
    resume: Resume,
    outcome: RequestOutcome,
) -> Response {
    let decoded = payload
        .ok_or(DecodeError::Truncated)
        .and_then(StoredResponse::decode);
    match decoded {
        Ok(stored) => {
            tracing::info!(
                outcome = outcome.as_str(),
                status = stored.status.as_u16(),
                "answered from the stored result"
            );
            shared.metrics.replayed(outcome, key, stored.usage);
            replay_response(&stored, resume)
        }
        Err(e) => refuse(
            &shared.metrics,
            RequestOutcome::StoreError,
            Some(key),
            Log::Error("stored result cannot be decoded", &e),
            Problem::stored_result_unreadable(),
        ),
    }
}

fn replay_response(stored: &StoredResponse, resume: Resume) -> Response {
    let (skip, restarted) = match &stored.body {
        StoredBody::Events(events) => resume.skip_for(run_of(events)),
        StoredBody::Bytes(_) => (0, false),
    };
    let mut res = Response::new(Body::from(stored.body_bytes(skip)));
    *res.status_mut() = stored.status;
    *res.headers_mut() = stored.headers.clone();
    if restarted {
        res.headers_mut()
            .insert(STREAM_RESTARTED, HeaderValue::from_static("true"));
    }
    mark(res, true)
}
