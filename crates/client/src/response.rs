//! A successful, whole response.

use std::fmt;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;

use crate::attempt::ClientAttempt;
use crate::error::Error;
use crate::headers::replayed;
use crate::key::IdempotencyKey;

/// A success (2xx) response, body read whole.
#[derive(Clone)]
pub struct Response {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) key: IdempotencyKey,
    pub(crate) attempts: Vec<ClientAttempt>,
}

impl Response {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// `true` when this is a stored answer (`Idempotent-Replayed: true`):
    /// the work ran once before, maybe during an attempt that timed out,
    /// and this attempt did not run it again. `false` when this attempt
    /// executed it (or the server is not an idemgate gateway).
    pub fn replayed(&self) -> bool {
        replayed(&self.headers)
    }

    /// The idempotency key this operation was sent with, on every attempt.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Every attempt, this response's last.
    pub fn attempts(&self) -> &[ClientAttempt] {
        &self.attempts
    }

    /// The body.
    pub fn bytes(&self) -> &Bytes {
        &self.body
    }

    /// The body, taken.
    pub fn into_bytes(self) -> Bytes {
        self.body
    }

    /// The body as text.
    ///
    /// # Errors
    /// [`Error::Utf8`] if it is not UTF-8.
    pub fn text(&self) -> Result<&str, Error> {
        Ok(std::str::from_utf8(&self.body)?)
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    /// [`Error::Json`] if it is not `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("key", &self.key)
            .field("replayed", &self.replayed())
            .field("attempts", &self.attempts)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}
