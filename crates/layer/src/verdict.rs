//! Whether a 200 event stream succeeded, judged from its own events.
//!
//! LLM APIs answer 200 before they generate, so a failure during generation
//! cannot change the status: it arrives as an error event (OpenAI-compatible
//! `data: {"error": …}`, Anthropic `event: error`, Responses
//! `response.failed`), or the stream simply stops before its dialect's
//! terminal event. Storing such a stream would replay the failure as the
//! answer for the whole `done_ttl`; judging it lets the owner release the
//! key instead, so a retry runs again.
//!
//! Each event is looked at once, as it is recorded: its `event:` name, and
//! its data only when a cheap byte search says it may be an error or the
//! terminal marker. Nothing re-reads the stream.

use serde_json::Value;

use crate::config::StreamDialect;
use crate::sse;

/// How a stream ended, so far as its events say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamVerdict {
    /// The dialect's terminal event arrived and no error event did (or the
    /// route has no dialect).
    Complete,
    /// An error event arrived.
    ErrorEvent,
    /// The stream ended without its terminal event.
    Unterminated,
}

/// Watches the events of one stream.
#[derive(Debug)]
pub(crate) struct StreamJudge {
    dialect: StreamDialect,
    terminated: bool,
    failed: bool,
    /// Event data parsed as JSON so far: at most one parse per event.
    parsed: u64,
}

impl StreamJudge {
    pub(crate) fn new(dialect: StreamDialect) -> Self {
        Self {
            dialect,
            terminated: false,
            failed: false,
            parsed: 0,
        }
    }

    /// Looks at one event (as sent, with its field lines).
    pub(crate) fn observe(&mut self, event: &[u8]) {
        if self.failed || self.dialect == StreamDialect::None {
            return;
        }
        match self.dialect {
            StreamDialect::Openai => {
                let data = sse::data_of(event);
                if data.trim_ascii() == b"[DONE]" {
                    self.terminated = true;
                } else if may_be_error(&data) {
                    self.parsed += 1;
                    self.failed = json_has_error_member(&data);
                }
            }
            StreamDialect::Anthropic => match kind_of(event, &mut self.parsed).as_deref() {
                Some("error") => self.failed = true,
                Some("message_stop") => self.terminated = true,
                _ => {}
            },
            StreamDialect::OpenaiResponses => match kind_of(event, &mut self.parsed).as_deref() {
                Some("error" | "response.failed") => self.failed = true,
                Some("response.completed" | "response.incomplete") => self.terminated = true,
                _ => {}
            },
            StreamDialect::None => {}
        }
    }

    /// JSON parses of event data so far (at most one per event).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn parses(&self) -> u64 {
        self.parsed
    }

    /// The verdict once the stream has ended.
    pub(crate) fn verdict(&self) -> StreamVerdict {
        if self.dialect == StreamDialect::None {
            StreamVerdict::Complete
        } else if self.failed {
            StreamVerdict::ErrorEvent
        } else if self.terminated {
            StreamVerdict::Complete
        } else {
            StreamVerdict::Unterminated
        }
    }
}

fn may_be_error(data: &[u8]) -> bool {
    memchr::memmem::find(data, b"\"error\"").is_some()
}

/// Whether `data` is a JSON object with a non-null `error` member.
fn json_has_error_member(data: &[u8]) -> bool {
    serde_json::from_slice::<Value>(data)
        .ok()
        .and_then(|v| v.get("error").map(|e| !e.is_null()))
        .unwrap_or(false)
}

