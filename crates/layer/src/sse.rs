//! Server-sent events: finding event boundaries in a byte stream, giving
//! each event a sequential id, and reading an event's data.
//!
//! The stream is relayed as bytes, not re-serialized: the scanner only finds
//! where each event ends (a blank line: `\n\n`, `\r\n\r\n` or a mix), so an
//! event is forwarded exactly as the upstream wrote it except for its `id:`
//! line. Each byte is examined once however the stream is chunked (an event
//! split across chunks costs no re-scan), which keeps large events linear.
//! A lone `\r` line ending (allowed by the WHATWG grammar, unused by LLM
//! APIs) is not treated as a boundary.
//!
//! Ids are rewritten to `1, 2, 3, …` so that a client reconnecting with
//! `Last-Event-ID: n` can be given exactly the events after `n`, from the
//! recording or from the live stream, whatever ids the upstream used.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// Splits a byte stream into SSE events.
#[derive(Debug, Default)]
pub struct EventScanner {
    buf: BytesMut,
    /// Bytes of `buf` before this offset hold no boundary (resuming point).
    searched: usize,
}

impl EventScanner {
    /// A scanner with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; appends every event it completes to `out`, each with
    /// its terminating blank line. Events made only of blank lines are
    /// dropped.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Bytes>) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.next_boundary() {
            let block = self.buf.split_to(end).freeze();
            self.searched = 0;
            if !is_blank(&block) {
                out.push(block);
            }
        }
    }

    /// End of stream: the unterminated rest, if it holds anything, completed
    /// with a blank line.
    pub fn finish(&mut self) -> Option<Bytes> {
        let mut rest = std::mem::take(&mut self.buf);
        self.searched = 0;
        if is_blank(&rest) {
            return None;
        }
        let eol: &[u8] = if memchr::memmem::find(&rest, b"\r\n").is_some() {
            b"\r\n"
        } else {
            b"\n"
        };
        if !rest.ends_with(b"\n") {
            rest.put_slice(eol);
        }
        rest.put_slice(eol);
        Some(rest.freeze())
    }

    /// Bytes held waiting for the end of their event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Offset just past the next blank line, if the buffer holds one.
    fn next_boundary(&mut self) -> Option<usize> {
        loop {
            let from = self.searched;
            let Some(off) = memchr::memchr(b'\n', self.buf.get(from..)?) else {
                self.searched = self.buf.len();
                return None;
            };
            let i = from + off;
            match (self.buf.get(i + 1), self.buf.get(i + 2)) {
                (Some(b'\n'), _) => return Some(i + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
                // Not decidable yet: look at this '\n' again with more bytes.
                (None, _) | (Some(b'\r'), None) => {
                    self.searched = i;
                    return None;
                }
                _ => self.searched = i + 1,
            }
        }
    }
}

fn is_blank(b: &[u8]) -> bool {
    b.iter().all(|&c| c == b'\n' || c == b'\r')
}

/// Lines of `block`, each with its terminator.
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    block.split_inclusive(|&b| b == b'\n')
}

fn content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `event` with its `id` field replaced by `id: {id}` (first line), leading
/// blank lines dropped, everything else byte for byte. The id line uses the
/// event's own line ending.
pub fn rewrite_id(event: &[u8], id: u64) -> Bytes {
    let eol: &[u8] = match memchr::memchr(b'\n', event) {
        Some(i) if i > 0 && event.get(i - 1) == Some(&b'\r') => b"\r\n",
        _ => b"\n",
    };
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

/// The event id of `event` (its last `id` field), if any.
pub fn id_of(event: &[u8]) -> Option<&[u8]> {
    lines(event)
        .map(content)
        .filter_map(|c| {
            if c == b"id" {
                Some(&b""[..])
            } else {
                c.strip_prefix(b"id:")
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
            s.push(c, &mut out);
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
            any::<bool>(),
        )
            .prop_map(|(lines, crlf)| {
                let eol: &[u8] = if crlf { b"\r\n" } else { b"\n" };
                let mut out = Vec::new();
                for l in lines {
                    out.extend_from_slice(l.as_bytes());
                    out.extend_from_slice(eol);
                }
                out.extend_from_slice(eol);
                out
            })
    }

    /// The reference splitter: one pass over the whole input.
    fn split_at_blank_lines(stream: &[u8]) -> (Vec<Vec<u8>>, &[u8]) {
        let mut events = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i < stream.len() {
            let end = match (stream[i], stream.get(i + 1), stream.get(i + 2)) {
                (b'\n', Some(b'\n'), _) => i + 2,
                (b'\n', Some(b'\r'), Some(b'\n')) => i + 3,
                _ => {
                    i += 1;
                    continue;
                }
            };
            if !is_blank(&stream[start..end]) {
                events.push(stream[start..end].to_vec());
            }
            start = end;
            i = end;
        }
        (events, &stream[start..])
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
                s.push(&chunk, &mut got);
            }
            prop_assert_eq!(s.finish(), None);
            let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(got, events);
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
                s.push(&chunk, &mut got);
            }
            prop_assert_eq!(&got, &rewritten);
            for (i, (e, orig)) in got.iter().zip(&events).enumerate() {
                let expected_id = (i + 1).to_string();
                prop_assert_eq!(id_of(e), Some(expected_id.as_bytes()));
                prop_assert_eq!(data_of(e), data_of(orig));
            }
        }

        /// Any bytes, in any chunking, give the events a one-pass splitter
        /// finds in the whole input: cut after each blank line (`\n\n` or
        /// `\n\r\n`), blank blocks dropped, the unterminated rest kept for
        /// `finish`.
        #[test]
        fn any_bytes_split_at_blank_lines_whatever_the_chunking(
            stream in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'd'), any::<u8>()],
                0..400,
            ),
            cuts in proptest::collection::vec(any::<usize>(), 0..32),
        ) {
            let (expected, rest) = split_at_blank_lines(&stream);
            let mut s = EventScanner::new();
            let mut got = Vec::new();
            for chunk in chunked(&stream, &cuts) {
                s.push(&chunk, &mut got);
            }
            let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(got, expected);
            prop_assert_eq!(s.buffered(), rest.len());
            match s.finish() {
                None => prop_assert!(is_blank(rest)),
                Some(last) => {
                    prop_assert!(!is_blank(rest));
                    prop_assert!(last.starts_with(rest));
                    prop_assert!(last.ends_with(b"\n"));
                }
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
                s.push(&chunk, &mut got);
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
