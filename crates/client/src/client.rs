//! The client, its builder and the request builder; the retry loop that
//! sends a prepared request is in [`crate::send`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde::Serialize;

use crate::attempt::Retrier;
use crate::error::Error;
use crate::headers::{IDEMPOTENCY_KEY, LAST_EVENT_ID};
use crate::key::IdempotencyKey;
use crate::policy::{Jitter, RetryPolicy};
use crate::response::Response;
use crate::send::{Prepared, keep_head, read_whole, sendable_id};
use crate::stream::EventStream;

/// Headers whose values are credentials: marked sensitive, never shown.
const SENSITIVE: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
    "openai-organization",
];

/// A client for an idemgate gateway (or any API that speaks its
/// contract): every request is one logical operation with one
/// idempotency key, retried with that key.
///
/// Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    base: String,
    headers: HeaderMap,
    policy: RetryPolicy,
}

impl Client {
    /// A client for the gateway at `base_url` (e.g.
    /// `http://127.0.0.1:8080`) with the default [`RetryPolicy`].
    ///
    /// # Errors
    /// [`Error::Url`] for a base URL that is not one.
    pub fn new(base_url: impl Into<String>) -> Result<Self, Error> {
        Self::builder(base_url).build()
    }

    /// A builder for a client of the gateway at `base_url`.
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(base_url)
    }

    /// A POST to `path` (joined to the base URL; an absolute `http(s)://`
    /// URL is used as it is). A fresh key is minted now, before any
    /// attempt; replace it with [`RequestBuilder::idempotency_key`] for a
    /// natural key.
    pub fn post(&self, path: &str) -> RequestBuilder {
        self.request(Method::POST, path)
    }

    /// A request with any method (the gateway protects POST by default).
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            method,
            url: join(&self.inner.base, path),
            headers: HeaderMap::new(),
            body: None,
            key: IdempotencyKey::mint(),
            policy: self.inner.policy.clone(),
            last_event_id: None,
            error: None,
        }
    }

    /// The retry policy requests start with.
    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.inner.base)
            .field("headers", &HeaderNames(&self.inner.headers))
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Client`].
pub struct ClientBuilder {
    base: String,
    headers: HeaderMap,
    policy: RetryPolicy,
    http: Option<reqwest::Client>,
    error: Option<Error>,
}

impl ClientBuilder {
    /// A builder for a client of the gateway at `base_url`.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base: base_url.into(),
            headers: HeaderMap::new(),
            policy: RetryPolicy::default(),
            http: None,
            error: None,
        }
    }

    /// Sends `Authorization: Bearer {token}` (the gateway scopes keys by
    /// this credential: the tenant). Never shown by `Debug`.
    pub fn bearer_auth(self, token: impl fmt::Display) -> Self {
        let value = format!("Bearer {token}");
        self.header(AUTHORIZATION.as_str(), &value)
    }

    /// A header sent with every request. Values of credential headers
    /// (`Authorization`, `x-api-key`, …) are marked sensitive and never
    /// shown by `Debug`.
    ///
    /// `Idempotency-Key` and `Last-Event-ID` are refused here (the error
    /// surfaces at [`ClientBuilder::build`]): they belong to one operation,
    /// and one key on every operation would make them all one.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        if name.eq_ignore_ascii_case(IDEMPOTENCY_KEY) || name.eq_ignore_ascii_case(LAST_EVENT_ID) {
            self.error.get_or_insert(Error::Header {
                name: name.to_owned(),
                reason: "it belongs to one operation: set it per request".to_owned(),
            });
            return self;
        }
        if let Err(e) = insert_header(&mut self.headers, name, value) {
            self.error.get_or_insert(e);
        }
        self
    }

    /// The whole retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Most attempts per operation, the first included.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.policy.attempts = attempts;
        self
    }

    /// Longest time one attempt may take (`None`: no limit).
    pub fn attempt_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.policy.attempt_timeout = timeout.into();
        self
    }

    /// Longest time spent on one operation (default 30 minutes; `None`:
    /// bounded by attempts).
    pub fn deadline(mut self, deadline: impl Into<Option<Duration>>) -> Self {
        self.policy.deadline = deadline.into();
        self
    }

    /// Longest wait a server's delay (`retry-after-ms`, `Retry-After`, an
    /// event stream's `retry`) gets; a longer one is cut to it (default
    /// 60 s, [`RetryPolicy::max_server_delay`]).
    pub fn max_server_delay(mut self, max: Duration) -> Self {
        self.policy.max_server_delay = max;
        self
    }

    /// Backoff: `base` before the first retry, doubling, at most `cap`.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.policy.backoff_base = base;
        self.policy.backoff_cap = cap;
        self
    }

    /// Randomization of backoff sleeps.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.policy.jitter = jitter;
        self
    }

    /// Longest silence on an event stream before it is resumed (`None`:
    /// no limit).
    pub fn stream_idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.policy.stream_idle_timeout = timeout.into();
        self
    }

    /// Uses this `reqwest` client (its pool, TLS and proxy settings). Do
    /// not give it a request timeout of its own: a timeout that cuts a
    /// stream's body looks like a broken stream. Build it with
    /// `.redirect(reqwest::redirect::Policy::none())`, as the client's own
    /// is: `reqwest` follows redirects by default, re-sending the body and
    /// every header but `Authorization` and `Cookie` (so `x-api-key`,
    /// `api-key`, `x-goog-api-key`) to whatever host `Location` names.
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http = Some(client);
        self
    }

    /// The client.
    ///
    /// # Errors
    /// [`Error::Url`] for an invalid base URL, [`Error::Header`] for an
    /// invalid header, [`Error::Build`] if the HTTP client cannot be built.
    pub fn build(self) -> Result<Client, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let base = self.base.trim_end_matches('/').to_owned();
        Url::parse(&base).map_err(|e| Error::Url {
            url: base.clone(),
            reason: e.to_string(),
        })?;
        let http = match self.http {
            Some(c) => c,
            // No redirects: a 3xx is the answer, returned as it is. Only
            // the caller knows whether the place it names should get the
            // body and the credentials.
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(Error::Build)?,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                headers: self.headers,
                policy: self.policy,
            }),
        })
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base", &self.base)
            .field("headers", &HeaderNames(&self.headers))
            .field("policy", &self.policy)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// One logical operation, before it is sent. Its key is fixed from the
/// moment the builder exists ([`RequestBuilder::key`]); every attempt
/// sends it.
pub struct RequestBuilder {
    client: Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Option<Bytes>,
    key: IdempotencyKey,
    policy: RetryPolicy,
    last_event_id: Option<String>,
    error: Option<Error>,
}

impl RequestBuilder {
    /// Uses `key` instead of the minted one: a natural key
    /// ([`IdempotencyKey::new`]), or the key of an earlier call of this
    /// same operation (e.g. [`Error::key`] after giving up).
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.key = key;
        self
    }

    /// The key every attempt of this operation sends. Log or persist it
    /// before sending if the operation must survive this process.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// A request header. `Idempotency-Key` sets the key (validated) and
    /// `Last-Event-ID` the stream position, as their own methods do.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        if name.eq_ignore_ascii_case(IDEMPOTENCY_KEY) {
            match IdempotencyKey::new(value) {
                Ok(k) => self.key = k,
                Err(e) => {
                    self.error.get_or_insert(e.into());
                }
            }
            return self;
        }
        if name.eq_ignore_ascii_case(LAST_EVENT_ID) {
            return self.last_event_id(value);
        }
        if let Err(e) = insert_header(&mut self.headers, name, value) {
            self.error.get_or_insert(e);
        }
        self
    }

    /// A JSON body (and `Content-Type: application/json`). Serialized once,
    /// so every attempt sends the same bytes.
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Self {
        match serde_json::to_vec(body) {
            Ok(bytes) => {
                self.body = Some(bytes.into());
                self.headers
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            Err(e) => {
                self.error.get_or_insert(e.into());
            }
        }
        self
    }

    /// A raw body (set `Content-Type` with [`RequestBuilder::header`]).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// The retry policy of this operation.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Longest time one attempt of this operation may take.
    pub fn attempt_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.policy.attempt_timeout = timeout.into();
        self
    }

    /// For [`RequestBuilder::send_stream`]: resume a stream of this same
    /// operation after event `id` (sent as `Last-Event-ID`), e.g. in a new
    /// process that saved [`EventStream::last_event_id`] and the key.
    pub fn last_event_id(mut self, id: impl Into<String>) -> Self {
        let id = id.into();
        if !sendable_id(&id) {
            self.error.get_or_insert(Error::Header {
                name: LAST_EVENT_ID.to_owned(),
                reason: "the value is not a valid header value".to_owned(),
            });
            return self;
        }
        self.last_event_id = (!id.is_empty()).then_some(id);
        self
    }

    /// Sends the request, retrying with the same key until a success (the
    /// body read whole), a final answer, or the policy's limits.
    ///
    /// # Errors
    /// [`Error::KeyReused`] (422), [`Error::Rejected`] (another final
    /// status), [`Error::GaveUp`] (attempts or deadline spent), or an error
    /// building the request.
    pub async fn send(self) -> Result<Response, Error> {
        let (prepared, policy, _) = self.prepare()?;
        let mut retrier = Retrier::new(policy);
        let (status, headers, body) = prepared
            .until_success(&mut retrier, None, read_whole)
            .await?;
        Ok(Response {
            status,
            headers,
            body,
            key: prepared.key,
            attempts: retrier.into_log(),
        })
    }

    /// Sends the request and returns its event stream once a success head
    /// arrives (retrying as [`RequestBuilder::send`] does). Reading the
    /// stream resumes it with `Last-Event-ID` whenever the connection
    /// breaks or goes silent, so each event is delivered once, in order.
    ///
    /// # Errors
    /// As [`RequestBuilder::send`], and [`Error::NotAStream`] for a success
    /// that is not `text/event-stream`.
    pub async fn send_stream(self) -> Result<EventStream, Error> {
        let (mut prepared, policy, last_event_id) = self.prepare()?;
        if !prepared.headers.contains_key(ACCEPT) {
            prepared
                .headers
                .insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        }
        let mut retrier = Retrier::new(policy);
        let head = prepared
            .until_success(&mut retrier, last_event_id.as_deref(), keep_head)
            .await?;
        EventStream::start(prepared, retrier, head, last_event_id)
    }

    fn prepare(self) -> Result<(Prepared, RetryPolicy, Option<String>), Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let url = Url::parse(&self.url).map_err(|e| Error::Url {
            url: self.url.clone(),
            reason: e.to_string(),
        })?;
        let mut headers = self.client.inner.headers.clone();
        for (name, value) in &self.headers {
            headers.insert(name, value.clone());
        }
        let key_value = HeaderValue::from_str(self.key.as_str()).map_err(|e| Error::Header {
            name: IDEMPOTENCY_KEY.to_owned(),
            reason: e.to_string(),
        })?;
        headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY), key_value);
        Ok((
            Prepared {
                http: self.client.inner.http.clone(),
                method: self.method,
                url,
                headers,
                body: self.body,
                key: self.key,
            },
            self.policy,
            self.last_event_id,
        ))
    }
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("key", &self.key)
            .field("headers", &HeaderNames(&self.headers))
            .field("body_len", &self.body.as_ref().map(Bytes::len))
            .field("policy", &self.policy)
            .field("last_event_id", &self.last_event_id)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

fn join(base: &str, path: &str) -> String {
    if path.starts_with("http://") || path.starts_with("https://") {
        return path.to_owned();
    }
    format!("{base}/{}", path.trim_start_matches('/'))
}

fn insert_header(headers: &mut HeaderMap, name: &str, value: &str) -> Result<(), Error> {
    let header_error = |reason: String| Error::Header {
        name: name.to_owned(),
        reason,
    };
    let name_parsed =
        HeaderName::from_bytes(name.as_bytes()).map_err(|e| header_error(e.to_string()))?;
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| header_error("the value is not a valid header value".to_owned()))?;
    if SENSITIVE.contains(&name_parsed.as_str()) {
        value.set_sensitive(true);
    }
    headers.insert(name_parsed, value);
    Ok(())
}

/// Shows header names only: values may be credentials.
struct HeaderNames<'a>(&'a HeaderMap);

impl fmt::Debug for HeaderNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

#[cfg(test)]
mod tests;
