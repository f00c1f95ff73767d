//! OTLP export of the request spans (cargo feature `otlp`).
//!
//! The program adds [`OtlpTraces::layer`] to its `tracing` subscriber next to
//! the JSON logs: every span (the `idempotency` span of each keyed request
//! with its `idempotency_key`, `trace_id` and `route` fields as attributes)
//! is also sent, in batches, to an OpenTelemetry collector over OTLP/HTTP
//! with protobuf bodies. Export runs on a tokio task with the async
//! `reqwest` client the gateway already links; a collector that is down
//! costs a logged error per batch and the spans of that batch, never a
//! request (spans are queued without waiting, and dropped when the queue is
//! full).
//!
//! The exported span of a request carries the request's W3C trace id (the
//! one in its `trace_id` field, taken from the client's `traceparent` or
//! generated), so a trace found by the id in a log line is the one the
//! collector holds. When the client sent a valid `traceparent` (recorded in
//! the span's `traceparent` field), the exported span is a child of the
//! client's span: the W3C propagator (`TraceContextPropagator`) reads the
//! field, and its context is made current while the exporting layer
//! creates the span, which takes the current context as the parent of a
//! span without a local one. The call upstream continues the trace:
//! [`current_trace_context`] (behind [`crate::exported_trace_context`])
//! gives the exported span's own `traceparent`, which the layer forwards in
//! place of the caller's. A trace then shows client → gateway → upstream
//! as one tree.
//!
//! Configuration follows the OpenTelemetry environment variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`); `service.name` is
//! `idemgate` unless `OTEL_SERVICE_NAME` says otherwise.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::{Context as OtelContext, ContextGuard};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracerProvider};
use tracing::Subscriber;
use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The service name spans are exported under.
pub const SERVICE_NAME: &str = "idemgate";

/// The span field whose value becomes the exported span's trace id.
const TRACE_ID_FIELD: &str = "trace_id";

/// The span field holding the caller's W3C `traceparent`, whose span
/// becomes the exported span's parent.
const TRACEPARENT_FIELD: &str = "traceparent";

/// Why OTLP export could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpError {
    /// The exporter's configuration (endpoint, headers, protocol) is invalid.
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// Export needs a tokio runtime: call from within one.
    #[error("OTLP export needs a tokio runtime")]
    NoRuntime,
}

/// Whether the environment asks for OTLP export of traces
/// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
/// set and not empty).
pub fn configured_by_env() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// The span pipeline: the tracer provider with its batch processor. Keep it
/// until the program ends and call [`OtlpTraces::shutdown`] so the last
/// batch is sent.
#[derive(Debug)]
pub struct OtlpTraces {
    provider: SdkTracerProvider,
}

impl OtlpTraces {
    /// Builds the exporter and starts its batch task on the current tokio
    /// runtime.
    ///
    /// `endpoint` is the collector's base URL (as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: spans are posted to
    /// `<endpoint>/v1/traces`) and overrides the environment; `None` reads
    /// the endpoint from the environment (`http://localhost:4318` when unset).
    pub fn start(endpoint: Option<&str>) -> Result<OtlpTraces, OtlpError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(OtlpError::NoRuntime);
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        if let Some(base) = endpoint {
            exporter = exporter.with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')));
        }
        let exporter = exporter.build()?;
        let processor =
            opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
                exporter,
                opentelemetry_sdk::runtime::Tokio,
            )
            .build();
        let mut resource = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").map_or(true, |s| s.trim().is_empty()) {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            .with_id_generator(RequestTraceIds)
            .build();
        Ok(OtlpTraces { provider })
    }

    /// The `tracing` layer that turns spans into exported OTLP spans. Only
    /// spans at `INFO` or above are exported, and none from the HTTP
    /// client or the exporter itself (that would feed back into export).
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let filter = Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("opentelemetry", LevelFilter::OFF)
            .with_target("reqwest", LevelFilter::OFF)
            .with_target("hyper", LevelFilter::OFF)
            .with_target("h2", LevelFilter::OFF);
        let tracer = self.provider.tracer(SERVICE_NAME);
        // The trace-id layer must see each span before the exporting layer
        // starts it: it is the inner one.
        TraceIdLayer
            .and_then(tracing_opentelemetry::layer().with_tracer(tracer))
            .and_then(ParentDone)
            .with_filter(filter)
    }

    /// Sends the spans still queued and stops the batch task. Blocks until
    /// the last export ends (bounded by `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s
    /// by default): call it outside the runtime's worker threads (e.g. in
    /// `spawn_blocking`). Failures are logged.
    pub fn shutdown(self) {
        match self.provider.shutdown() {
            Ok(()) => tracing::debug!("OTLP span export stopped"),
            Err(e) => tracing::warn!(error = %e, "OTLP span export: shutdown failed"),
        }
    }
}

thread_local! {
    /// The trace id the next root span started on this thread takes; set by
    /// [`TraceIdLayer`] right before the exporting layer starts a span.
    static NEXT_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
    /// The caller's context, current from [`TraceIdLayer`]'s `on_new_span`
    /// to [`ParentDone`]'s, around the exporting layer's.
    static PARENT: RefCell<Option<ContextGuard>> = const { RefCell::new(None) };
}

/// Random ids, except a root span's trace id when [`TraceIdLayer`] left one.
#[derive(Debug)]
struct RequestTraceIds;

impl IdGenerator for RequestTraceIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE_ID
            .with(Cell::take)
            .unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        RandomIdGenerator::default().new_span_id()
    }
}

/// The trace id a span's `trace_id` field asked for, kept in its extensions
/// until the span is started.
#[derive(Debug, Clone, Copy)]
struct RequestedTraceId(TraceId);

