//! The retry loop: a [`Prepared`] request sent attempt after attempt with
//! the same key until a success, a final answer or the policy's limits.
//!
//! Kept apart from the builders because this is where the contract's client
//! half lives: which outcomes are retried, whose delay wins, and what is
//! logged for each attempt.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode, Url};

use crate::attempt::{AttemptEnd, GiveUpReason, Retrier};
use crate::error::{Error, ErrorResponse, GaveUp, KEY_MISMATCH, MAX_ERROR_BODY, Rejected};
use crate::headers::LAST_EVENT_ID;
use crate::key::IdempotencyKey;
use crate::policy::{retryable_status, server_delay};

/// The finishing step of an attempt that got a success: read the body
/// whole, within the attempt's timeout.
pub(crate) async fn read_whole(
    response: reqwest::Response,
) -> Result<(StatusCode, HeaderMap, Bytes), reqwest::Error> {
    let status = response.status();
    let headers = response.headers().clone();
    Ok((status, headers, response.bytes().await?))
}

/// The finishing step of an attempt that got a success: keep the head, the
/// body is read as a stream.
pub(crate) async fn keep_head(
    response: reqwest::Response,
) -> Result<reqwest::Response, reqwest::Error> {
    Ok(response)
}

/// How one attempt ended, before the policy judges it.
enum Attempted<T> {
    Success(StatusCode, T),
    Failed(ErrorResponse),
    Timeout,
    Connect(reqwest::Error),
    Transport(reqwest::Error),
    /// The request itself is unusable (e.g. an `https` URL without the
    /// `tls` feature): not worth retrying.
    Unusable(reqwest::Error),
}

/// A request ready to be sent any number of times, identically.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) http: reqwest::Client,
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Bytes>,
    pub(crate) key: IdempotencyKey,
}

impl Prepared {
    /// Attempts until a success (finished by `finish`), a final answer,
    /// or the policy's limits. The successful attempt is logged last.
    pub(crate) async fn until_success<T, F, Fut>(
        &self,
        retrier: &mut Retrier,
        last_event_id: Option<&str>,
        finish: F,
    ) -> Result<T, Error>
    where
        F: Fn(reqwest::Response) -> Fut,
        Fut: Future<Output = Result<T, reqwest::Error>>,
    {
        loop {
            let timeout = retrier.attempt_timeout();
            let (outcome, asked, response, error) =
                match self.attempt(timeout, last_event_id, &finish).await {
                    Attempted::Success(status, got) => {
                        retrier.last(AttemptEnd::Status(status));
                        return Ok(got);
                    }
                    Attempted::Failed(response) => {
                        let outcome = AttemptEnd::Status(response.status);
                        if !retryable_status(response.status, &response.headers) {
                            retrier.last(outcome);
                            return Err(self.rejected(response, retrier));
                        }
                        let asked = server_delay(&response.headers, SystemTime::now());
                        (outcome, asked, Some(response), None)
                    }
                    Attempted::Timeout => (AttemptEnd::Timeout, None, None, None),
                    Attempted::Connect(e) => (AttemptEnd::Connect, None, None, Some(e)),
                    Attempted::Transport(e) => {
                        (AttemptEnd::Transport(e.to_string()), None, None, Some(e))
                    }
                    Attempted::Unusable(e) => return Err(Error::Build(e)),
                };
            match retrier.failed(outcome, asked) {
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(reason) => return Err(self.gave_up(retrier, reason, response, error)),
            }
        }
    }

    pub(crate) fn gave_up(
        &self,
        retrier: &Retrier,
        reason: GiveUpReason,
        last_response: Option<ErrorResponse>,
        last_error: Option<reqwest::Error>,
    ) -> Error {
        Error::GaveUp(Box::new(GaveUp {
            key: self.key.clone(),
            reason,
            attempts: retrier.log().to_vec(),
            last_response,
            last_error,
        }))
    }

    fn rejected(&self, response: ErrorResponse, retrier: &Retrier) -> Error {
        let mismatch = response.status == StatusCode::UNPROCESSABLE_ENTITY
            && response
                .problem
                .as_ref()
                .is_some_and(|p| p.slug() == KEY_MISMATCH);
        let rejected = Box::new(Rejected {
            key: self.key.clone(),
            response,
            attempts: retrier.log().to_vec(),
        });
        if mismatch {
            Error::KeyReused(rejected)
        } else {
            Error::Rejected(rejected)
        }
    }

    /// One attempt: send, then `finish` a success or read the body of a
    /// failure, all within `timeout`.
    async fn attempt<T, F, Fut>(
        &self,
        timeout: Option<Duration>,
        last_event_id: Option<&str>,
        finish: &F,
    ) -> Attempted<T>
    where
        F: Fn(reqwest::Response) -> Fut,
        Fut: Future<Output = Result<T, reqwest::Error>>,
    {
        let mut request = reqwest::Request::new(self.method.clone(), self.url.clone());
        *request.headers_mut() = self.headers.clone();
        if let Some(id) = last_event_id {
            // Checked before: the caller's id when the request was built,
            // a stream's id before resuming (see `sendable_id`).
            if let Ok(v) = HeaderValue::from_bytes(id.as_bytes()) {
                request
                    .headers_mut()
                    .insert(HeaderName::from_static(LAST_EVENT_ID), v);
            }
        }
        if let Some(body) = &self.body {
            *request.body_mut() = Some(body.clone().into());
        }
        let work = async {
            let response = match self.http.execute(request).await {
                Ok(r) => r,
                Err(e) if e.is_builder() => return Attempted::Unusable(e),
                Err(e) if e.is_connect() => return Attempted::Connect(e),
                Err(e) if e.is_timeout() => return Attempted::Timeout,
                Err(e) => return Attempted::Transport(e),
            };
            let status = response.status();
            if status.is_success() {
                return match finish(response).await {
                    Ok(got) => Attempted::Success(status, got),
                    Err(e) => Attempted::Transport(e),
                };
            }
            let headers = response.headers().clone();
            match read_at_most(response, MAX_ERROR_BODY).await {
                Ok((body, truncated)) => {
                    Attempted::Failed(ErrorResponse::new(status, headers, body, truncated))
                }
                Err(e) => Attempted::Transport(e),
            }
        };
        match timeout {
            Some(t) => tokio::time::timeout(t, work)
                .await
                .unwrap_or(Attempted::Timeout),
            None => work.await,
        }
    }
}

/// The first `max` bytes of `response`'s body, and whether there was more.
/// Reading stops there: the rest is never read (dropping the response
/// closes its connection).
async fn read_at_most(
    mut response: reqwest::Response,
    max: usize,
) -> Result<(Bytes, bool), reqwest::Error> {
    let hint = response
        .content_length()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    let mut body = BytesMut::with_capacity(hint.min(max));
    while let Some(chunk) = response.chunk().await? {
        let room = max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return Ok((body.freeze(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), false))
}

/// Whether an event id can be sent as `Last-Event-ID` (any text without
/// control characters other than tab; UTF-8 goes as raw bytes).
pub(crate) fn sendable_id(id: &str) -> bool {
    HeaderValue::from_bytes(id.as_bytes()).is_ok()
}
