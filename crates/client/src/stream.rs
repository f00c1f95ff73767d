//! A server-sent event stream that resumes itself with `Last-Event-ID`.

use std::collections::VecDeque;
use std::fmt;

use futures_util::Stream;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap};

use crate::attempt::{AttemptEnd, ClientAttempt, Retrier};
use crate::error::{Error, RestartReason};
use crate::headers::{IDEMPOTENT_REPLAYED, replayed};
use crate::key::IdempotencyKey;
use crate::policy::{Delay, DelaySource};
use crate::send::{Prepared, keep_head, sendable_id};
use crate::sse::{Event, Parser};

/// The `Content-Type` of `headers` ("" if none or unreadable).
pub(crate) fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The response says it is a new execution (`Idempotent-Replayed: false`);
/// a server that does not send the header is not judged.
fn is_fresh(headers: &HeaderMap) -> bool {
    headers.contains_key(IDEMPOTENT_REPLAYED) && !replayed(headers)
}

/// Header the gateway sets on a stream sent whole to a resumption that
/// named another execution's events.
const STREAM_RESTARTED: &str = "idempotent-stream-restarted";

/// Why a stream that continues the caller's events cannot be used: a new
/// execution, or another execution's stream sent whole.
fn restart_reason(headers: &HeaderMap) -> Option<RestartReason> {
    if is_fresh(headers) {
        return Some(RestartReason::NewExecution);
    }
    headers
        .get(STREAM_RESTARTED)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
        .then_some(RestartReason::OtherExecution)
}

/// Problem slug of the gateway's terminal event on a stream kept as a
/// partial answer.
const OUTCOME_UNKNOWN: &str = "outcome-unknown";

/// The tokens and message of the gateway's terminal `outcome-unknown`
/// event (in every dialect, data holding an `error` object with that
/// `code`), or `None` for any other event. Only data that names the code
/// is parsed.
fn outcome_unknown(event: &Event) -> Option<(Option<u64>, String)> {
    if !event.data.contains(OUTCOME_UNKNOWN) {
        return None;
    }
    let data: serde_json::Value = serde_json::from_str(&event.data).ok()?;
    let error = data.get("error")?;
    if error.get("code")?.as_str()? != OUTCOME_UNKNOWN {
        return None;
    }
    let tokens = error.get("tokens").and_then(serde_json::Value::as_u64);
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(OUTCOME_UNKNOWN)
        .to_owned();
    Some((tokens, message))
}

/// An event id as a position: the gateway's `RUN-N` (event `N` of
/// execution `RUN`), or a bare number from another server.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position {
    run: Option<String>,
    n: u64,
}

impl Position {
    fn of(id: &str) -> Option<Self> {
        match id.split_once('-') {
            Some((run, n)) if !run.is_empty() && run.bytes().all(|b| b.is_ascii_digit()) => {
                Some(Self {
                    run: Some(run.to_owned()),
                    n: n.parse().ok()?,
                })
            }
            Some(_) => None,
            None => Some(Self {
                run: None,
                n: id.parse().ok()?,
            }),
        }
    }

