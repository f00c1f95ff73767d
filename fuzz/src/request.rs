//! What a client sends: the `Idempotency-Key`, the body (canonical JSON,
//! multipart, raw bytes) and the `Prefer` and `Last-Event-ID` headers.

use http::{HeaderMap, HeaderName, HeaderValue};
use idemgate_engine::MAX_KEY_LEN;
use idemgate_engine::{BodyDigest, BodyError, MAX_JSON_DEPTH, canonical_json, digest_body};
use idemgate_engine::{ClientKey, DerivedKey, Fingerprint, ScopedKey, natural_key};
use idemgate_layer::key::{IDEMPOTENCY_KEY, KeyRefusal, client_key};
use idemgate_layer::operations::{operation_id, parse_operation_id};
use idemgate_layer::sse::{Resume, is_event_stream, parse_last_event_id};
use sha2::{Digest, Sha256};

use crate::input::Input;
use crate::reference;

/// The structured-field string form of `key`.
fn quoted(key: &str) -> String {
    format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `Idempotency-Key` parsing, as bytes and as a header, and operation ids.
///
/// An accepted key is 1 to 255 printable ASCII characters, means the same
/// in its quoted form, and survives the trip through an operation id; the
/// header path agrees with the byte parser.
pub fn key(data: &[u8]) {
    let parsed = ClientKey::parse_bytes(data);
    if let Ok(k) = &parsed {
        let s = k.as_str();
        assert!((1..=MAX_KEY_LEN).contains(&s.len()), "accepted {s:?}");
        assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{s:?}");
        assert_eq!(ClientKey::parse(&quoted(s)).as_ref(), Ok(k), "quoted {s:?}");
        for ns in ["chat/completions", "", "ns|1:x"] {
            let fp = Fingerprint::from_bytes([data.len() as u8; 32]);
            let id = operation_id(ns, k, &fp);
            let op = parse_operation_id(&id).expect("an id we wrote reads back");
            assert_eq!((op.namespace.as_str(), &op.key), (ns, k));
            assert_eq!(op.fingerprint[..], fp.as_bytes()[..16]);
        }
        let scoped = ScopedKey::new("tenant", "ns", k.clone());
        assert!(scoped.storage_id().ends_with(s));
    }
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value.clone());
        match (client_key(&headers), &parsed) {
            (Ok(Some(a)), Ok(b)) => assert_eq!(&a, b),
            (Err(KeyRefusal::Malformed(a)), Err(b)) => assert_eq!(&a, b),
            (got, want) => panic!("header gives {got:?}, bytes give {want:?}"),
        }
        headers.append(IDEMPOTENCY_KEY, value);
        assert_eq!(client_key(&headers), Err(KeyRefusal::Repeated));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(op) = parse_operation_id(text) {
            let mut fp = [0u8; 32];
            fp[..16].copy_from_slice(&op.fingerprint);
            let again = operation_id(&op.namespace, &op.key, &Fingerprint::from_bytes(fp));
            assert_eq!(parse_operation_id(&again), Some(op));
        }
        let _ = natural_key(text.split('\0'));
    }
}

/// The ignored pointers a `digest` input picks with its first byte.
const POINTER_SETS: [&[&str]; 8] = [
    &[],
    &["/a"],
    &["/a/b", "/0"],
    &["/messages/0/content", "/metadata/request_time"],
    &["", "/"],
    &["/~0~1", "/a~1b", "/~01"],
    &["/user", "/stream", "/a/0/b"],
    &["/0/0/0", "/0/1", "/a/a/a"],
];

