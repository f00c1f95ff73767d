//! What an upstream streams: the SSE scanner, id rewriting, the fields of
//! an event, the dialect judge and usage figures.

use bytes::Bytes;
use idemgate_layer::StreamDialect;
use idemgate_layer::sse::{EventId, EventScanner, data_of, event_of, id_of, rewrite_id};
use idemgate_layer::stored::{StreamUsage, usage_of_json};

use crate::input::Input;

/// Events of `stream` fed in the pieces cut at `cuts`, and the rest at
/// the end; `None` when `limit` was exceeded (the events completed before
/// are in `events`).
fn scan(stream: &[u8], cuts: &[usize], limit: usize, events: &mut Vec<Bytes>) -> Option<Bytes> {
    let mut scanner = EventScanner::with_limit(limit);
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        scanner.push(&stream[from..cut], events).ok()?;
        from = cut;
    }
    let rest = scanner.finish();
    assert_eq!(scanner.buffered(), 0);
    Some(rest.unwrap_or_default())
}

fn is_eol(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// Whether `event` ends with a blank line: a line ending right after
/// another.
fn ends_with_blank_line(event: &[u8]) -> bool {
    let without = event
        .strip_suffix(b"\r\n")
        .or_else(|| event.strip_suffix(b"\n"))
        .or_else(|| event.strip_suffix(b"\r"));
    without.is_some_and(|w| w.last().copied().is_some_and(is_eol))
}

/// The SSE scanner and everything that reads its events.
///
/// The first byte says how many cuts (0–15) the stream is fed in, the
/// next two bytes per cut where; the rest is the stream. The events must
/// not depend on the cuts (nor on feeding one byte at a time); each ends
/// with a blank line; a scanner with a small limit gives a prefix of
/// them. Rewriting an event's id changes its id and nothing else that is
/// read from it; the judge parses each event's JSON at most once.
pub fn sse(data: &[u8]) {
    let mut input = Input::new(data);
    let n = usize::from(input.byte() % 16);
    let raw_cuts: Vec<u16> = (0..n)
        .map(|_| u16::from_be_bytes([input.byte(), input.byte()]))
        .collect();
    let stream = input.rest();
    let mut cuts: Vec<usize> = raw_cuts
        .iter()
        .map(|&c| usize::from(c) % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();

    let mut whole = Vec::new();
    let whole_rest = scan(stream, &[], usize::MAX, &mut whole);
    let mut chunked = Vec::new();
    let chunked_rest = scan(stream, &cuts, usize::MAX, &mut chunked);
    assert_eq!(chunked, whole, "events depend on the cuts {cuts:?}");
    assert_eq!(chunked_rest, whole_rest, "the rest depends on the cuts");
    if stream.len() <= 4096 {
        let every: Vec<usize> = (1..stream.len()).collect();
        let mut bytewise = Vec::new();
        let bytewise_rest = scan(stream, &every, usize::MAX, &mut bytewise);
        assert_eq!(bytewise, whole, "events fed byte by byte differ");
        assert_eq!(bytewise_rest, whole_rest);
    }
    let limit = usize::from(data.first().copied().unwrap_or(0)) * 4;
    let mut limited = Vec::new();
    let limited_rest = scan(stream, &cuts, limit, &mut limited);
    assert!(whole.starts_with(&limited), "a limit changed the events");
    if limited_rest.is_some() {
        assert_eq!(limited, whole);
    }

    let mut all = whole.clone();
    if let Some(rest) = whole_rest.filter(|r| !r.is_empty()) {
        all.push(rest);
    }
    for (i, event) in all.iter().enumerate() {
        assert!(
            ends_with_blank_line(event),
            "event {event:?} has no blank line"
        );
        let id = EventId {
            run: data.len() as u64,
            n: i as u64 + 1,
        };
        let rewritten = rewrite_id(event, id);
        assert_eq!(
            id_of(&rewritten),
            Some(id.to_string().as_bytes()),
            "{event:?}"
        );
        assert_eq!(data_of(&rewritten), data_of(event), "{event:?}");
        assert_eq!(event_of(&rewritten), event_of(event), "{event:?}");
    }
    for dialect in [
        StreamDialect::Openai,
        StreamDialect::Anthropic,
        StreamDialect::OpenaiResponses,
        StreamDialect::None,
    ] {
        let judged = idemgate_layer::fuzzing::judge(dialect, &all);
        assert!(judged.parses <= all.len() as u64, "{dialect:?}: {judged:?}");
    }
    let mut usage = StreamUsage::default();
    for event in &all {
        usage.add_event(event);
    }
    let _ = usage.finish();
    let _ = usage_of_json(stream);
}
