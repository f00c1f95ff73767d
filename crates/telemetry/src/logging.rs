//! JSON-lines logs, written to a writer of the caller's choosing (tests
//! capture what the gateway logs this way).
//!
//! Every line about a keyed request carries `idempotency_key` and `trace_id`
//! (the request's span sets them), so every attempt of one operation can be
//! found by its key. Request and response bodies are never logged: prompts
//! and completions are user data.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::span::Record;
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs a JSON-lines subscriber writing to `writer` (tests capture logs
/// this way). Returns false when a subscriber was already installed.
pub fn init_json_with<W>(writer: W) -> bool
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::registry()
        .with(EnvFilter::new("debug"))
        .with(json_layer(writer))
        .try_init()
        .is_ok()
}

/// The gateway's log layer: JSON lines ([`JsonLines`], [`JsonSpanFields`])
/// written to `writer`. Each span field once: the current span's fields,
/// not also the list of every enclosing span.
pub fn json_layer<S, W>(
    writer: W,
) -> tracing_subscriber::fmt::Layer<S, JsonSpanFields, JsonLines, W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonSpanFields)
        .event_format(JsonLines)
        .with_writer(writer)
}

/// The JSON-lines event format: one object per line, as
/// `tracing_subscriber`'s JSON format writes it with the current span
/// (`{"timestamp","level","fields","target","span"}`), made cheaper.
///
/// The stock format parses the current span's fields back from their
/// JSON text on every line, and builds a map of the event's fields before
/// writing them: a tenth of the CPU of a replayed request, which logs one
/// line. Here a span's fields, formatted once when the span was made
/// ([`JsonSpanFields`]), are copied as they are, and the event's fields
/// are written as they are visited.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        w.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut w)?;
        write!(w, "\",\"level\":\"{}\",\"fields\":", meta.level())?;
        write_object(&mut w, event)?;
        w.write_str(",\"target\":")?;
        write_json_str(&mut w, meta.target())?;
        if let Some(span) = ctx.parent_span() {
            w.write_str(",\"span\":{")?;
            let extensions = span.extensions();
            if let Some(formatted) = extensions.get::<FormattedFields<N>>() {
                let members = formatted
                    .fields
                    .trim()
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .unwrap_or("");
                if !members.is_empty() {
                    w.write_str(members)?;
                    w.write_char(',')?;
                }
            }
            w.write_str("\"name\":")?;
            write_json_str(&mut w, span.name())?;
            w.write_char('}')?;
        }
        w.write_str("}\n")
    }
}

/// A span's fields as one JSON object, written as they are visited. Made
/// once per span, and every keyed request makes one: the stock
/// `JsonFields` first builds a map of `serde_json::Value`s and serialises
/// it (about 4% of a replay's CPU). Members keep the order the span
/// declares them in.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonSpanFields;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(&self, mut w: Writer<'writer>, fields: R) -> fmt::Result {
        write_object(&mut w, fields)
    }

    /// Fields recorded after the span was made (`Span::record`): merged
    /// into the object, a field recorded again keeping its last value.
    /// Rare, so it goes through `serde_json`.
    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &Record<'_>,
    ) -> fmt::Result {
        let mut added = String::new();
        self.format_fields(Writer::new(&mut added), fields)?;
        if current.fields.is_empty() {
            current.fields = added;
            return Ok(());
        }
        let parse = |s: &str| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s)
                .map_err(|_| fmt::Error)
        };
        let mut merged = parse(&current.fields)?;
        merged.extend(parse(&added)?);
        current.fields = serde_json::to_string(&merged).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

/// Writes `fields` as one JSON object, each member as it is visited.
fn write_object(w: &mut Writer<'_>, fields: impl RecordFields) -> fmt::Result {
    w.write_char('{')?;
    let mut members = JsonFieldWriter {
        w,
        first: true,
        result: Ok(()),
    };
    fields.record(&mut members);
    members.result?;
    w.write_char('}')
}

