//! The client side of idemgate's contract, for Rust callers of an idemgate
//! gateway (or of any API that speaks the same headers).
//!
//! A gateway can run each keyed request at most once; only the client can
//! make a retry *be* a retry. This crate does the client's half:
//!
//! - **One key per logical operation.** [`Client::post`] mints a key
//!   (a UUID v4) when the request is built, before the first attempt, or
//!   takes a natural key ([`IdempotencyKey::new`]); every attempt and every
//!   stream resumption sends that key. No key is ever minted inside the
//!   retry loop.
//! - **Retries that are safe to make.** Timeouts, connection errors, 408,
//!   409 (key in flight), 429 and 5xx are retried with jittered
//!   exponential backoff, within a bounded number of attempts and a total
//!   deadline (30 minutes by default; [`RetryPolicy`]). A server's own
//!   delay wins, up to 60 s ([`RetryPolicy::max_server_delay`]):
//!   `retry-after-ms` first, then `Retry-After` (seconds or an HTTP date),
//!   and `x-should-retry: true/false` overrides the status. Any other 4xx
//!   is final; a 422 `key-mismatch` (the key reused for a different body)
//!   is [`Error::KeyReused`].
//! - **Nothing a server sends costs more than the call.** A delay of
//!   decades (`Retry-After: 1000000000`, a date in 9999, a stream's
//!   `retry: 99999999999`) waits 60 s at most. Redirects are not followed:
//!   a 3xx is returned as the answer it is ([`Error::Rejected`], `Location`
//!   in its headers), since following it would re-send the body and the
//!   credentials that `reqwest` keeps across hosts (`x-api-key`,
//!   `api-key`, `x-goog-api-key`). An error body is read up to
//!   [`MAX_ERROR_BODY`] (64 KiB), then the connection is dropped
//!   ([`ErrorResponse::truncated`]).
//! - **Streams that resume.** [`RequestBuilder::send_stream`] returns an
//!   [`EventStream`] that tracks the last `id:` seen and, when the
//!   connection breaks or goes silent, asks again with `Last-Event-ID`:
//!   the caller gets each event once, in order, and the upstream ran once.
//! - **What happened, visibly.** [`Response::replayed`] reads
//!   `Idempotent-Replayed`; [`Response::key`] is the key used;
//!   [`Response::attempts`] lists every attempt, its outcome and the wait
//!   after it (and where that wait came from, [`DelaySource`]).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use idemgate_client::{Client, Error};
//!
//! # async fn run() -> Result<(), Error> {
//! let client = Client::builder("http://127.0.0.1:8080")
//!     .bearer_auth("sk-local") // the tenant: keys are scoped by it
//!     .attempt_timeout(Duration::from_secs(30)) // shorter than a long generation: fine
//!     .attempts(5)
//!     .build()?;
//!
//! let request = client.post("/v1/chat/completions").json(&serde_json::json!({
//!     "model": "gpt-4o-mini",
//!     "messages": [{"role": "user", "content": "write the report"}],
//! }));
//! let key = request.key().clone(); // minted once, before the first attempt
//! let response = request.send().await?;
//! assert_eq!(response.key(), &key);
//! // true if an attempt timed out while the model generated, and a retry
//! // got the stored answer instead of paying twice.
//! println!("replayed: {}", response.replayed());
//!
//! // A stream: every event once, in order, across broken connections.
//! let mut stream = client
//!     .post("/v1/chat/completions")
//!     .json(&serde_json::json!({
//!         "model": "gpt-4o-mini",
//!         "stream": true,
//!         "messages": [{"role": "user", "content": "write the report"}],
//!     }))
//!     .send_stream()
//!     .await?;
//! while let Some(event) = stream.next().await {
//!     let event = event?;
//!     if event.data == "[DONE]" {
//!         break;
//!     }
//!     println!("{}: {}", event.id.as_deref().unwrap_or("-"), event.data);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Why a thin wrapper over `reqwest`, not `reqwest-middleware`
//!
//! `reqwest-middleware` 0.5 (on reqwest 0.13) wraps one `send()`: its
//! middleware returns once the response *head* arrives. Resuming a stream
//! happens later, while the body is read, and needs to re-issue the request
//! with `Last-Event-ID` from inside the body reader: a middleware cannot.
//! Its error type also boxes every middleware error into `anyhow`, so
//! callers would downcast to tell a 422 from a spent retry budget. And the
//! key must be bound to the *operation*, visible before the first attempt
//! and carried by the response and the error, which a per-`send()` layer
//! does not model. So this crate owns a `reqwest::Client` (or takes yours,
//! [`ClientBuilder::http_client`]) and adds no dependency beyond what the
//! workspace already builds.
//!
//! # Choosing the policy
//!
//! An attempt timeout shorter than the longest generation is safe here: the
//! gateway keeps the upstream call running and the retry gets its result.
//! Keep the gateway's `done_ttl` longer than twice the retry window, and
//! tell `idemgate check` what this client does:
//! [`RetryPolicy::client_retry_toml`] writes the policy as the gateway's
//! `[client_retry]` table. On a `reject` route each 409 counts as an
//! attempt: give long generations enough attempts, or use `wait`/`attach`.
//!
//! HTTPS needs the `tls` feature (rustls).
//!
//! # Layout
//! - `client`: [`Client`], its builder and the request builder.
//! - `send`: the retry loop that sends a prepared request, attempt after
//!   attempt with the same key.
//! - `policy`: [`RetryPolicy`], when to retry and how long to wait first.
//! - `key`: the idempotency key of one logical operation.
//! - `attempt`: the record of each attempt, and the retry bookkeeping.
//! - `response`: a successful, whole response.
//! - `error`: errors, and the failed responses they carry.
//! - `headers`: the header names shared with the gateway.
//! - `sse`: server-sent events as an `EventSource` reads them.
//! - `stream`: an event stream that resumes itself with `Last-Event-ID`.

mod attempt;
mod client;
mod error;
mod headers;
mod key;
mod policy;
mod response;
mod send;
mod sse;
mod stream;

pub use attempt::{AttemptEnd, ClientAttempt, GiveUpReason};
pub use client::{Client, ClientBuilder, RequestBuilder};
pub use error::{
    Error, ErrorResponse, GaveUp, KEY_MISMATCH, MAX_ERROR_BODY, ProblemDetails, Rejected,
    RestartReason,
};
pub use headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, LAST_EVENT_ID};
pub use key::{IdempotencyKey, InvalidKey, MAX_KEY_LEN};
pub use policy::{
    DEFAULT_DEADLINE, DEFAULT_MAX_SERVER_DELAY, Delay, DelaySource, Jitter, RETRY_AFTER_MS,
    RetryPolicy, SHOULD_RETRY,
};
pub use response::Response;
pub use sse::Event;
pub use stream::EventStream;