/// How deep arrays and objects nest in `body`, outside strings; exact
/// for JSON, an estimate for anything else.
fn nesting(body: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether `body` holds a `\\uD800`–`\\uDFFF` escape (a surrogate).
fn has_surrogate_escape(body: &[u8]) -> bool {
    body.windows(4).any(|w| {
        w[0] == b'\\'
            && w[1] == b'u'
            && w[2].eq_ignore_ascii_case(&b'd')
            && matches!(w[3], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
    })
}

/// The digest of a body the earlier canonicaliser made canonical.
fn json_digest(canonical: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"j");
    h.update(canonical);
    h.finalize().into()
}

/// Body digests and canonical JSON.
///
/// The first byte picks ignored pointers; the rest is the body. Canonical
/// JSON is idempotent, reads as the same JSON value, gives the body's own
/// digest, and matches the earlier canonicaliser on every body that one
/// accepts.
pub fn digest(data: &[u8]) {
    let mut input = Input::new(data);
    let ignore: Vec<String> = POINTER_SETS[usize::from(input.byte() % 8)]
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
    let body = input.rest();

    let plain = digest_body(None, body, &[]);
    let canonical = canonical_json(body);
    // The earlier canonicaliser recursed once per level: it is only run
    // within the depth this one accepts.
    let shallow = nesting(body) <= MAX_JSON_DEPTH;
    if let Some(c) = &canonical {
        assert_eq!(canonical_json(c).as_ref(), Some(c), "not idempotent");
        assert_eq!(
            digest_body(None, c, &[]).map(|d| *d.as_bytes()),
            plain.clone().map(|d| *d.as_bytes()),
            "the canonical form has another digest"
        );
        assert_eq!(plain.clone().map(|d| *d.as_bytes()), Ok(json_digest(c)));
        let before = serde_json::from_slice::<serde_json::Value>(body);
        let after = serde_json::from_slice::<serde_json::Value>(c);
        if let (Ok(before), Ok(after)) = (before, after) {
            assert_eq!(before, after, "the canonical form is another value");
        }
    }
    if shallow {
        let earlier = reference::canonical(body, &[]);
        assert_eq!(canonical, earlier, "differs from the earlier form");
    }
    if canonical.is_none() {
        match &plain {
            Ok(_) => {}
            Err(BodyError::DuplicateKey { .. } | BodyError::TooDeep { .. }) => {}
            Err(e) => panic!("unexpected refusal {e:?}"),
        }
    }

    let with_pointers = digest_body(None, body, &ignore);
    if shallow
        && !ignore.is_empty()
        && let Some(e) = reference::canonical(body, &ignore)
    {
        match &with_pointers {
            // The earlier one never read an ignored member's strings; this
            // one reads them all, and a lone surrogate escape anywhere
            // leaves the body without a canonical text (hashed raw).
            Ok(d) if canonical.is_none() && has_surrogate_escape(body) => {
                assert_eq!(Ok(*d), plain.clone(), "pointers {ignore:?}");
            }
            Ok(d) => assert_eq!(d.as_bytes(), &json_digest(&e), "pointers {ignore:?}"),
            // The earlier one did not look inside ignored members for
            // repeated keys; this one refuses them anywhere.
            Err(BodyError::DuplicateKey { .. }) => {}
            Err(other) => panic!("refused what the earlier one accepted: {other:?}"),
        }
    }
    let _ = Fingerprint::of_request("POST", "/v1/chat/completions", body, &ignore);
    let _ = DerivedKey::new("user", "session", body).now();
}

/// The characters a generated boundary is made of.
const BOUNDARY_CHARS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn digest_bytes(r: &Result<BodyDigest, BodyError>) -> Option<[u8; 32]> {
    r.as_ref().ok().map(|d| *d.as_bytes())
}

/// Multipart bodies: `Content-Type` parameters and boundary independence.
///
/// The first line of the input is a `Content-Type` value tried on the
/// rest. Then a boundary made from the first byte's worth of input is
/// replaced, everywhere in the body, by another one found nowhere in it:
/// the digest must not change (a client picks a new boundary on every
/// retry), nor with the boundary quoted or the type in another case.
pub fn multipart(data: &[u8]) {
    let (line, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let content_type = String::from_utf8_lossy(line);
    let _ = digest_body(Some(&content_type), body, &[]);

    let mut input = Input::new(data);
    let n = usize::from(input.byte() % 70) + 1;
    let boundary: String = input
        .take(n)
        .iter()
        .map(|&b| char::from(BOUNDARY_CHARS[usize::from(b) % BOUNDARY_CHARS.len()]))
        .collect();
    let body = input.rest();
    if boundary.is_empty() {
        return;
    }
    let ct = |b: &str| format!("multipart/form-data; boundary={b}");
    let first = digest_body(Some(&ct(&boundary)), body, &[]);
    if canonical_json(body).is_some() || first.is_err() {
        return;
    }
    let same = [
        format!("multipart/form-data; boundary=\"{boundary}\""),
        format!("Multipart/Mixed ;BOUNDARY={boundary} ; charset=utf-8"),
    ];
    for other in &same {
        assert_eq!(
            digest_bytes(&digest_body(Some(other), body, &[])),
            digest_bytes(&first),
            "{other}"
        );
    }
    let Some(&fresh) = BOUNDARY_CHARS
        .iter()
        .find(|c| !body.contains(c) && !boundary.as_bytes().contains(c))
    else {
        return;
    };
    let replacement = String::from_utf8(vec![fresh; n.min(7)]).unwrap_or_default();
    let mut moved = Vec::with_capacity(body.len());
    let mut from = 0;
    let finder = memmem(body, boundary.as_bytes());
    for at in finder {
        moved.extend_from_slice(&body[from..at]);
        moved.extend_from_slice(replacement.as_bytes());
        from = at + boundary.len();
    }
    moved.extend_from_slice(&body[from..]);
    if canonical_json(&moved).is_some() {
        return;
    }
    assert_eq!(
        digest_bytes(&digest_body(Some(&ct(&replacement)), &moved, &[])),
        digest_bytes(&first),
        "boundary {boundary:?} → {replacement:?}"
    );
}

/// Non-overlapping occurrences of `needle` in `hay`, left to right.
fn memmem(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + needle.len() <= hay.len() {
        if hay[at..].starts_with(needle) {
            found.push(at);
            at += needle.len();
        } else {
            at += 1;
        }
    }
    found
}

const PREFER: HeaderName = HeaderName::from_static("prefer");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// `Prefer` and `Last-Event-ID` (and the `Content-Type` of a stream).
///
/// The input's lines are header values. `respond-async` is found only
/// where a value names it; a `Last-Event-ID` is a number only when it is
/// digits, and then it is that number.
pub fn headers(data: &[u8]) {
    let values: Vec<HeaderValue> = data
        .split(|&b| b == b'\n')
        .take(16)
        .filter_map(|v| HeaderValue::from_bytes(v).ok())
        .collect();
    let mut prefer = HeaderMap::new();
    for v in &values {
        prefer.append(PREFER, v.clone());
    }
    let async_ = idemgate_layer::fuzzing::prefers_async(&prefer);
    let named = values.iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.to_ascii_lowercase().contains("respond-async"))
    });
    assert!(!async_ || named, "respond-async found in {values:?}");
    if values.iter().any(|v| v.as_bytes() == b"respond-async") {
        assert!(async_, "respond-async missed in {values:?}");
    }
    for v in &values {
        let _ = is_event_stream(Some(v));
        let resume = parse_last_event_id(v);
        let text = v.to_str().map(str::trim);
        match (resume, text) {
            (Resume::After(id), Ok(t)) => {
                // Only `digits-digits`, and it reads back as written.
                assert!(t.bytes().all(|b| b.is_ascii_digit() || b == b'-'), "{t:?}");
                assert_eq!(t.matches('-').count(), 1, "{t:?}");
                assert!(id.n >= 1, "{t:?}");
                let again = HeaderValue::from_str(&id.to_string()).expect("an id is text");
                assert_eq!(parse_last_event_id(&again), resume);
            }
            (Resume::After(id), Err(_)) => panic!("{id} from a value that is not text"),
            (Resume::Whole, _) => panic!("a Last-Event-ID is never read as none"),
            (Resume::Unknown, _) => {}
        }
        let mut h = HeaderMap::new();
        h.insert(LAST_EVENT_ID, v.clone());
        let got = idemgate_layer::fuzzing::resume_of(&h);
        assert_eq!(got, resume);
        // Resuming skips events only within the run named.
        if let Resume::After(id) = got {
            assert!(!got.skip_for(Some(id.run)).1);
            assert_eq!(got.skip_for(Some(id.run.wrapping_add(1))), (0, true));
        }
    }
}
