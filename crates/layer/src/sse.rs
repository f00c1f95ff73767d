//! Server-sent events: finding event boundaries in a byte stream, giving
//! each event a sequential id, and reading an event's data.
//!
//! The stream is relayed as bytes, not re-serialized: the scanner only finds
//! where each event ends (a blank line), so an event is forwarded exactly as
//! the upstream wrote it except for its `id:` line. Lines end with `\r\n`,
//! `\n` or a lone `\r`, as the WHATWG grammar allows; a `\r` at the end of a
//! chunk is decided when the next byte comes, so a `\r\n` split across
//! chunks is one line ending. Each byte is examined once however the stream
//! is chunked (an event split across chunks costs no re-scan), which keeps
//! large events linear.
//!
//! A single event is bounded: an upstream that never ends its event would
//! otherwise be buffered without limit, so the scanner refuses to hold more
//! than its limit and the owner treats that as a broken stream.
//!
//! Ids are rewritten to `RUN-1, RUN-2, …`, where `RUN` names the execution
//! that produced the stream (its lease's fence, unique among the key's
//! executions), so that a client reconnecting with `Last-Event-ID: RUN-n`
//! can be given exactly the events after `n` of that same run, from the
//! recording or from the live stream, whatever ids the upstream used. A
//! resumption that names another run (the one the client read broke, its
//! key was released, and another execution ran), or no run of ours, gets
//! the stream it finds whole, marked [`STREAM_RESTARTED`]: events of two
//! runs are never spliced.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// Response header set (`true`) on a stream sent whole to a client that
/// asked to resume another run (or sent a `Last-Event-ID` that names no run
/// of ours): the events it holds are not the start of this stream.
pub const STREAM_RESTARTED: HeaderName = HeaderName::from_static("idempotent-stream-restarted");

/// The id the gateway gives event `n` (from 1) of the stream of run `run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventId {
    /// The execution that produced the stream (its lease's fence).
    pub run: u64,
    /// The event's number in its stream, from 1.
    pub n: u64,
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.run, self.n)
    }
}

impl EventId {
    /// Parses `RUN-N` (both decimal digits only, `N` at least 1).
    pub fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?.trim();
        let (run, n) = text.split_once('-')?;
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(run) || !digits(n) {
            return None;
        }
        let n: u64 = n.parse().ok()?;
        (n >= 1).then_some(Self {
            run: run.parse().ok()?,
            n,
        })
    }
}

/// Where a client asks a stream to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Resume {
    /// No `Last-Event-ID`: the whole stream.
    #[default]
    Whole,
    /// After event `n` of run `run`.
    After(EventId),
    /// A `Last-Event-ID` that names no event of ours (an upstream's id, a
    /// bare number, garbage): the whole stream, marked restarted.
    Unknown,
}

impl Resume {
    /// How many events of the stream of `run` to leave out, and whether
    /// the stream is sent whole to a client that asked for another run's
    /// continuation (mark it [`STREAM_RESTARTED`]). `run` is `None` for a
    /// stream whose run is not known (one without events).
    pub fn skip_for(self, run: Option<u64>) -> (usize, bool) {
        match self {
            Self::Whole => (0, false),
            Self::After(id) if Some(id.run) == run => {
                (usize::try_from(id.n).unwrap_or(usize::MAX), false)
            }
            Self::After(_) | Self::Unknown => (0, true),
        }
    }
}

/// An event grew past the scanner's limit before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event grew past {limit} bytes without ending")]
pub struct EventTooLarge {
    /// The limit, in bytes.
    pub limit: usize,
}