/// Remembers the `trace_id` field of each new span, and hands it to
/// [`RequestTraceIds`] when the span is first entered or closed (the two
/// places the exporting layer starts a span).
#[derive(Debug)]
struct TraceIdLayer;

impl TraceIdLayer {
    fn arm<S>(id: &span::Id, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        NEXT_TRACE_ID.with(|c| c.set(None));
        if let Some(span) = ctx.span(id)
            && let Some(RequestedTraceId(t)) = span.extensions_mut().remove::<RequestedTraceId>()
        {
            NEXT_TRACE_ID.with(|c| c.set(Some(t)));
        }
    }
}

impl<S> Layer<S> for TraceIdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        NEXT_TRACE_ID.with(|c| c.set(None));
        PARENT.with(|p| p.borrow_mut().take());
        if attrs.metadata().fields().field(TRACE_ID_FIELD).is_none() {
            return;
        }
        let mut visitor = TraceIdVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(t), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut().insert(RequestedTraceId(t));
        }
        let mut parent = TraceparentVisitor(None);
        attrs.record(&mut parent);
        if let Some(cx) = parent.0.and_then(|tp| caller_context(&tp)) {
            let guard = cx.attach();
            PARENT.with(|p| *p.borrow_mut() = Some(guard));
        }
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        Self::arm(id, &ctx);
    }

    fn on_exit(&self, _id: &span::Id, _ctx: Context<'_, S>) {
        NEXT_TRACE_ID.with(|c| c.set(None));
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        Self::arm(&id, &ctx);
    }
}

/// Ends what [`TraceIdLayer`] made current for the exporting layer's
/// `on_new_span` (it runs right after it, on the same thread).
#[derive(Debug)]
struct ParentDone;

impl<S: Subscriber> Layer<S> for ParentDone {
    fn on_new_span(&self, _attrs: &span::Attributes<'_>, _id: &span::Id, _ctx: Context<'_, S>) {
        PARENT.with(|p| p.borrow_mut().take());
    }
}

/// The caller's span as a remote parent, through the W3C propagator;
/// `None` when the header holds no valid span context.
fn caller_context(traceparent: &str) -> Option<OtelContext> {
    use opentelemetry::trace::TraceContextExt as _;
    let carrier = HashMap::from([(TRACEPARENT_FIELD.to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// The current span's context as W3C headers (through the same
/// propagator), when the span is exported: its trace id and its own span
/// id as the parent, so a downstream call becomes its child.
pub(crate) fn current_trace_context() -> Option<crate::TraceContext> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let span = tracing::Span::current();
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    Some(crate::TraceContext {
        traceparent: carrier.remove(TRACEPARENT_FIELD)?,
        tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
    })
}

/// Reads the `traceparent` field.
struct TraceparentVisitor(Option<String>);

impl tracing::field::Visit for TraceparentVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == TRACEPARENT_FIELD {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == TRACEPARENT_FIELD {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// Reads a 32-hex-digit, non-zero `trace_id` field.
struct TraceIdVisitor(Option<TraceId>);

impl TraceIdVisitor {
    fn parse(&mut self, s: &str) {
        if s.len() == 32
            && let Ok(t) = TraceId::from_hex(s)
            && t != TraceId::INVALID
        {
            self.0 = Some(t);
        }
    }
}

impl tracing::field::Visit for TraceIdVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == TRACE_ID_FIELD {
            self.parse(value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == TRACE_ID_FIELD {
            self.parse(&format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visit(s: &str) -> Option<TraceId> {
        let mut v = TraceIdVisitor(None);
        v.parse(s);
        v.0
    }

    #[test]
    fn trace_id_field_parses_only_valid_ids() {
        assert_eq!(
            visit("4bf92f3577b34da6a3ce929d0e0e4736"),
            Some(TraceId::from(
                0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128
            ))
        );
        assert_eq!(visit("00000000000000000000000000000000"), None);
        assert_eq!(visit("4bf92f3577b34da6"), None);
        assert_eq!(visit("zzf92f3577b34da6a3ce929d0e0e4736"), None);
    }

    #[test]
    fn the_callers_context_comes_from_a_valid_traceparent_only() {
        use opentelemetry::trace::TraceContextExt as _;
        let cx = caller_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("a valid traceparent");
        let span = cx.span();
        let sc = span.span_context();
        assert_eq!(
            sc.trace_id(),
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128)
        );
        assert_eq!(sc.span_id(), SpanId::from(0x00f0_67aa_0ba9_02b7_u64));
        assert!(sc.is_remote());
        assert!(caller_context("00-zz-00f067aa0ba902b7-01").is_none());
        assert!(caller_context("").is_none());
    }

    #[test]
    fn a_downstream_call_is_a_child_of_the_exported_span() {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let traces = OtlpTraces {
            provider: SdkTracerProvider::builder()
                .with_id_generator(RequestTraceIds)
                .build(),
        };
        let subscriber = tracing_subscriber::registry().with(traces.layer());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "idempotency",
                trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
                traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            );
            let _entered = span.enter();
            let own = span.context().span().span_context().span_id();
            let tc = crate::exported_trace_context().expect("the span is exported");
            assert_eq!(
                tc.traceparent,
                format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{own}-01"),
                "the caller's trace, the gateway's span as the parent"
            );
            assert_ne!(own, SpanId::from(0x00f0_67aa_0ba9_02b7_u64));
        });
        // Outside an exported span there is nothing to continue.
        assert_eq!(crate::exported_trace_context(), None);
    }

    #[test]
    fn id_generator_takes_the_armed_trace_id_once() {
        let t = TraceId::from(42_u128);
        NEXT_TRACE_ID.with(|c| c.set(Some(t)));
        assert_eq!(RequestTraceIds.new_trace_id(), t);
        assert_ne!(RequestTraceIds.new_trace_id(), t);
    }
}