    /// Whether an event at `self` was delivered before a resumption from
    /// `floor` (same run, not after it).
    fn at_or_before(&self, floor: &Self) -> bool {
        self.run == floor.run && self.n <= floor.n
    }
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    content_type(headers)
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The events of one operation's stream, each delivered once, in order.
///
/// When the connection breaks, or stays silent past
/// [`RetryPolicy::stream_idle_timeout`], the stream is requested again
/// with the same key and `Last-Event-ID: <last id seen>`; the gateway
/// sends only the events after it (from the stored stream, or the live one
/// still being generated), and this type drops any event it already
/// delivered. A partial event at the break is never delivered: it comes
/// again, whole. Read it with [`EventStream::next`], or as a
/// [`futures_util::Stream`] with [`EventStream::into_stream`].
///
/// [`RetryPolicy::stream_idle_timeout`]: crate::RetryPolicy::stream_idle_timeout
pub struct EventStream {
    prepared: Prepared,
    retrier: Retrier,
    /// The connection being read; `None` once the stream is over.
    response: Option<reqwest::Response>,
    parser: Parser,
    /// Events parsed but not yet handed out, each with the stream's last
    /// event id as of that event.
    queue: VecDeque<(Event, Option<String>)>,
    /// The last event id as of the last event handed out.
    delivered_id: Option<String>,
    /// Events handed to the caller.
    delivered: u64,
    /// New events read on the current connection.
    on_connection: u64,
    /// The caller already holds events (delivered here, or by an earlier
    /// process, for a stream started with a `Last-Event-ID`).
    holds_events: bool,
    /// The id at the last resumption: events of its run at or below it
    /// are duplicates.
    floor: Option<Position>,
    status: StatusCode,
    headers: HeaderMap,
    resumes: u32,
    done: bool,
}

impl EventStream {
    pub(crate) fn start(
        prepared: Prepared,
        retrier: Retrier,
        head: reqwest::Response,
        last_event_id: Option<String>,
    ) -> Result<Self, Error> {
        if !is_event_stream(head.headers()) {
            return Err(Error::NotAStream {
                key: prepared.key.clone(),
                content_type: content_type(head.headers()).to_owned(),
            });
        }
        let holds_events = last_event_id.is_some();
        if holds_events && let Some(reason) = restart_reason(head.headers()) {
            // The caller holds events of an execution that is gone (its
            // key expired or was released): these are not their sequel.
            return Err(Error::StreamRestarted {
                key: prepared.key.clone(),
                delivered: 0,
                reason,
            });
        }
        let mut parser = Parser::new();
        let floor = last_event_id.as_deref().and_then(Position::of);
        parser.set_last_event_id(last_event_id.clone());
        Ok(Self {
            prepared,
            retrier,
            status: head.status(),
            headers: head.headers().clone(),
            response: Some(head),
            parser,
            queue: VecDeque::new(),
            delivered_id: last_event_id,
            delivered: 0,
            on_connection: 0,
            holds_events,
            floor,
            resumes: 0,
            done: false,
        })
    }

    /// The next event; `None` at the stream's clean end (or after an
    /// error).
    ///
    /// # Errors
    /// [`Error::GaveUp`] when resuming failed as often as the policy
    /// allows, [`Error::OutcomeUnknown`] at the gateway's terminal event
    /// of a stream that broke upstream on a charging route (after the
    /// events before it), [`Error::StreamRestarted`] when the stream cannot be
    /// continued where it broke, [`Error::Rejected`] /
    /// [`Error::KeyReused`] for a final answer to a resumption,
    /// [`Error::EventTooLarge`].
    pub async fn next(&mut self) -> Option<Result<Event, Error>> {
        loop {
            if let Some((event, id)) = self.queue.pop_front() {
                if let Some((tokens, message)) = outcome_unknown(&event) {
                    let e = Error::OutcomeUnknown {
                        key: self.prepared.key.clone(),
                        delivered: self.delivered,
                        tokens,
                        message,
                    };
                    return Some(Err(self.fail(e)));
                }
                self.delivered_id = id;
                self.delivered += 1;
                self.holds_events = true;
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let Some(response) = self.response.as_mut() else {
                self.done = true;
                return None;
            };
            let idle = self.retrier.policy().stream_idle_timeout;
            let read = match idle {
                Some(t) => tokio::time::timeout(t, response.chunk()).await.ok(),
                None => Some(response.chunk().await),
            };
            let interrupted = match read {
                Some(Ok(Some(chunk))) => {
                    if let Err(e) = self.take(&chunk) {
                        return Some(Err(self.fail(e)));
                    }
                    continue;
                }
                Some(Ok(None)) => {
                    // Clean end. An unterminated last event is dropped, as
                    // an EventSource does.
                    self.response = None;
                    self.done = true;
                    continue;
                }
                Some(Err(e)) => (
                    AttemptEnd::StreamBroken {
                        events: self.on_connection,
                    },
                    Some(e),
                ),
                None => (
                    AttemptEnd::StreamIdle {
                        events: self.on_connection,
                    },
                    None,
                ),
            };
            if let Err(e) = self.resume(interrupted.0, interrupted.1).await {
                return Some(Err(self.fail(e)));
            }
        }
    }

    /// The stream as a [`futures_util::Stream`] of events.
    pub fn into_stream(self) -> impl Stream<Item = Result<Event, Error>> + Send {
        futures_util::stream::unfold(self, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        })
    }

