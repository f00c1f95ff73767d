//! Bounds on decoding an upstream answer, and the answers that cannot be
//! stored at all.
//!
//! The upstream client decodes gzip, brotli and deflate so that what is
//! stored and replayed is the plain answer. Decoding multiplies: 300 KB of
//! gzip can be 300 MB of zeros, and brotli goes further, so a hostile or
//! broken upstream could make one request cost the process hundreds of
//! megabytes. The raw bytes are counted under the decoder
//! ([`CountingBody`]) and the decoded ones after it; past
//! [`MAX_DECODED_BODY`], or past [`MAX_RATIO`] times the raw size (once a
//! megabyte has been decoded), the body fails as a broken answer: released,
//! or `outcome-unknown` on a charging route, like any body cut mid-way. An
//! answer sent uncompressed is not bounded here: each of its bytes crossed
//! the network, and the stored-size limit applies to it as to any other.
//!
//! Two answers are broken before their body is read: a `1xx` status (an
//! upstream `101 Switching Protocols` would otherwise be stored and
//! replayed as an empty answer for `done_ttl`), and an encoding the client
//! cannot decode (`zstd`, or anything unknown), which would be stored and
//! replayed as bytes the client never asked for, and would hide a stream's
//! events from the dialect judge.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use http_body::{Body, Frame, SizeHint};

/// The most a compressed answer may decode to: twice the largest answer a
/// route stores (32 MiB), so every storable answer fits.
pub(crate) const MAX_DECODED_BODY: u64 = 64 * 1024 * 1024;

/// The most a compressed answer may grow by decoding. JSON and event
/// streams compress 5 to 20 times; a bomb, a thousand.
pub(crate) const MAX_RATIO: u64 = 100;

/// Decoded bytes below which the ratio is not judged (small answers of
/// repetitive text compress far better than large ones).
const RATIO_FLOOR: u64 = 1024 * 1024;

/// The raw bytes of one answer, counted as they arrive, shared with the
/// code that reads the decoded body.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawBytes(Arc<AtomicU64>);

impl RawBytes {
    fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A response body that counts its data bytes into [`RawBytes`].
#[derive(Debug)]
pub(crate) struct CountingBody<B> {
    inner: B,
    raw: RawBytes,
}

impl<B> CountingBody<B> {
    pub(crate) fn new(inner: B, raw: RawBytes) -> Self {
        Self { inner, raw }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for CountingBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.raw.add(data.len());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `decoded` bytes from `raw` raw bytes is past the bounds. Only a
/// decoded answer (more bytes than arrived) is judged.
pub(crate) fn past_bounds(decoded: u64, raw: u64) -> bool {
    decoded > raw
        && (decoded > MAX_DECODED_BODY
            || (decoded > RATIO_FLOOR && decoded > raw.saturating_mul(MAX_RATIO)))
}

/// Why an answer cannot be stored, judged from its head.
pub(crate) fn unstorable(status: StatusCode, headers: &HeaderMap) -> Option<String> {
    if status.is_informational() {
        return Some(format!(
            "the upstream answered {status}, which is not a final answer"
        ));
    }
    let encoding = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .find(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))?;
    let shown: String = encoding.chars().take(40).collect();
    Some(format!(
        "the upstream answered in an encoding the gateway cannot decode ({shown})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        // Identity answers are never judged here.
        assert!(!past_bounds(MAX_DECODED_BODY * 2, MAX_DECODED_BODY * 2));
        // Small answers, whatever their ratio.
        assert!(!past_bounds(RATIO_FLOOR, 1));
        // Past the ratio once past the floor.
        assert!(past_bounds(RATIO_FLOOR + 1, 1));
        assert!(!past_bounds(10 * RATIO_FLOOR, 10 * RATIO_FLOOR / 50));
        assert!(past_bounds(10 * RATIO_FLOOR, 10 * RATIO_FLOOR / 200));
        // Past the size whatever the ratio.
        assert!(past_bounds(MAX_DECODED_BODY + 1, MAX_DECODED_BODY / 2));
    }

    #[test]
    fn heads_that_cannot_be_stored() {
        let mut h = HeaderMap::new();
        assert_eq!(unstorable(StatusCode::OK, &h), None);
        assert!(unstorable(StatusCode::SWITCHING_PROTOCOLS, &h).is_some());
        assert!(unstorable(StatusCode::from_u16(103).unwrap(), &h).is_some());
        h.insert(header::CONTENT_ENCODING, "identity".parse().unwrap());
        assert_eq!(unstorable(StatusCode::OK, &h), None);
        h.insert(header::CONTENT_ENCODING, "zstd".parse().unwrap());
        assert!(unstorable(StatusCode::OK, &h).unwrap().contains("zstd"));
    }
}
