//! What an owner keeps of a response for the store: the headers worth
//! replaying, and the events of a stream within the route's size limit.
//!
//! Kept apart from the detached execution that uses it because it is plain
//! bookkeeping, with no I/O: the execution decides when to store, this
//! decides what.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode, header};

use crate::config::LayerConfig;
use crate::stored::{StoredBody, StoredResponse, StreamUsage};

/// Headers of hop-by-hop or framing nature are never stored.
const NEVER_STORED: [HeaderName; 5] = [
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TRAILER,
    header::UPGRADE,
];

/// `Operation-Location`: where an accepted job can be polled (Azure's
/// long-running operations).
static OPERATION_LOCATION: HeaderName = HeaderName::from_static("operation-location");

/// `x-should-retry`, as a place to borrow it from.
static SHOULD_RETRY: HeaderName = crate::problem::SHOULD_RETRY;

/// The headers of a response that are stored with it, and the only ones a
/// duplicate attached to the live stream gets, so a follower and a replay
/// see the same head: its content type and encoding, where it points
/// (`Location`, `Content-Location`, `Operation-Location`: a replayed 202 or
/// 3xx must still say where the job or the resource is), `x-should-retry`
/// (a final answer says so on every replay), and those the route names; never a framing one. Everything else (`Set-Cookie` above
/// all) goes to the owner's client only.
pub(super) fn kept_headers(headers: &HeaderMap, cfg: &LayerConfig) -> HeaderMap {
    let mut out = HeaderMap::new();
    // The body is stored as sent: its type and encoding go with it.
    let wanted = [
        &header::CONTENT_TYPE,
        &header::CONTENT_ENCODING,
        &header::LOCATION,
        &header::CONTENT_LOCATION,
        &OPERATION_LOCATION,
        &SHOULD_RETRY,
    ]
    .into_iter()
    .chain(cfg.stored_headers.iter());
    for name in wanted {
        if NEVER_STORED.contains(name) || out.contains_key(name) {
            continue;
        }
        for v in headers.get_all(name) {
            out.append(name.clone(), v.clone());
        }
    }
    out
}

/// The events of a stream recorded for the store, until they outgrow the
/// limit: from then on nothing is kept, and the stream cannot be stored.
pub(super) struct Recording {
    max: usize,
    size: usize,
    /// `None` once the stream outgrew `max`.
    events: Option<Vec<Bytes>>,
    usage: StreamUsage,
}

/// What [`Recording::push`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Kept for the store.
    Kept,
    /// This event made the stream too large: nothing is kept any more.
    Overflowed,
    /// Not kept: the stream was already too large.
    Dropped,
}

impl Recording {
    /// An empty recording that keeps up to `max` bytes of events.
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            size: 0,
            events: Some(Vec::new()),
            usage: StreamUsage::default(),
        }
    }

    /// Records `event` (already rewritten with its id) if the stream still
    /// fits.
    pub(super) fn push(&mut self, event: &Bytes) -> Recorded {
        self.usage.add_event(event);
        self.size = self.size.saturating_add(event.len());
        match &mut self.events {
            None => Recorded::Dropped,
            Some(_) if self.size > self.max => {
                self.events = None;
                Recorded::Overflowed
            }
            Some(events) => {
                events.push(event.clone());
                Recorded::Kept
            }
        }
    }

    /// The stream as stored with `last` after its events (a broken
    /// stream's terminal event, kept whatever the limit: it is small and
    /// the answer is not whole without it), or `None` when the events
    /// outgrew the limit.
    pub(super) fn finish_with(
        mut self,
        last: Bytes,
        status: StatusCode,
        headers: HeaderMap,
    ) -> Option<StoredResponse> {
        self.events.as_mut()?.push(last);
        self.finish(status, headers)
    }

    /// The stream as stored, or `None` when it outgrew the limit.
    pub(super) fn finish(self, status: StatusCode, headers: HeaderMap) -> Option<StoredResponse> {
        let events = self.events?;
        Some(StoredResponse {
            status,
            headers,
            body: StoredBody::Events(events),
            usage: self.usage.finish(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn stored_headers_keep_content_type_and_the_configured_ones() {
        let cfg = LayerConfig {
            stored_headers: vec![
                HeaderName::from_static("x-request-id"),
                header::CONTENT_LENGTH,
            ],
            ..LayerConfig::default()
        };
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert("x-request-id", HeaderValue::from_static("r1"));
        h.insert("set-cookie", HeaderValue::from_static("s=1"));
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.insert(header::LOCATION, HeaderValue::from_static("/jobs/1"));
        h.insert("operation-location", HeaderValue::from_static("/ops/1"));
        let kept = kept_headers(&h, &cfg);
        assert_eq!(kept.len(), 5);
        assert_eq!(kept[header::CONTENT_ENCODING], "gzip");
        assert_eq!(kept[header::LOCATION], "/jobs/1");
        assert_eq!(kept["operation-location"], "/ops/1");
        assert!(kept.get("set-cookie").is_none());
        assert_eq!(kept["x-request-id"], "r1");
        assert!(kept.get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn a_recording_keeps_events_until_they_outgrow_the_limit() {
        use Recorded::{Dropped, Kept, Overflowed};
        let event = Bytes::from_static(b"id: 1\ndata: x\n\n");
        let mut r = Recording::new(2 * event.len());
        assert_eq!([r.push(&event), r.push(&event)], [Kept, Kept]);
        let stored = r.finish(StatusCode::OK, HeaderMap::new()).map(|s| s.body);
        assert!(matches!(stored, Some(StoredBody::Events(e)) if e.len() == 2));

        let mut r = Recording::new(2 * event.len());
        let pushed = [(); 4].map(|()| r.push(&event));
        assert_eq!(pushed, [Kept, Kept, Overflowed, Dropped]);
        assert!(r.finish(StatusCode::OK, HeaderMap::new()).is_none());
    }
}