    /// The operation's key, sent on every attempt and resumption.
    pub fn key(&self) -> &IdempotencyKey {
        &self.prepared.key
    }

    /// `Idempotent-Replayed` of the first response: `false` when this call
    /// started the execution, `true` when it joined a live stream or
    /// replayed a stored one.
    pub fn replayed(&self) -> bool {
        replayed(&self.headers)
    }

    /// The first response's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The first response's headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The stream's last event id as of the last event handed to the
    /// caller (events read ahead in the same chunk do not count): save it
    /// with [`EventStream::key`] to resume in another process
    /// ([`RequestBuilder::last_event_id`]) without losing an event.
    ///
    /// [`RequestBuilder::last_event_id`]: crate::RequestBuilder::last_event_id
    pub fn last_event_id(&self) -> Option<&str> {
        if self.queue.is_empty() {
            // Nothing read ahead: also counts an `id`-only block after the
            // last event.
            return self.parser.last_event_id();
        }
        self.delivered_id.as_deref().filter(|id| !id.is_empty())
    }

    /// Events delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// How often the stream was resumed.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }

    /// Every attempt so far: the first request (and its retries), then
    /// each interruption and resumption.
    pub fn attempts(&self) -> &[ClientAttempt] {
        self.retrier.log()
    }

    /// Parses a chunk, queueing the events not delivered before.
    fn take(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let mut events = Vec::new();
        let parsed = self.parser.push(chunk, &mut events);
        let before = self.queue.len();
        for (event, id_after) in events {
            let at = event.id.as_deref().and_then(Position::of);
            if let (Some(floor), Some(at)) = (&self.floor, at)
                && at.at_or_before(floor)
            {
                continue;
            }
            self.queue.push_back((event, id_after));
        }
        let new = self.queue.len() - before;
        if new > 0 {
            self.on_connection += new as u64;
            self.retrier.progress();
        }
        parsed.map_err(|_| Error::EventTooLarge {
            key: self.prepared.key.clone(),
        })
    }

    /// Ends the stream with `e`.
    fn fail(&mut self, e: Error) -> Error {
        self.response = None;
        self.done = true;
        self.queue.clear();
        e
    }

    /// Drops the connection and requests the rest of the stream.
    async fn resume(
        &mut self,
        outcome: AttemptEnd,
        error: Option<reqwest::Error>,
    ) -> Result<(), Error> {
        // Called only with the queue drained: what the caller holds is
        // what it was handed. A partial event is dropped with the parser.
        self.response = None;
        let holds = self.holds_events;
        let last = self
            .parser
            .last_event_id()
            .filter(|id| sendable_id(id))
            .map(str::to_owned);
        if holds && last.is_none() {
            return Err(Error::StreamRestarted {
                key: self.prepared.key.clone(),
                delivered: self.delivered,
                reason: RestartReason::NoEventIds,
            });
        }
        let asked = self
            .parser
            .retry()
            .map(|d| Delay::new(d, DelaySource::StreamRetry));
        // The connection's head was logged as a success; this attempt is
        // the same connection, now broken.
        self.retrier.reopen_last();
        match self.retrier.failed(outcome, asked) {
            Ok(wait) => tokio::time::sleep(wait).await,
            Err(reason) => {
                return Err(self.prepared.gave_up(&self.retrier, reason, None, error));
            }
        }
        let head = self
            .prepared
            .until_success(&mut self.retrier, last.as_deref(), keep_head)
            .await?;
        if holds && let Some(reason) = restart_reason(head.headers()) {
            return Err(Error::StreamRestarted {
                key: self.prepared.key.clone(),
                delivered: self.delivered,
                reason,
            });
        }
        if !is_event_stream(head.headers()) {
            return Err(Error::NotAStream {
                key: self.prepared.key.clone(),
                content_type: content_type(head.headers()).to_owned(),
            });
        }
        self.floor = last.as_deref().and_then(Position::of);
        self.parser = self.parser.resuming();
        self.response = Some(head);
        self.on_connection = 0;
        self.resumes += 1;
        Ok(())
    }
}

impl fmt::Debug for EventStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventStream")
            .field("key", self.key())
            .field("status", &self.status)
            .field("replayed", &self.replayed())
            .field("last_event_id", &self.last_event_id())
            .field("delivered", &self.delivered)
            .field("resumes", &self.resumes)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
