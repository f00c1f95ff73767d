//! Server-sent events as the WHATWG `EventSource` reads them: lines ending
//! in CRLF, LF or CR; `data`, `event`, `id` and `retry` fields; comments;
//! an event dispatched at each blank line. A partial event at the point a
//! connection breaks is never dispatched: the resumed connection sends it
//! again, whole.

use std::time::Duration;

/// Longest line (or event) the parser buffers before it gives up on the
/// stream. LLM events are a few hundred bytes; this only stops a runaway.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// One server-sent event.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// The event's own `id` field (the gateway numbers events 1, 2, 3, …),
    /// if it had one.
    pub id: Option<String>,
    /// The event's `event` field (its type), if it had one.
    pub event: Option<String>,
    /// The `data` lines, joined with `\n`. For OpenAI-style streams the
    /// last event's data is `[DONE]`.
    pub data: String,
}

/// The stream outgrew [`MAX_EVENT_BYTES`] without finishing an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge;

/// Incremental parser: bytes in, events out.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF starting the next one belongs
    /// to that line ending.
    after_cr: bool,
    /// Still at the very start of the stream (a BOM may follow).
    at_start: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    /// This block's own `id` field.
    block_id: Option<String>,
    /// The spec's "last event ID buffer": set by every `id` field, kept
    /// across events.
    id_buffer: Option<String>,
    /// The spec's "last event ID string": the buffer as of the last blank
    /// line, sent as `Last-Event-ID` on reconnection.
    last_event_id: Option<String>,
    /// The spec's reconnection time, from the last `retry` field.
    retry: Option<Duration>,
    /// Bytes buffered for the event being read.
    pending: usize,
}

impl Parser {
    pub(crate) fn new() -> Self {
        Self {
            at_start: true,
            ..Self::default()
        }
    }

    /// A parser for a resumed connection: no bytes buffered, the last event
    /// id and reconnection time carried over (as an `EventSource` keeps
    /// them across reconnections).
    pub(crate) fn resuming(&self) -> Self {
        Self {
            last_event_id: self.last_event_id.clone(),
            id_buffer: self.last_event_id.clone(),
            retry: self.retry,
            ..Self::new()
        }
    }

