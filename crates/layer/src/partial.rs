//! What a broken stream on a charging route keeps: the events relayed
//! before the break, then one terminal error event in the route's
//! dialect that names `outcome-unknown`, how many events were relayed
//! and how many tokens they carried.
//!
//! Why a stream and not a problem document: the owner's client and every
//! attached duplicate have already read the head (200) and the first
//! events, which cannot be un-sent. Were the key's answer a 502 problem,
//! a client that resumed with `Last-Event-ID` or retried would get a
//! different answer from the one it half-read, and one that restarted
//! would see the first half twice. Kept as the partial stream, every
//! reader (the owner's client, followers, replays, resumptions) gets the
//! same events under the same ids, and the error event at the end makes
//! the official SDKs raise an API error once the partial content is
//! delivered: the OpenAI SDK raises on any event whose data carries an
//! `error` object, the Anthropic SDK on `event: error`.
//!
//! Tokens are counted as content deltas, one per delta event (each
//! provider streams about one token per delta; a usage report comes only
//! at the end of a stream, which a broken one never reaches): OpenAI
//! chunks whose delta carries text (`content`, `refusal`,
//! `reasoning_content`, tool-call `arguments`), Anthropic
//! `content_block_delta`, Responses events named `….delta`. A route
//! without a dialect does not count them (`tokens` is `null`).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::config::StreamDialect;
use crate::sse::{self, EventId};

/// Problem slug the terminal event names.
pub(crate) const OUTCOME_UNKNOWN: &str = "outcome-unknown";

/// Counts the content deltas of a stream, per its dialect.
#[derive(Debug, Clone)]
pub(crate) struct DeltaCount {
    dialect: StreamDialect,
    deltas: u64,
}

impl DeltaCount {
    pub(crate) fn new(dialect: StreamDialect) -> Self {
        Self { dialect, deltas: 0 }
    }

    /// Looks at one event (as sent, with its field lines).
    pub(crate) fn observe(&mut self, event: &[u8]) {
        let delta = match self.dialect {
            StreamDialect::Openai => carries_text(&sse::data_of(event)),
            StreamDialect::Anthropic => match sse::event_of(event) {
                Some(name) => name == b"content_block_delta",
                None => {
                    memchr::memmem::find(&sse::data_of(event), b"\"content_block_delta\"").is_some()
                }
            },
            StreamDialect::OpenaiResponses => match sse::event_of(event) {
                Some(name) => name.ends_with(b".delta"),
                None => memchr::memmem::find(&sse::data_of(event), b".delta\"").is_some(),
            },
            StreamDialect::None => false,
        };
        self.deltas += u64::from(delta);
    }

    /// The tokens received, or `None` on a route without a dialect.
    pub(crate) fn tokens(&self) -> Option<u64> {
        (self.dialect != StreamDialect::None).then_some(self.deltas)
    }
}

/// Whether OpenAI chunk data carries generated text: a member named
/// `content`, `refusal`, `reasoning_content` or `arguments` whose value is
/// a non-empty string. A byte search, not a parse: it runs on every event.
fn carries_text(data: &[u8]) -> bool {
    const NAMES: [&[u8]; 4] = [
        b"\"content\"",
        b"\"refusal\"",
        b"\"reasoning_content\"",
        b"\"arguments\"",
    ];
    NAMES.iter().any(|name| {
        memchr::memmem::find_iter(data, name).any(|at| {
            let rest = data.get(at + name.len()..).unwrap_or_default();
            let rest = rest.trim_ascii_start();
            let Some(rest) = rest.strip_prefix(b":") else {
                return false;
            };
            let rest = rest.trim_ascii_start();
            rest.strip_prefix(b"\"")
                .is_some_and(|value| !value.is_empty() && !value.starts_with(b"\""))
        })
    })
}

