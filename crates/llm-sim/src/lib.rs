//! A simulated LLM provider that counts what it executes and bills.
//!
//! idemgate exists because a timeout does not say whether the work
//! happened. Tests of that claim need an upstream that behaves like a real
//! provider in exactly the ways that make timeouts ambiguous, and that can
//! then tell how many times the work really ran and what it cost. This
//! crate is that upstream: it speaks the OpenAI Chat Completions, OpenAI
//! Responses and Anthropic Messages HTTP APIs closely enough for the official clients,
//! and counts every execution, per idempotency key.
//!
//! # Layout
//! - `control`: [`SimConfig`] pacing and the per-request `x-sim-*`
//!   headers.
//! - `stats`: [`Stats`] counters, [`StatsSnapshot`] and the log of every
//!   [`Execution`].
//! - `content`: deterministic output text and token counting.
//! - `dialect`: the provider-specific parts as one trait; `openai`,
//!   `responses` and `anthropic` implement it.
//! - `sim`: the state every request shares (config, counters, shutdown).
//! - `respond`: the shared life of a request (count, pace, bill, break).
//! - `server`: routes ([`router`]), [`spawn`], [`SimHandle`].
//! - `connection`: the connection a request came on, so a handler can
//!   close it without answering (the `close` fault).
//! - `encoding`: gzip and brotli answers, as providers behind CDNs send
//!   them.
//!
//! # Endpoints
//! - `POST /v1/chat/completions`, `POST /v1/responses`, `POST
//!   /v1/messages`: generation, plain JSON or SSE (`"stream": true`).
//! - `GET /v1/models`: a small list (Anthropic's shape when the request has
//!   `anthropic-version`).
//! - `GET /sim/stats` ([`StatsSnapshot`] as JSON), `GET /sim/executions`
//!   (all keys), `GET /sim/executions/{key}`, `GET /sim/log` (every
//!   [`Execution`]: number, key, credential, body hash, start time, the
//!   request's `x-sim-tag`),
//!   `POST /sim/reset`: for tests that run the simulator in another
//!   process.
//!
//! # Why each behaviour exists
//! - **Non-streaming work outlives the client.** The generation runs in its
//!   own task for `latency` and is billed and counted `completed` even if
//!   the client timed out and left. A provider does not stop work because
//!   a socket closed; this is why a client-side timeout followed by a
//!   retry pays twice, the central case idemgate removes.
//! - **Streams stop when the client leaves**, counted as a
//!   `client_disconnect`, billed for the tokens generated so far. Providers
//!   do notice a closed stream; the partial bill is still real.
//! - **Headers come with the first event.** A streaming response sends
//!   nothing until `first_token_delay`, so a client's first-byte timeout
//!   measures time to first token, as it does against a provider.
//! - **Same request, same text; new execution, new id.** Content is a hash
//!   of the conversation (roles and text), so a replayed response and a
//!   second execution have the same words. The id (`chatcmpl-N`,
//!   `msg_simN`, N from a process-wide sequence that [`Stats::reset`] does
//!   not rewind) differs on every execution, as does the
//!   `x-sim-execution: N` response header; that is how a test tells a
//!   replay (identical bytes) from a re-execution. OpenAI's `created` is
//!   the real clock in seconds, so it also differs unless both executions
//!   fall in the same second.
//! - **Executions are counted per key** (`Idempotency-Key`, or
//!   `x-idempotency-key`; the quoted structured-field form counts as the
//!   bare key; no header counts under ""), so a test can assert "at most
//!   once" for each key.
//!
//! # Failure injection (`x-sim-fail`)
//! Which failures count as an execution follows one rule: a request that
//! reached the model is an execution, because from the client's side the
//! work may have happened.
//!
//! | value | what happens | execution? |
//! |---|---|---|
//! | `400` | `invalid_request_error` after `first_token_delay` | no: rejected by validation |
//! | `429` | rate-limit error with `retry-after: 1` after `first_token_delay` | no: rejected before the model |
//! | `500`, `503` | server error after `first_token_delay`, nothing billed | yes: the provider accepted it |
//! | `reset-after:N` | streaming: N tokens, then the connection breaks (body error, no clean end); non-streaming: the generation completes and is billed, then the first N bytes of the body are sent and the connection breaks | yes |
//! | `stall-after:N` | as `reset-after:N`, but the connection stays open and silent until the client leaves (idle timeouts) | yes |
//! | `hang` | response headers never come (first-byte timeouts); nothing billed | yes |
//! | `error-after:N` | streaming: 200, N tokens, then the dialect's error event (OpenAI `data: {"error": …}`, Anthropic `event: error` with `overloaded_error`) and a clean end without the terminal event; non-streaming: ignored | yes |
//! | `close` | the request is read, then the connection is closed with no response (needs the simulator's own server, [`spawn`]; an embedded [`router`] answers 500) | yes |
//! | `end-after:N` | streaming: 200, N tokens, then a clean end without the terminal event (`[DONE]`, `message_stop`); non-streaming: ignored | yes |
//!
//! A non-streaming answer's headers come only when the whole generation
//! has ended (`x-sim-latency-ms`), as a provider's do. Answers are
//! compressed (gzip or brotli) when the request's `Accept-Encoding` offers
//! it, or always with `x-sim-encoding: gzip|br` (a CDN that ignores
//! `identity`). Credentials are not checked: `Authorization` and
//! `x-api-key` are both accepted.
//!
//! With N = 0 a stream sends its headers and no events. Every request with
//! `x-sim-fail` counts in `failures_injected`. Other per-request headers
//! override [`SimConfig`]: `x-sim-latency-ms`, `x-sim-first-token-ms`,
//! `x-sim-token-interval-ms`, `x-sim-tokens`. `x-sim-tag` names the request
//! in the execution log. A request's own `max_tokens`
//! (or `max_completion_tokens`) caps the output, with finish reason
//! `length` / `max_tokens`.
//!
//! # Checked against the official clients
//! `tests/clients/official_clients.py` drives the simulator binary with the
//! official `openai` and `anthropic` Python clients (plain, streaming,
//! stream helpers, every error status, a broken stream, model lists, and a
//! too-short client timeout whose retries each execute and bill). It needs
//! `pip install openai anthropic` and is run by hand, not by `cargo test`.
//!
//! # Counting
//! `requests` counts requests to the two generation endpoints only (not
//! `/sim/*` polling). Prompt tokens are whitespace-separated words of all
//! message text (and the Anthropic `system` prompt), at least 1; one output
//! word is one completion token. A client that leaves while a response is
//! being prepared counts as a `client_disconnect` as soon as the server
//! notices the closed connection.

mod anthropic;
mod connection;
mod content;
mod control;
mod dialect;
mod encoding;
mod openai;
mod respond;
mod responses;
mod server;
mod sim;
mod stats;

pub use control::{
    FAIL_HEADER, FIRST_TOKEN_HEADER, LATENCY_HEADER, SimConfig, TAG_HEADER, TOKEN_INTERVAL_HEADER,
    TOKENS_HEADER,
};
pub use encoding::ENCODING_HEADER;
pub use respond::EXECUTION_HEADER;
pub use server::{SimHandle, router, spawn, spawn_on};
pub use stats::{Execution, Stats, StatsSnapshot};