    /// The id to resume after (`Last-Event-ID`), if the stream set a
    /// non-empty one.
    pub(crate) fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref().filter(|id| !id.is_empty())
    }

    /// Seeds the id to resume after (a caller's saved `Last-Event-ID`).
    pub(crate) fn set_last_event_id(&mut self, id: Option<String>) {
        self.id_buffer.clone_from(&id);
        self.last_event_id = id;
    }

    /// The server's reconnection delay (`retry` field), if it sent one.
    pub(crate) fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Feeds a chunk; appends each completed event to `out`, with the last
    /// event id as of that event (what a reader who stops after it would
    /// resume from).
    pub(crate) fn push(
        &mut self,
        chunk: &[u8],
        out: &mut Vec<(Event, Option<String>)>,
    ) -> Result<(), TooLarge> {
        let mut rest = chunk;
        if self.at_start && !rest.is_empty() {
            // A UTF-8 BOM may open the stream; it can arrive split.
            let bom = b"\xEF\xBB\xBF";
            let have = self.line.len();
            let take = (bom.len() - have).min(rest.len());
            if bom[have..have + take] == rest[..take] {
                if have + take < bom.len() {
                    self.line.extend_from_slice(&rest[..take]);
                    return Ok(());
                }
                self.line.clear();
                rest = &rest[take..];
            } else if have > 0 {
                // Not a BOM after all: those bytes were content.
                let started = std::mem::take(&mut self.line);
                self.at_start = false;
                self.push(&started, out)?;
            }
            self.at_start = false;
        }
        for &b in rest {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(out),
                b'\r' => {
                    self.end_line(out);
                    self.after_cr = true;
                }
                _ => {
                    self.line.push(b);
                    self.pending += 1;
                    if self.pending > MAX_EVENT_BYTES {
                        return Err(TooLarge);
                    }
                }
            }
        }
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<(Event, Option<String>)>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            "id" if !value.contains('\0') => {
                self.block_id = Some(value.to_owned());
                self.id_buffer = Some(value.to_owned());
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<(Event, Option<String>)>) {
        self.pending = 0;
        self.last_event_id.clone_from(&self.id_buffer);
        let event = self.event.take();
        let id = self.block_id.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push((
            Event {
                id,
                event,
                data: std::mem::take(&mut self.data),
            },
            self.last_event_id.clone(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chunks(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = Parser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out).unwrap();
        }
        out.into_iter().map(|(e, _)| e).collect()
    }

    fn events(out: Vec<(Event, Option<String>)>) -> Vec<Event> {
        out.into_iter().map(|(e, _)| e).collect()
    }

    fn ev(id: Option<&str>, data: &str) -> Event {
        Event {
            id: id.map(str::to_owned),
            event: None,
            data: data.to_owned(),
        }
    }

    #[test]
    fn fields_lines_and_blank_lines() {
        let got = parse_chunks(&[
            b"id: 1\ndata: {\"a\":1}\n\n: comment\n\nid: 2\r\nevent: delta\r\ndata: x\r\ndata:y\r\n\r\ndata: [DONE]\n\n",
        ]);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], ev(Some("1"), "{\"a\":1}"));
        assert_eq!(got[1].id.as_deref(), Some("2"));
        assert_eq!(got[1].event.as_deref(), Some("delta"));
        assert_eq!(got[1].data, "x\ny");
        assert_eq!(got[2], ev(None, "[DONE]"));
    }

    #[test]
    fn any_chunking_gives_the_same_events() {
        let text: &[u8] =
            b"\xEF\xBB\xBFid: 1\r\ndata: alpha\r\n\r\nid: 2\rdata: beta\r\rretry: 250\nid: 3\ndata\n\n";
        let whole = parse_chunks(&[text]);
        assert_eq!(
            whole,
            vec![
                ev(Some("1"), "alpha"),
                ev(Some("2"), "beta"),
                ev(Some("3"), ""),
            ]
        );
        for split in 1..text.len() {
            let (a, b) = text.split_at(split);
            assert_eq!(parse_chunks(&[a, b]), whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(parse_chunks(&bytes), whole);
    }

    #[test]
    fn an_unterminated_event_is_not_dispatched_nor_resumed_after() {
        let mut p = Parser::new();
        let mut got = Vec::new();
        p.push(b"id: 1\ndata: a\n\nid: 2\ndata: half", &mut got)
            .unwrap();
        assert_eq!(events(got), vec![ev(Some("1"), "a")]);
        assert_eq!(p.last_event_id(), Some("1"), "event 2 was never whole");
        let mut q = p.resuming();
        assert_eq!(q.last_event_id(), Some("1"));
        let mut rest = Vec::new();
        q.push(b"id: 2\ndata: whole\n\n", &mut rest).unwrap();
        assert_eq!(events(rest), vec![ev(Some("2"), "whole")]);
    }

    #[test]
    fn ids_and_retry_follow_the_spec() {
        let mut p = Parser::new();
        let mut got = Vec::new();
        // An id-only block moves the reconnection id without an event; an
        // event without an id keeps the previous one; `retry` is kept.
        p.push(b"id: 7\n\nretry: 250\ndata: a\n\nretry: x\n\n", &mut got)
            .unwrap();
        assert_eq!(got, vec![(ev(None, "a"), Some("7".to_owned()))]);
        assert_eq!(p.last_event_id(), Some("7"));
        assert_eq!(p.retry(), Some(Duration::from_millis(250)));
        // An empty id clears it (no Last-Event-ID is sent then).
        p.push(b"id\ndata: b\n\n", &mut got).unwrap();
        assert_eq!(p.last_event_id(), None);
    }

    #[test]
    fn each_event_carries_the_id_to_resume_after_it() {
        let mut p = Parser::new();
        let mut got = Vec::new();
        p.push(b"id: 1\ndata: a\n\nid: 2\ndata: b\n\ndata: c\n\n", &mut got)
            .unwrap();
        let ids: Vec<_> = got.iter().map(|(_, id)| id.as_deref()).collect();
        assert_eq!(ids, [Some("1"), Some("2"), Some("2")]);
    }

    #[test]
    fn a_runaway_line_is_refused() {
        let mut p = Parser::new();
        let mut out = Vec::new();
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert_eq!(p.push(&big, &mut out), Err(TooLarge));
    }
}