/// The terminal event of a partial answer: event `id` (the one after the
/// last relayed), in `dialect`'s error form, naming `outcome-unknown`, the
/// `events` relayed, the `tokens` received and the `phase` that broke.
pub(crate) fn terminal_event(
    dialect: StreamDialect,
    id: EventId,
    events: u64,
    tokens: Option<u64>,
    phase: &str,
) -> Bytes {
    let received = match tokens {
        Some(t) => format!("{events} events ({t} tokens)"),
        None => format!("{events} events"),
    };
    let message = format!(
        "Outcome unknown: the response stream broke ({phase}) after {received}; the upstream may have run and billed the whole generation, so it is not run again under this idempotency key: use this partial answer, or start a new generation under a new key"
    );
    let error = json!({
        "message": message,
        "type": "api_error",
        "code": OUTCOME_UNKNOWN,
        "events": events,
        "tokens": tokens,
        "phase": phase,
    });
    // OpenAI writes a stream's error as data alone; Anthropic and the
    // Responses API as `event: error`. Both SDKs raise on either form when
    // the data holds an `error` object, so a route without a dialect gets
    // the form every reader recognises.
    let (name, data): (Option<&str>, Value) = match dialect {
        StreamDialect::Openai => (None, json!({ "error": error })),
        StreamDialect::Anthropic => (Some("error"), json!({ "type": "error", "error": error })),
        StreamDialect::OpenaiResponses => (
            Some("error"),
            json!({
                "type": "error",
                "code": OUTCOME_UNKNOWN,
                "message": error["message"].clone(),
                "param": null,
                "error": error,
            }),
        ),
        StreamDialect::None => (Some("error"), json!({ "error": error })),
    };
    let mut out = format!("id: {id}\n");
    if let Some(name) = name {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{StreamJudge, StreamVerdict};

    fn count(dialect: StreamDialect, events: &[&[u8]]) -> Option<u64> {
        let mut c = DeltaCount::new(dialect);
        for e in events {
            c.observe(e);
        }
        c.tokens()
    }

    #[test]
    fn content_deltas_are_counted_per_dialect() {
        let openai: [&[u8]; 5] = [
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            b"data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n",
            b"data: {\"choices\": [{\"delta\": {\"content\": \" world\"}}]}\n\n",
            b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"\"}}]}}]}\n\n",
            b"data: [DONE]\n\n",
        ];
        assert_eq!(count(StreamDialect::Openai, &openai), Some(3));
        let anthropic: [&[u8]; 4] = [
            b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n",
            b"data: {\"type\":\"content_block_delta\"}\n\n",
        ];
        assert_eq!(count(StreamDialect::Anthropic, &anthropic), Some(2));
        let responses: [&[u8]; 3] = [
            b"event: response.created\ndata: {}\n\n",
            b"event: response.output_text.delta\ndata: {}\n\n",
            b"event: response.output_text.done\ndata: {}\n\n",
        ];
        assert_eq!(count(StreamDialect::OpenaiResponses, &responses), Some(1));
        assert_eq!(count(StreamDialect::None, &openai), None);
    }

    /// Each dialect's judge reads the terminal event as a failure, as the
    /// SDKs do: the answer never looks like a finished stream.
    #[test]
    fn the_terminal_event_is_an_error_event_in_every_dialect() {
        let id = EventId { run: 7, n: 5 };
        for dialect in [
            StreamDialect::Openai,
            StreamDialect::Anthropic,
            StreamDialect::OpenaiResponses,
            StreamDialect::None,
        ] {
            let event = terminal_event(dialect, id, 4, Some(3), "stream");
            assert_eq!(sse::id_of(&event), Some(&b"7-5"[..]));
            let data: Value = serde_json::from_slice(&sse::data_of(&event)).unwrap();
            assert_eq!(data["error"]["code"], OUTCOME_UNKNOWN, "{dialect:?}");
            assert_eq!(data["error"]["events"], 4);
            assert_eq!(data["error"]["tokens"], 3);
            if dialect != StreamDialect::Openai {
                assert_eq!(sse::event_of(&event), Some(&b"error"[..]));
            }
            let mut judge = StreamJudge::new(dialect);
            judge.observe(&event);
            if dialect != StreamDialect::None {
                assert_eq!(judge.verdict(), StreamVerdict::ErrorEvent, "{dialect:?}");
            }
        }
        let unnamed = terminal_event(StreamDialect::None, id, 2, None, "total");
        let data: Value = serde_json::from_slice(&sse::data_of(&unnamed)).unwrap();
        assert!(data["error"]["tokens"].is_null());
    }
}