/// Writes an event's fields as JSON members, as they are visited.
struct JsonFieldWriter<'w, 'a> {
    w: &'w mut Writer<'a>,
    first: bool,
    result: fmt::Result,
}

impl JsonFieldWriter<'_, '_> {
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = (|| {
            if !self.first {
                self.w.write_char(',')?;
            }
            self.first = false;
            write_json_str(self.w, name)?;
            self.w.write_char(':')?;
            value(self.w)
        })();
    }
}

impl Visit for JsonFieldWriter<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |w| write_json_str(w, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |w| {
            w.write_char('"')?;
            write!(JsonEscape(w), "{value:?}")?;
            w.write_char('"')
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |w| write!(w, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity.
        self.member(field, |w| {
            if value.is_finite() {
                write!(w, "{value}")
            } else {
                w.write_str("null")
            }
        });
    }
}

/// Writes `s` as a JSON string.
fn write_json_str(w: &mut impl fmt::Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    JsonEscape(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what is written through it for the inside of a JSON string.
struct JsonEscape<'w, W: fmt::Write + ?Sized>(&'w mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for JsonEscape<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, c) in s.char_indices() {
            let escaped = match c {
                '"' => "\\\"",
                '\\' => "\\\\",
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                c if u32::from(c) < 0x20 => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escaped.is_empty() {
                write!(self.0, "\\u{:04x}", u32::from(c))?;
            } else {
                self.0.write_str(escaped)?;
            }
            plain = i + c.len_utf8();
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("capture lock").extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Events of every field kind, in and out of spans (one nested).
    fn events() {
        tracing::info!("outside any span");
        let span = tracing::info_span!(
            "idempotency",
            idempotency_key = "k\"1\\",
            route = "/v1",
            n = 3,
            late = tracing::field::Empty,
            again = tracing::field::Empty
        );
        // Recorded after the span was made: once, and twice.
        span.record("late", "known later");
        span.record("again", 1);
        span.record("again", 2);
        span.record("n", 4);
        let _entered = span.enter();
        tracing::warn!(
            error = %"broken\npipe",
            count = 5u64,
            delta = -2i64,
            ok = true,
            ratio = 0.5,
            nan = f64::NAN,
            r#type = "raw",
            "a \"quoted\" message with a \u{1} control and ünïcode"
        );
        let inner = tracing::info_span!("inner");
        let _inner = inner.enter();
        tracing::info!(key = ?Some("debug"), "in a span without fields");
    }

    fn lines(buf: &Captured) -> Vec<serde_json::Value> {
        let bytes = buf.0.lock().expect("capture lock").clone();
        String::from_utf8(bytes)
            .expect("utf-8")
            .lines()
            .map(|l| {
                let mut v: serde_json::Value =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                let ts = v
                    .as_object_mut()
                    .and_then(|o| o.remove("timestamp"))
                    .expect("a timestamp");
                assert!(ts.as_str().is_some_and(|t| t.ends_with('Z')), "{ts}");
                v
            })
            .collect()
    }

    #[test]
    fn lines_read_as_the_stock_json_format_reads() {
        let stock = Captured::default();
        let writer = stock.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, events);

        let ours = Captured::default();
        let writer = ours.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonSpanFields)
            .event_format(JsonLines)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, events);

        let (stock, ours) = (lines(&stock), lines(&ours));
        assert_eq!(ours.len(), 3);
        assert_eq!(ours, stock);
        assert_eq!(ours[1]["span"]["idempotency_key"], "k\"1\\");
        assert_eq!(ours[1]["span"]["late"], "known later");
        assert_eq!(ours[1]["span"]["again"], 2);
        assert_eq!(ours[1]["span"]["n"], 4);
        assert_eq!(ours[1]["fields"]["nan"], serde_json::Value::Null);
        assert_eq!(ours[2]["span"], serde_json::json!({"name": "inner"}));
    }
}
