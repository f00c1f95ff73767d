//! [`TraceContext`]: the W3C trace context a downstream call carries, taken
//! from the current span as the OTLP exporter names it.
//!
//! Apart from the counters because it is about traces, not metrics: the
//! gateway's proxy asks it once per upstream call.

/// A W3C trace context to send on a downstream call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The `traceparent` header value.
    pub traceparent: String,
    /// The `tracestate` header value, when the trace carries one.
    pub tracestate: Option<String>,
}

/// The trace context naming the current span, as exported over OTLP, as
/// the parent of a downstream call: so the upstream's spans continue the
/// trace under the gateway's span (client → gateway → upstream, one tree).
///
/// `None` when the current span is not exported (a build without the
/// `otlp` feature, or no exporting layer installed): the caller's
/// `traceparent` then goes downstream unchanged, since a parent id naming
/// a span nobody exported would break the caller's tree.
pub fn exported_trace_context() -> Option<TraceContext> {
    #[cfg(feature = "otlp")]
    {
        crate::otlp::current_trace_context()
    }
    #[cfg(not(feature = "otlp"))]
    {
        None
    }
}
