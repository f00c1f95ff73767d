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
//! Ids are rewritten to `1, 2, 3, …` so that a client reconnecting with
//! `Last-Event-ID: n` can be given exactly the events after `n`, from the
//! recording or from the live stream, whatever ids the upstream used.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

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
        rest.put_slice(eol);
        Some(rest.freeze())
    }

    /// Bytes held waiting for the end of their event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
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
                if self.buf.len() > i {
                    self.at_line_start = false;
                }
                self.searched = self.buf.len();
                return None;
            };
            let at = i + off;
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
pub fn rewrite_id(event: &[u8], id: u64) -> Bytes {
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

/// A `Last-Event-ID` header as an event number; `None` when it is not one of
/// ours (then the whole stream is sent).
pub fn parse_last_event_id(value: &HeaderValue) -> Option<u64> {
    let s = value.to_str().ok()?.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// How many events of a stream the client already has: the number in its
/// `Last-Event-ID`, or 0 when it sent none of ours.
pub(crate) fn events_to_skip(headers: &HeaderMap) -> usize {
    headers
        .get(LAST_EVENT_ID)
        .and_then(parse_last_event_id)
        .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Whether a `content-type` value is an event stream.
pub fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan_all(chunks: &[&[u8]]) -> (Vec<Bytes>, Option<Bytes>) {
        let mut s = EventScanner::new();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out).unwrap();
        }
        let rest = s.finish();
        (out, rest)
    }

    #[test]
    fn finds_boundaries_of_every_line_ending() {
        let (events, rest) =
            scan_all(&[b"data: a\n\ndata: b\r\n\r\ndata: c\n\r\nevent: x\r\n\ndata: tail"]);
        assert_eq!(
            events,
            vec![
                Bytes::from_static(b"data: a\n\n"),
                Bytes::from_static(b"data: b\r\n\r\n"),
                Bytes::from_static(b"data: c\n\r\n"),
                Bytes::from_static(b"event: x\r\n\n"),
            ]
        );
        assert_eq!(rest, Some(Bytes::from_static(b"data: tail\n\n")));
    }

    #[test]
    fn boundaries_split_across_chunks() {
        let (events, rest) = scan_all(&[b"data: a\r", b"\n", b"\r", b"\n", b"data: b\n", b"\n"]);
        assert_eq!(
            events,
            vec![
                Bytes::from_static(b"data: a\r\n\r\n"),
                Bytes::from_static(b"data: b\n\n")
            ]
        );
        assert_eq!(rest, None);
    }

    #[test]
    fn a_lone_cr_ends_lines_and_events() {
        let (events, rest) = scan_all(&[b"event: a\rdata: 1\r\rdata: 2\r\n\rdata: 3\n\r"]);
        assert_eq!(
            events,
            vec![
                Bytes::from_static(b"event: a\rdata: 1\r\r"),
                Bytes::from_static(b"data: 2\r\n\r"),
            ]
        );
        // A `\r` at the very end is decided only at the end of the stream.
        assert_eq!(rest, Some(Bytes::from_static(b"data: 3\n\r")));
        assert_eq!(data_of(b"event: a\rdata: 1\rdata: 2\r\r"), b"1\n2");
        assert_eq!(event_of(b"event: a\rdata: 1\r\r"), Some(&b"a"[..]));
        assert_eq!(rewrite_id(b"id: 9\rdata: 1\r\r", 2), "id: 2\rdata: 1\r\r");
        assert_eq!(
            scan_all(&[b"data: x\r"]).1,
            Some(Bytes::from_static(b"data: x\r\r"))
        );
    }

    #[test]
    fn a_cr_lf_split_across_chunks_is_one_line_ending() {
        // The blank line's `\r` ends a chunk; its `\n` opens the next.
        let (events, rest) = scan_all(&[b"data: a\r\n\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(
            events,
            vec![
                Bytes::from_static(b"data: a\r\n\r\n"),
                Bytes::from_static(b"data: b\r\n\r\n"),
            ]
        );
        assert_eq!(rest, None);
    }

    #[test]
    fn an_event_past_the_limit_is_refused() {
        let mut s = EventScanner::with_limit(16);
        let mut out = Vec::new();
        assert_eq!(s.push(b"data: a\n\ndata: 0123", &mut out), Ok(()));
        assert_eq!(out, vec![Bytes::from_static(b"data: a\n\n")]);
        assert_eq!(
            s.push(b"456789abcdef", &mut out),
            Err(EventTooLarge { limit: 16 })
        );
        // Complete events, however large the chunk, are not held.
        let mut s = EventScanner::with_limit(16);
        let big = b"data: 0123456789\n\n".repeat(10);
        assert_eq!(s.push(&big, &mut out), Ok(()));
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn blank_blocks_are_dropped() {
        let (events, rest) = scan_all(&[b"\n\n\r\n\r\ndata: a\n\n\n\n"]);
        assert_eq!(events, vec![Bytes::from_static(b"data: a\n\n")]);
        assert_eq!(rest, None);
        assert_eq!(scan_all(&[b"\r\n"]).1, None);
    }

    #[test]
    fn rewriting_replaces_ids_and_keeps_the_rest() {
        assert_eq!(rewrite_id(b"data: a\n\n", 1), "id: 1\ndata: a\n\n");
        assert_eq!(
            rewrite_id(b"id: upstream-7\r\nevent: delta\r\ndata: x\r\n\r\n", 12),
            "id: 12\r\nevent: delta\r\ndata: x\r\n\r\n"
        );
        assert_eq!(rewrite_id(b"\ndata: a\nid\n\n", 3), "id: 3\ndata: a\n\n");
        assert_eq!(rewrite_id(b": ping\n\n", 4), "id: 4\n: ping\n\n");
        // `idle:` is not an id field.
        assert_eq!(rewrite_id(b"idle: 1\n\n", 5), "id: 5\nidle: 1\n\n");
    }

    #[test]
    fn data_and_ids_are_read_like_an_event_source() {
        assert_eq!(data_of(b"event: e\ndata: a\ndata:b\ndata\n\n"), b"a\nb\n");
        assert_eq!(data_of(b"data: {\"x\":1}\r\n\r\n"), b"{\"x\":1}");
        assert_eq!(id_of(b"id: 9\ndata: a\n\n"), Some(&b"9"[..]));
        assert_eq!(id_of(b"data: a\n\n"), None);
    }

    #[test]
    fn last_event_id_and_content_type() {
        assert_eq!(
            parse_last_event_id(&HeaderValue::from_static("12")),
            Some(12)
        );
        assert_eq!(
            parse_last_event_id(&HeaderValue::from_static(" 3 ")),
            Some(3)
        );
        assert_eq!(parse_last_event_id(&HeaderValue::from_static("-1")), None);
        assert_eq!(parse_last_event_id(&HeaderValue::from_static("abc")), None);
        assert_eq!(
            parse_last_event_id(&HeaderValue::from_static("99999999999999999999999")),
            None
        );
        assert!(is_event_stream(Some(&HeaderValue::from_static(
            "text/event-stream; charset=utf-8"
        ))));
        assert!(is_event_stream(Some(&HeaderValue::from_static(
            "Text/Event-Stream"
        ))));
        assert!(!is_event_stream(Some(&HeaderValue::from_static(
            "application/json"
        ))));
        assert!(!is_event_stream(None));
    }

    /// One event: field lines of printable text, one line ending throughout.
    fn event_strategy() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::collection::vec("(data|event|id|: ?[a-z]*|retry): ?[ -~]{0,40}", 1..5),
            0..3u8,
        )
            .prop_map(|(lines, eol)| {
                let eol: &[u8] = match eol {
                    0 => b"\n",
                    1 => b"\r\n",
                    _ => b"\r",
                };
                let mut out = Vec::new();
                for l in lines {
                    out.extend_from_slice(l.as_bytes());
                    out.extend_from_slice(eol);
                }
                out.extend_from_slice(eol);
                out
            })
    }

    fn chunked(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts {
            out.push(stream[prev..c].to_vec());
            prev = c;
        }
        out.push(stream[prev..].to_vec());
        out
    }

    proptest! {
        #[test]
        fn events_survive_any_chunking(
            events in proptest::collection::vec(event_strategy(), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let stream: Vec<u8> = events.concat();
            let mut s = EventScanner::new();
            let mut got = Vec::new();
            for chunk in chunked(&stream, &cuts) {
                prop_assert!(s.push(&chunk, &mut got).is_ok());
            }
            // A stream's last `\r` is decided at its end.
            got.extend(s.finish());
            let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(got, events);
        }

        #[test]
        fn a_limit_every_event_fits_changes_nothing_and_a_smaller_one_is_hit(
            events in proptest::collection::vec(event_strategy(), 1..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let stream: Vec<u8> = events.concat();
            let largest = events.iter().map(Vec::len).max().unwrap_or(0);
            let mut s = EventScanner::with_limit(largest);
            let mut got = Vec::new();
            for chunk in chunked(&stream, &cuts) {
                prop_assert!(s.push(&chunk, &mut got).is_ok());
            }
            got.extend(s.finish());
            let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(got, events.clone());
            // Fed whole, the largest event cannot fit a smaller limit
            // (it is held whole until its last byte comes).
            let big = events.iter().find(|e| e.len() == largest).cloned().unwrap_or_default();
            let mut s = EventScanner::with_limit(largest.saturating_sub(3));
            let mut out = Vec::new();
            let cut = big.len().saturating_sub(2);
            let res = s.push(&big[..cut], &mut out).and_then(|()| s.push(&big[cut..], &mut out));
            prop_assert!(res.is_err() || big.len() <= 3, "{:?}", res);
        }

        #[test]
        fn rewritten_streams_rescan_to_the_same_events_with_sequential_ids(
            events in proptest::collection::vec(event_strategy(), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let rewritten: Vec<Bytes> = events
                .iter()
                .enumerate()
                .map(|(i, e)| rewrite_id(e, i as u64 + 1))
                .collect();
            let stream: Vec<u8> = rewritten.concat();
            let mut s = EventScanner::new();
            let mut got = Vec::new();
            for chunk in chunked(&stream, &cuts) {
                prop_assert!(s.push(&chunk, &mut got).is_ok());
            }
            got.extend(s.finish());
            prop_assert_eq!(&got, &rewritten);
            for (i, (e, orig)) in got.iter().zip(&events).enumerate() {
                let expected_id = (i + 1).to_string();
                prop_assert_eq!(id_of(e), Some(expected_id.as_bytes()));
                prop_assert_eq!(data_of(e), data_of(orig));
            }
        }


        /// A `Last-Event-ID` of any bytes never panics; a number is read
        /// only from digits, and every `u64` (padded with spaces) is read back.
        #[test]
        fn last_event_id_of_any_bytes(raw in proptest::collection::vec(any::<u8>(), 0..40), n in any::<u64>(), pad in "[ \t]{0,3}") {
            if let Ok(value) = HeaderValue::from_bytes(&raw) {
                if let Some(got) = parse_last_event_id(&value) {
                    let text = std::str::from_utf8(&raw).unwrap().trim();
                    prop_assert!(text.bytes().all(|b| b.is_ascii_digit()));
                    prop_assert_eq!(text.parse::<u64>().ok(), Some(got));
                }
                let mut h = HeaderMap::new();
                h.insert(LAST_EVENT_ID, value);
                let _ = events_to_skip(&h);
            }
            let padded = HeaderValue::from_str(&format!("{pad}{n}{pad}")).unwrap();
            prop_assert_eq!(parse_last_event_id(&padded), Some(n));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_lose_nothing(
            stream in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
        ) {
            let mut s = EventScanner::new();
            let mut got = Vec::new();
            for chunk in chunked(&stream, &cuts) {
                prop_assert!(s.push(&chunk, &mut got).is_ok());
            }
            let rest = s.finish();
            for e in &got {
                let _ = rewrite_id(e, 1);
                let _ = data_of(e);
            }
            // Every non-blank byte of the input is in some event, in order.
            let kept: Vec<u8> = got.iter().flat_map(|b| b.to_vec()).chain(rest.iter().flat_map(|b| b.to_vec())).filter(|b| *b != b'\n' && *b != b'\r').collect();
            let input: Vec<u8> = stream.iter().copied().filter(|b| *b != b'\n' && *b != b'\r').collect();
            prop_assert_eq!(kept, input);
        }
    }
}
