//! Unit tests of the parent module.

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
    assert_eq!(
        rewrite_id(b"id: 9\rdata: 1\r\r", id(2)),
        "id: 7-2\rdata: 1\r\r"
    );
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

/// Streams of about `n` bytes in the shapes that cost a naive scanner a
/// re-scan per chunk: one huge event, many small ones, lone `\r`s,
/// `\r\n` pairs split across chunks.
fn hostile_streams(n: usize) -> Vec<(&'static str, Vec<u8>, usize)> {
    vec![
        (
            "one event byte by byte",
            format!("data: {}\n\n", "x".repeat(n)).into_bytes(),
            1,
        ),
        (
            "small events in odd chunks",
            b"data: {}\n\n".repeat(n / 10),
            7,
        ),
        ("lone carriage returns", b"data: a\r".repeat(n / 8), 3),
        ("split crlf", b"data: a\r\n\r\n".repeat(n / 12), 9),
        ("no line ending at all", vec![b'a'; n], 1),
    ]
}

#[test]
fn scanning_examines_each_byte_at_most_twice_however_the_stream_is_chunked() {
    for n in [10_000, 100_000, 1_000_000] {
        for (name, stream, chunk) in hostile_streams(n) {
            let mut s = EventScanner::new();
            let mut out = Vec::new();
            for c in stream.chunks(chunk) {
                s.push(c, &mut out).unwrap();
                out.clear();
            }
            // Once each, but for the byte after a lone `\r`, which is
            // looked at once more to see that it is not a `\n`.
            assert!(
                s.examined() <= 2 * stream.len() as u64,
                "{name}: {} bytes examined for a {} byte stream",
                s.examined(),
                stream.len()
            );
        }
    }
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
    assert_eq!(rewrite_id(b"data: a\n\n", id(1)), "id: 7-1\ndata: a\n\n");
    assert_eq!(
        rewrite_id(b"id: upstream-7\r\nevent: delta\r\ndata: x\r\n\r\n", id(12)),
        "id: 7-12\r\nevent: delta\r\ndata: x\r\n\r\n"
    );
    assert_eq!(
        rewrite_id(b"\ndata: a\nid\n\n", id(3)),
        "id: 7-3\ndata: a\n\n"
    );
    assert_eq!(rewrite_id(b": ping\n\n", id(4)), "id: 7-4\n: ping\n\n");
    // `idle:` is not an id field.
    assert_eq!(rewrite_id(b"idle: 1\n\n", id(5)), "id: 7-5\nidle: 1\n\n");
}