/// The event's type: its `event:` name, or else the `type` of its JSON
/// data (both dialects send both; the name is cheaper). `parsed` counts
/// the JSON parses.
fn kind_of(event: &[u8], parsed: &mut u64) -> Option<String> {
    if let Some(name) = sse::event_of(event) {
        return Some(String::from_utf8_lossy(name).into_owned());
    }
    let data = sse::data_of(event);
    memchr::memmem::find(&data, b"\"type\"")?;
    *parsed += 1;
    serde_json::from_slice::<Value>(&data)
        .ok()?
        .get("type")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread with a quarter of a runtime worker's stack.
    fn on_small_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    /// Events an upstream could send to make the judge work hard: JSON
    /// nested a million levels under the markers it looks for, huge
    /// members, many events.
    fn hostile_events(n: usize) -> Vec<Vec<u8>> {
        let deep = |marker: &str| {
            format!(
                "data: {{\"{marker}\":{}{}}}\n\n",
                "[".repeat(n),
                "]".repeat(n)
            )
            .into_bytes()
        };
        vec![
            deep("error"),
            deep("type"),
            deep("usage"),
            format!("data: {{\"type\":\"x\",\"pad\":\"{}\"}}\n\n", "a".repeat(n)).into_bytes(),
            format!("event: {}\ndata: {{}}\n\n", "e".repeat(n)).into_bytes(),
        ]
    }

    #[test]
    fn hostile_events_are_judged_without_deep_recursion_one_parse_each() {
        on_small_stack(|| {
            for dialect in [
                StreamDialect::Openai,
                StreamDialect::Anthropic,
                StreamDialect::OpenaiResponses,
            ] {
                for n in [1_000, 10_000, 100_000, 1_000_000] {
                    let events = hostile_events(n);
                    let mut j = StreamJudge::new(dialect);
                    let mut usage = crate::StreamUsage::default();
                    for e in &events {
                        j.observe(e);
                        usage.add_event(e);
                    }
                    // Nothing in them is a readable error or terminal event.
                    assert_eq!(j.verdict(), StreamVerdict::Unterminated, "{dialect:?} {n}");
                    assert!(j.parsed <= events.len() as u64, "{dialect:?}: {}", j.parsed);
                    assert_eq!(usage.finish(), None);
                }
            }
        });
    }

    fn judge(dialect: StreamDialect, events: &[&[u8]]) -> StreamVerdict {
        let mut j = StreamJudge::new(dialect);
        for e in events {
            j.observe(e);
        }
        j.verdict()
    }

    #[test]
    fn openai_streams() {
        use StreamDialect::Openai;
        let delta: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"error\\\"\"}}]}\n\n";
        assert_eq!(
            judge(Openai, &[delta, b"data: [DONE]\n\n"]),
            StreamVerdict::Complete
        );
        assert_eq!(judge(Openai, &[delta]), StreamVerdict::Unterminated);
        assert_eq!(judge(Openai, &[]), StreamVerdict::Unterminated);
        let error: &[u8] =
            b"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
        assert_eq!(
            judge(Openai, &[delta, error, b"data: [DONE]\n\n"]),
            StreamVerdict::ErrorEvent
        );
        // A null error member is no error.
        assert_eq!(
            judge(
                Openai,
                &[b"data: {\"error\":null}\n\n", b"data: [DONE]\r\n\r\n"]
            ),
            StreamVerdict::Complete
        );
    }

    #[test]
    fn anthropic_streams() {
        use StreamDialect::Anthropic;
        let start: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
        let stop: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(judge(Anthropic, &[start, stop]), StreamVerdict::Complete);
        assert_eq!(judge(Anthropic, &[start]), StreamVerdict::Unterminated);
        let error: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(judge(Anthropic, &[start, error]), StreamVerdict::ErrorEvent);
        // Without event names, the data's type decides.
        assert_eq!(
            judge(Anthropic, &[b"data: {\"type\":\"message_stop\"}\n\n"]),
            StreamVerdict::Complete
        );
        assert_eq!(
            judge(Anthropic, &[b"data: {\"type\":\"error\"}\n\n"]),
            StreamVerdict::ErrorEvent
        );
    }

    #[test]
    fn responses_streams() {
        use StreamDialect::OpenaiResponses;
        let created: &[u8] = b"event: response.created\ndata: {}\n\n";
        for end in ["response.completed", "response.incomplete"] {
            let e = format!("event: {end}\ndata: {{}}\n\n");
            assert_eq!(
                judge(OpenaiResponses, &[created, e.as_bytes()]),
                StreamVerdict::Complete
            );
        }
        for fail in ["response.failed", "error"] {
            let e = format!("event: {fail}\ndata: {{}}\n\n");
            assert_eq!(
                judge(OpenaiResponses, &[created, e.as_bytes()]),
                StreamVerdict::ErrorEvent
            );
        }
        assert_eq!(
            judge(OpenaiResponses, &[created]),
            StreamVerdict::Unterminated
        );
    }

    #[test]
    fn no_dialect_judges_nothing() {
        assert_eq!(
            judge(
                StreamDialect::None,
                &[b"event: error\ndata: {\"error\":1}\n\n"]
            ),
            StreamVerdict::Complete
        );
        assert_eq!(judge(StreamDialect::None, &[]), StreamVerdict::Complete);
    }
}
