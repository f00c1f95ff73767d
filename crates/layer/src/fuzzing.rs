//! Entry points to the layer's private parsers for the fuzz targets in
//! `fuzz/` (cargo feature `fuzzing`). Not part of the API: nothing here
//! is stable, and a build without the feature has none of it.

use http::HeaderMap;

use crate::config::StreamDialect;
use crate::verdict::{StreamJudge, StreamVerdict};

/// Whether a request's `Prefer` headers ask for `respond-async`.
pub fn prefers_async(headers: &HeaderMap) -> bool {
    crate::service::prefers_async(headers)
}

/// Where a replayed stream starts for a client, from its `Last-Event-ID`.
pub fn resume_of(headers: &HeaderMap) -> crate::sse::Resume {
    crate::sse::resume_of(headers)
}

/// What the dialect judge made of a stream's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    /// `complete`, `error-event` or `unterminated`.
    pub verdict: &'static str,
    /// JSON parses of event data the judge made.
    pub parses: u64,
}

/// Runs the stream judge of `dialect` over `events`.
pub fn judge<E: AsRef<[u8]>>(dialect: StreamDialect, events: &[E]) -> Judged {
    let mut judge = StreamJudge::new(dialect);
    for e in events {
        judge.observe(e.as_ref());
    }
    Judged {
        verdict: match judge.verdict() {
            StreamVerdict::Complete => "complete",
            StreamVerdict::ErrorEvent => "error-event",
            StreamVerdict::Unterminated => "unterminated",
        },
        parses: judge.parses(),
    }
}
