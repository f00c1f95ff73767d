//! JSON-lines logs, written to a writer of the caller's choosing (tests
//! capture what the gateway logs this way).
//!
//! Every line about a keyed request carries `idempotency_key` and `trace_id`
//! (the request's span sets them), so every attempt of one operation can be
//! found by its key. Request and response bodies are never logged: prompts
//! and completions are user data.

use tracing_subscriber::EnvFilter;

/// Installs a JSON-lines subscriber writing to `writer` (tests capture logs
/// this way). Returns false when a subscriber was already installed.
pub fn init_json_with<W>(writer: W) -> bool
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_env_filter(EnvFilter::new("debug"))
        .with_writer(writer)
        .try_init()
        .is_ok()
}