/// Splits a byte stream into SSE events.
#[derive(Debug)]
pub struct EventScanner {
    buf: BytesMut,
    /// Bytes of `buf` before this offset have been examined.
    searched: usize,
    /// The examined bytes end a line (or the event has not begun): a line
    /// ending now is a blank line.
    at_line_start: bool,
    /// The last examined byte is a `\r`: a `\n` now belongs to it.
    pending_cr: bool,
    /// That `\r` ended a blank line: the event ends with it, or with the
    /// `\n` after it.
    cr_ends_event: bool,
    /// Most bytes one unfinished event may hold.
    limit: usize,
    /// Bytes examined so far, over the scanner's life: tests show with it
    /// that the work is linear in the stream however it is chunked.
    examined: u64,
}

impl Default for EventScanner {
    fn default() -> Self {
        Self::with_limit(usize::MAX)
    }
}

impl EventScanner {
    /// A scanner with nothing buffered and no bound on an event.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scanner that refuses an unfinished event of more than `limit`
    /// bytes.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            searched: 0,
            at_line_start: true,
            pending_cr: false,
            cr_ends_event: false,
            limit,
            examined: 0,
        }
    }

    /// Feeds a chunk; appends every event it completes to `out`, each with
    /// its terminating blank line. Events made only of blank lines are
    /// dropped. Fails when the unfinished event outgrows the limit (the
    /// events completed before it are in `out`).
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Bytes>) -> Result<(), EventTooLarge> {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.next_boundary() {
            let block = self.buf.split_to(end).freeze();
            self.reset_state();
            if !is_blank(&block) {
                out.push(block);
            }
        }
        if self.buf.len() > self.limit {
            return Err(EventTooLarge { limit: self.limit });
        }
        Ok(())
    }

    /// End of stream: the unterminated rest, if it holds anything, completed
    /// with a blank line.
    pub fn finish(&mut self) -> Option<Bytes> {
        let mut rest = std::mem::take(&mut self.buf);
        let (ends_line, complete) = (self.at_line_start, self.cr_ends_event);
        self.reset_state();
        if is_blank(&rest) {
            return None;
        }
        if complete {
            return Some(rest.freeze());
        }
        let eol = eol_of(&rest);
        if !ends_line {
            rest.put_slice(eol);
        }
        // A `\r` that ends the rest is a line ending of its own: a `\n`
        // put after it would join it into one `\r\n`, and the event would
        // end without its blank line.
        if eol == b"\n" && rest.ends_with(b"\r") {
            rest.put_slice(b"\r\n");
        } else {
            rest.put_slice(eol);
        }
        Some(rest.freeze())
    }

    /// Bytes held waiting for the end of their event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes examined so far.
    #[cfg(test)]
    pub(crate) fn examined(&self) -> u64 {
        self.examined
    }

    fn reset_state(&mut self) {
        self.searched = 0;
        self.at_line_start = true;
        self.pending_cr = false;
        self.cr_ends_event = false;
    }

    /// Offset just past the next blank line, if the buffer holds one.
    fn next_boundary(&mut self) -> Option<usize> {
        loop {
            let i = self.searched;
            if self.pending_cr {
                let next = *self.buf.get(i)?;
                self.examined += 1;
                self.pending_cr = false;
                if next == b'\n' {
                    // The second half of a `\r\n`.
                    self.searched = i + 1;
                    if self.cr_ends_event {
                        return Some(i + 1);
                    }
                    continue;
                }
                if self.cr_ends_event {
                    // A lone `\r` ended the blank line; `next` is the next
                    // event's.
                    return Some(i);
                }
            }
            let Some(off) = memchr::memchr2(b'\n', b'\r', self.buf.get(i..)?) else {
                self.examined += (self.buf.len() - i) as u64;
                if self.buf.len() > i {
                    self.at_line_start = false;
                }
                self.searched = self.buf.len();
                return None;
            };
            let at = i + off;
            self.examined += off as u64 + 1;
            let blank = self.at_line_start && off == 0;
            self.searched = at + 1;
            self.at_line_start = true;
            if self.buf.get(at) == Some(&b'\r') {
                self.pending_cr = true;
                self.cr_ends_event = blank;
            } else if blank {
                return Some(at + 1);
            }
        }
    }
}