/// Event `n` of run 7.
fn id(n: u64) -> EventId {
    EventId { run: 7, n }
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
    let parse = |s: &'static str| parse_last_event_id(&HeaderValue::from_static(s));
    assert_eq!(parse("12-3"), Resume::After(EventId { run: 12, n: 3 }));
    assert_eq!(parse(" 12-3 "), Resume::After(EventId { run: 12, n: 3 }));
    // Not one of ours: a bare number, a zeroth event, signs, garbage,
    // numbers past 64 bits.
    for other in [
        "12",
        "12-0",
        "-1",
        "1--2",
        "a-1",
        "1-2-3",
        "abc",
        "",
        "99999999999999999999999-1",
    ] {
        assert_eq!(parse(other), Resume::Unknown, "{other:?}");
    }
    // A stream resumes only within its own run.
    let after = Resume::After(EventId { run: 12, n: 3 });
    assert_eq!(after.skip_for(Some(12)), (3, false));
    assert_eq!(after.skip_for(Some(13)), (0, true));
    assert_eq!(after.skip_for(None), (0, true));
    assert_eq!(Resume::Unknown.skip_for(Some(12)), (0, true));
    assert_eq!(Resume::Whole.skip_for(Some(12)), (0, false));
    assert_eq!(
        run_of(&[Bytes::from_static(b"id: 12-1\ndata: a\n\n")]),
        Some(12)
    );
    assert_eq!(run_of(&[Bytes::from_static(b"data: a\n\n")]), None);
    assert_eq!(run_of(&[]), None);
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

#[test]
fn a_stream_that_stops_after_a_lone_cr_still_ends_its_event_with_a_blank_line() {
    // The event's first line ends with `\n`, its last with a lone `\r`
    // at the very end of the stream: a `\n` added as the blank line
    // would make that `\r\n` one line ending, and a client would never
    // see the event.
    for tail in [
        &b"%\ndata: b\r\na\r"[..],
        b"data: a\ndata: b\r",
        b"data: a\n:\r",
    ] {
        let (events, rest) = scan_all(&[tail]);
        assert!(events.is_empty());
        let rest = rest.expect("the event is kept");
        assert!(rest.starts_with(tail));
        let (again, none) = scan_all(&[&rest]);
        assert_eq!(
            again,
            vec![rest.clone()],
            "{rest:?} ends with its blank line"
        );
        assert_eq!(none, None);
        assert_eq!(data_of(&rest), data_of(tail));
    }
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
            .map(|(i, e)| rewrite_id(e, EventId { run: 5, n: i as u64 + 1 }))
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
            let expected_id = format!("5-{}", i + 1);
            prop_assert_eq!(id_of(e), Some(expected_id.as_bytes()));
            prop_assert_eq!(data_of(e), data_of(orig));
        }
    }


    /// A `Last-Event-ID` of any bytes never panics; an event is read only
    /// from `digits-digits`, and every id we write (padded with spaces) is
    /// read back.
    #[test]
    fn last_event_id_of_any_bytes(raw in proptest::collection::vec(any::<u8>(), 0..40), run in any::<u64>(), n in 1..u64::MAX, pad in "[ \t]{0,3}") {
        if let Ok(value) = HeaderValue::from_bytes(&raw) {
            if let Resume::After(got) = parse_last_event_id(&value) {
                let text = std::str::from_utf8(&raw).unwrap().trim();
                prop_assert!(text.bytes().all(|b| b.is_ascii_digit() || b == b'-'));
                prop_assert_eq!(text.matches('-').count(), 1);
                prop_assert!(got.n >= 1);
                let again = HeaderValue::from_str(&got.to_string()).unwrap();
                prop_assert_eq!(parse_last_event_id(&again), Resume::After(got));
            }
            let mut h = HeaderMap::new();
            h.insert(LAST_EVENT_ID, value);
            let _ = resume_of(&h).skip_for(Some(run));
        }
        let id = EventId { run, n };
        let padded = HeaderValue::from_str(&format!("{pad}{id}{pad}")).unwrap();
        prop_assert_eq!(parse_last_event_id(&padded), Resume::After(id));
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
            let _ = rewrite_id(e, EventId { run: 1, n: 1 });
            let _ = data_of(e);
        }
        // Every non-blank byte of the input is in some event, in order.
        let kept: Vec<u8> = got.iter().flat_map(|b| b.to_vec()).chain(rest.iter().flat_map(|b| b.to_vec())).filter(|b| *b != b'\n' && *b != b'\r').collect();
        let input: Vec<u8> = stream.iter().copied().filter(|b| *b != b'\n' && *b != b'\r').collect();
        prop_assert_eq!(kept, input);
    }
}

/// Streams far beyond the usual, with how many events each holds: one
/// event of up to 1 MiB, up to 100,000 small events, runs of blank lines
/// only, events whose data nests 10,000 levels deep; any line ending.
fn hostile_stream() -> impl Strategy<Value = (Vec<u8>, usize)> {
    let eol = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
    prop_oneof![
        (0usize..=1 << 20, eol.clone()).prop_map(|(n, eol)| {
            (format!("data: {}{eol}{eol}", "a".repeat(n)).into_bytes(), 1)
        }),
        (0usize..=100_000, eol.clone()).prop_map(|(n, eol)| {
            (
                format!("event: e{eol}data: x{eol}{eol}")
                    .repeat(n)
                    .into_bytes(),
                n,
            )
        }),
        (0usize..=100_000, eol.clone()).prop_map(|(n, eol)| (eol.repeat(n).into_bytes(), 0)),
        (1usize..=10_000, eol).prop_map(|(n, eol)| {
            let data = format!("{{\"error\":{}{}}}", "[".repeat(n), "]".repeat(n));
            (format!("data: {data}{eol}{eol}").into_bytes(), 1)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// However large the events, however many and however cut, the
    /// scanner finds each one once, the same as when fed whole, and the
    /// same with a limit every event fits.
    #[test]
    fn hostile_streams_scan_the_same_however_chunked(
        (stream, count) in hostile_stream(),
        cuts in proptest::collection::vec(any::<usize>(), 0..64),
    ) {
        let whole = scan_all(&[&stream]);
        let chunks = chunked(&stream, &cuts);
        let pieces: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let cut = scan_all(&pieces);
        prop_assert_eq!(&cut, &whole);
        let (events, rest) = whole;
        prop_assert_eq!(events.len() + usize::from(rest.is_some()), count);
        // A `\r` at the end of a piece is held until the next byte.
        let largest = events.iter().chain(&rest).map(Bytes::len).max().unwrap_or(0).max(2);
        let mut limited = EventScanner::with_limit(largest);
        let mut out = Vec::new();
        for piece in &pieces {
            prop_assert!(limited.push(piece, &mut out).is_ok());
        }
        prop_assert_eq!(out, events);
    }
}
