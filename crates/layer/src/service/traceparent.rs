//! W3C trace context for protected requests: every request the layer keys
//! gets a trace id, logged with each line about it and forwarded upstream.
//! When the request span is exported (the `otlp` feature of
//! `idemgate-telemetry`, with its layer installed), the upstream gets the
//! exported span as its parent, so the trace continues through us.
//!
//! It exists apart from the request path because it is pure header parsing
//! with rules of its own (the `traceparent` version 00 layout), tested here
//! on its own.

use http::{HeaderMap, HeaderName, HeaderValue};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The trace id of a valid W3C `traceparent` header (version 00 layout:
/// `vv-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lower-case,
/// neither id all zeros, version not `ff`; later versions may append
/// fields after the flags).
fn trace_id(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let v = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut fields = v.split('-');
    let (version, id, parent, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let more = fields.next().is_some();
    let valid = hex(version, 2)
        && version != "ff"
        && !(version == "00" && more)
        && hex(id, 32)
        && id.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2);
    valid.then_some(id)
}

/// The caller's `traceparent` when it is valid (see [`trace_id`]), as sent.
pub(super) fn caller_traceparent(headers: &HeaderMap) -> Option<String> {
    trace_id(headers)?;
    headers
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The request's trace id. A valid `traceparent` is kept as it is (until
/// [`continue_trace`] names our exported span as the upstream's parent);
/// otherwise a new trace starts: a fresh `traceparent` replaces the missing
/// or invalid one (and any `tracestate`, which belongs to the old one), so
/// the upstream logs the same trace id as we do.
pub(super) fn ensure_traceparent(headers: &mut HeaderMap) -> String {
    if let Some(id) = trace_id(headers) {
        return id.to_owned();
    }
    let id = loop {
        let id: u128 = rand::random();
        if id != 0 {
            break format!("{id:032x}");
        }
    };
    let parent = rand::random::<u64>().max(1);
    headers.remove(TRACESTATE);
    if let Ok(v) = HeaderValue::from_str(&format!("00-{id}-{parent:016x}-01")) {
        headers.insert(TRACEPARENT, v);
    }
    id
}

/// Makes the upstream call a child of the current (request) span when that
/// span is exported: its `traceparent` (same trace id, our span's id as
/// the parent) replaces the one admitted. Spans not exported leave the
/// headers as they are: the caller's span stays the upstream's parent.
pub(super) fn continue_trace(headers: &mut HeaderMap) {
    let Some(tc) = idemgate_telemetry::exported_trace_context() else {
        return;
    };
    let Ok(parent) = HeaderValue::from_str(&tc.traceparent) else {
        return;
    };
    headers.insert(TRACEPARENT, parent);
    match tc.tracestate.and_then(|s| HeaderValue::from_str(&s).ok()) {
        Some(state) => {
            headers.insert(TRACESTATE, state);
        }
        None => {
            headers.remove(TRACESTATE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_traceparent_only_when_valid() {
        let mut h = HeaderMap::new();
        assert_eq!(caller_traceparent(&h), None);
        h.insert(TRACEPARENT, HeaderValue::from_static("00-zz-00-01"));
        assert_eq!(caller_traceparent(&h), None);
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
        assert_eq!(caller_traceparent(&h).as_deref(), Some(tp));
    }

    #[test]
    fn without_an_exported_span_the_callers_traceparent_goes_on() {
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(given));
        h.insert(TRACESTATE, HeaderValue::from_static("v=1"));
        let span = tracing::info_span!("idempotency", trace_id = "x");
        let _entered = span.enter();
        continue_trace(&mut h);
        assert_eq!(h[TRACEPARENT], given);
        assert_eq!(h[TRACESTATE], "v=1");
    }

    #[test]
    fn traceparent_parsing() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        assert_eq!(trace_id(&h), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        h.insert(TRACEPARENT, HeaderValue::from_static("garbage"));
        assert_eq!(trace_id(&h), None);
        for bad in [
            // upper case, all-zero ids, version ff, short ids, extra field on 00
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            h.insert(TRACEPARENT, HeaderValue::from_static(bad));
            assert_eq!(trace_id(&h), None, "{bad}");
        }
        // A later version may carry more fields.
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-ab"),
        );
        assert_eq!(trace_id(&h), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
    }

    #[test]
    fn a_valid_traceparent_is_kept_and_a_missing_one_is_made() {
        let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(given));
        h.insert(TRACESTATE, HeaderValue::from_static("v=1"));
        assert_eq!(
            ensure_traceparent(&mut h),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(h[TRACEPARENT], given);
        assert_eq!(h[TRACESTATE], "v=1");

        for start in [None, Some("00-zz-00f067aa0ba902b7-01")] {
            let mut h = HeaderMap::new();
            if let Some(v) = start {
                h.insert(TRACEPARENT, HeaderValue::from_static(v));
                h.insert(TRACESTATE, HeaderValue::from_static("v=1"));
            }
            let id = ensure_traceparent(&mut h);
            assert_eq!(trace_id(&h), Some(id.as_str()));
            assert!(h.get(TRACESTATE).is_none());
            let again = ensure_traceparent(&mut HeaderMap::new());
            assert_ne!(id, again, "each new trace gets its own id");
        }
    }
}