/// The line ending `block` uses (its first one), `\n` when it has none.
fn eol_of(block: &[u8]) -> &'static [u8] {
    match memchr::memchr2(b'\n', b'\r', block) {
        Some(i) if block.get(i) == Some(&b'\r') => {
            if block.get(i + 1) == Some(&b'\n') {
                b"\r\n"
            } else {
                b"\r"
            }
        }
        _ => b"\n",
    }
}

fn is_blank(b: &[u8]) -> bool {
    b.iter().all(|&c| c == b'\n' || c == b'\r')
}

/// Lines of `block`, each with its terminator (`\r\n`, `\n` or `\r`).
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = match memchr::memchr2(b'\n', b'\r', rest) {
            None => rest.len(),
            Some(i) if rest.get(i) == Some(&b'\r') && rest.get(i + 1) == Some(&b'\n') => i + 2,
            Some(i) => i + 1,
        };
        let (line, tail) = rest.split_at(end);
        rest = tail;
        Some(line)
    })
}

fn content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `event` with its `id` field replaced by `id: {id}` (first line), leading
/// blank lines dropped, everything else byte for byte. The id line uses the
/// event's own line ending.
pub fn rewrite_id(event: &[u8], id: EventId) -> Bytes {
    let eol = eol_of(event);
    let mut out = BytesMut::with_capacity(event.len() + 16);
    out.put_slice(format!("id: {id}").as_bytes());
    out.put_slice(eol);
    let mut leading = true;
    for line in lines(event) {
        let c = content(line);
        if leading && c.is_empty() {
            continue;
        }
        leading = false;
        if c == b"id" || c.starts_with(b"id:") {
            continue;
        }
        out.put_slice(line);
    }
    out.freeze()
}

/// The event's data: its `data` fields joined with `\n` (one leading space
/// after the colon removed), as an `EventSource` would deliver it.
pub fn data_of(event: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut first = true;
    for line in lines(event) {
        let c = content(line);
        let value = if c == b"data" {
            &b""[..]
        } else if let Some(v) = c.strip_prefix(b"data:") {
            v.strip_prefix(b" ").unwrap_or(v)
        } else {
            continue;
        };
        if !first {
            out.push(b'\n');
        }
        first = false;
        out.extend_from_slice(value);
    }
    out
}

/// The event type of `event` (its last `event` field), if any.
pub fn event_of(event: &[u8]) -> Option<&[u8]> {
    field_of(event, b"event")
}

/// The event id of `event` (its last `id` field), if any.
pub fn id_of(event: &[u8]) -> Option<&[u8]> {
    field_of(event, b"id")
}

/// The value of the last `name` field of `event`.
fn field_of<'a>(event: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    lines(event)
        .map(content)
        .filter_map(|c| {
            let rest = c.strip_prefix(name)?;
            if rest.is_empty() {
                Some(&b""[..])
            } else {
                rest.strip_prefix(b":")
                    .map(|v| v.strip_prefix(b" ").unwrap_or(v))
            }
        })
        .last()
}

/// A `Last-Event-ID` header as the event it names: [`Resume::Unknown`]
/// when it is not one of ours.
pub fn parse_last_event_id(value: &HeaderValue) -> Resume {
    EventId::parse(value.as_bytes()).map_or(Resume::Unknown, Resume::After)
}

/// Where the client asks its stream to start (its `Last-Event-ID`).
pub(crate) fn resume_of(headers: &HeaderMap) -> Resume {
    headers
        .get(LAST_EVENT_ID)
        .map_or(Resume::Whole, parse_last_event_id)
}

/// The run that produced recorded `events` (from the first one's id).
pub fn run_of(events: &[Bytes]) -> Option<u64> {
    events
        .first()
        .and_then(|e| id_of(e))
        .and_then(EventId::parse)
        .map(|id| id.run)
}

/// Whether a `content-type` value is an event stream.
pub fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

#[cfg(test)]
mod tests;
