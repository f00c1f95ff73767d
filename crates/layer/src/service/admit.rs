//! Admission: turns a request the route protects into a [`Keyed`] one, or
//! says why it is not keyed (forwarded as it is, or refused).
//!
//! Everything the layer must know about a request before it touches the
//! store is settled here, once: its key (given or derived), its body (read
//! within the route's limit), its body digest (computed once, with the
//! request's `Content-Type`, for both the fingerprint and a derived key, so
//! the two can never disagree about what the body is), its fingerprint,
//! the stream events it already
//! has (`Last-Event-ID`), whether it prefers an asynchronous answer
//! (`Prefer: respond-async`) and its trace id. The rest of the request path
//! works on that complete value, and answers through its methods.

use std::fmt::Display;
use std::time::SystemTime;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, Request, header};
use http_body_util::BodyExt;
use idemgate_engine::{BodyError, digest_body};
use idemgate_engine::{ClientKey, Fingerprint, Record, ScopedKey};

use super::inner::IdempotencyContext;
use super::traceparent::{caller_traceparent, ensure_traceparent};
use crate::config::{DeriveTemplate, KeyMode};
use crate::key::{IDEMPOTENCY_KEY, KeyRefusal, client_key_in, derive_key, tenant_of};
use crate::problem::Problem;
use crate::refusal::{Log, refuse};
use crate::replay::replay_stored;
use crate::shared::Shared;
use crate::sse::{Resume, resume_of};
use crate::telemetry::RequestOutcome;

const PREFER: HeaderName = HeaderName::from_static("prefer");

/// A protected request after its key, body and fingerprint are known.
pub(super) struct Keyed {
    parts: Parts,
    body: Bytes,
    /// The record's address.
    pub(super) scoped: ScopedKey,
    /// What the request is, to tell a retry from a reuse of its key.
    pub(super) fingerprint: Fingerprint,
    /// Where a stream starts for this client (`Last-Event-ID`).
    pub(super) resume: Resume,
    /// `Prefer: respond-async`: answer 202 and let the client poll.
    pub(super) prefer_async: bool,
    /// The W3C trace id, given or made.
    trace_id: String,
    /// The caller's valid `traceparent`, if it sent one: the request span
    /// records it so a trace exporter can parent the span under the
    /// caller's.
    caller_traceparent: Option<String>,
}

/// Why admission did not key a request.
pub(super) enum NotKeyed {
    /// Forward it as it is: the route does not protect its method, or keys
    /// are optional and it has none (then counted as unprotected).
    Forward(Request<Body>),
    /// Refused and counted; this is the answer.
    Refused(Response),
}

/// Where the key of a request comes from.
enum KeySource<'a> {
    /// The client sent one.
    Given(ClientKey),
    /// None sent; the route derives one from the request.
    Derived(&'a DeriveTemplate),
}

impl Keyed {
    /// Admits `req`: keys it, or says why not.
    pub(super) async fn admit(shared: &Shared, req: Request<Body>) -> Result<Self, NotKeyed> {
        let cfg = &shared.config;
        if !cfg.protects(req.method()) {
            return Err(NotKeyed::Forward(req));
        }
        let source = match (client_key_in(req.headers(), &cfg.key_header), &cfg.key_mode) {
            (Err(refusal), _) => {
                return Err(rejected(shared, key_problem(&refusal, &cfg.key_header)));
            }
            (Ok(Some(key)), _) => KeySource::Given(key),
            (Ok(None), KeyMode::Derive(template)) => KeySource::Derived(template),
            (Ok(None), KeyMode::Require) => {
                return Err(rejected(
                    shared,
                    key_problem(&KeyRefusal::Missing, &cfg.key_header),
                ));
            }
            (Ok(None), KeyMode::Optional) => {
                // Unprotected, but the route's size limit still holds where
                // the size is declared (the body is streamed through, not
                // read here).
                if declared_length(req.headers()).is_some_and(|n| exceeds(n, cfg.body_limit)) {
                    return Err(rejected(shared, Problem::body_too_large(cfg.body_limit)));
                }
                shared
                    .metrics
                    .request(RequestOutcome::UnprotectedNoKey, None);
                return Err(NotKeyed::Forward(req));
            }
        };
        let tenant = tenant_of(req.headers(), &cfg.tenant);
        let (mut parts, body) = req.into_parts();
        let body = read_body(&parts.headers, body, cfg.body_limit)
            .await
            .map_err(|problem| rejected(shared, problem))?;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        // A body that reads two ways, or nests beyond the limit, is refused
        // before anything is stored or forwarded: the upstream might act on
        // another request than the one fingerprinted, or fail to parse it.
        let digest = digest_body(content_type, &body, &cfg.fingerprint_ignore).map_err(|e| {
            let problem = match e {
                BodyError::TooDeep { .. } => Problem::body_too_deep(e.to_string()),
                _ => Problem::ambiguous_body(e.to_string()),
            };
            rejected(shared, problem)
        })?;
        let key = match source {
            KeySource::Given(key) => key,
            KeySource::Derived(template) => derive_key(
                template,
                &tenant,
                &parts.headers,
                &digest,
                SystemTime::now(),
            )
            .map_err(|refusal| rejected(shared, key_problem(&refusal, &cfg.key_header)))?,
        };
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |p| p.as_str());
        let fingerprint = Fingerprint::of_digest(parts.method.as_str(), path, &digest);
        let resume = resume_of(&parts.headers);
        let prefer_async = prefers_async(&parts.headers);
        let caller_traceparent = caller_traceparent(&parts.headers);
        let trace_id = ensure_traceparent(&mut parts.headers);
        Ok(Self {
            parts,
            body,
            scoped: ScopedKey::new(tenant, cfg.namespace.clone(), key),
            fingerprint,
            resume,
            prefer_async,
            trace_id,
            caller_traceparent,
        })
    }

    /// The span of everything logged about this request (its detached
    /// execution included): the client's key, the trace id and the route;
    /// never the tenant, the credential or a body.
    pub(super) fn span(&self) -> tracing::Span {
        match &self.caller_traceparent {
            Some(traceparent) => tracing::info_span!(
                "idempotency",
                idempotency_key = %self.scoped.key,
                trace_id = %self.trace_id,
                route = %self.scoped.namespace,
                traceparent = %traceparent,
            ),
            None => tracing::info_span!(
                "idempotency",
                idempotency_key = %self.scoped.key,
                trace_id = %self.trace_id,
                route = %self.scoped.namespace,
            ),
        }
    }

    /// The request to give the inner service, with the key in its extensions.
    pub(super) fn request(&self) -> Request<Body> {
        let mut req = Request::from_parts(self.parts.clone(), Body::from(self.body.clone()));
        req.extensions_mut().insert(IdempotencyContext {
            key: self.scoped.key.clone(),
            scoped: self.scoped.clone(),
        });
        req
    }

    /// Answers from a DONE record of this key.
    pub(super) fn replay(
        &self,
        shared: &Shared,
        record: &Record,
        outcome: RequestOutcome,
    ) -> Response {
        replay_stored(shared, record, &self.scoped, self.resume, outcome)
    }

    /// Refuses this request, counting `outcome` against its key.
    pub(super) fn refuse(
        &self,
        shared: &Shared,
        outcome: RequestOutcome,
        log: Log<'_>,
        problem: Problem,
    ) -> Response {
        refuse(&shared.metrics, outcome, Some(&self.scoped), log, problem)
    }

    /// 422: the key was used before with another request.
    pub(super) fn mismatch(&self, shared: &Shared) -> Response {
        self.refuse(
            shared,
            RequestOutcome::Mismatch,
            Log::Info("idempotency key reused with a different request"),
            Problem::key_mismatch(),
        )
    }

    /// 503: the store failed; `message` says while doing what.
    pub(super) fn store_unavailable(
        &self,
        shared: &Shared,
        message: &'static str,
        error: &dyn Display,
    ) -> Response {
        self.refuse(
            shared,
            RequestOutcome::StoreError,
            Log::Warn(message, error),
            Problem::store_unavailable(),
        )
    }
}

/// Refuses a request admission could not key (counted without a key).
fn rejected(shared: &Shared, problem: Problem) -> NotKeyed {
    NotKeyed::Refused(refuse(
        &shared.metrics,
        RequestOutcome::Rejected,
        None,
        Log::Quiet,
        problem,
    ))
}

fn key_problem(refusal: &KeyRefusal, header: &HeaderName) -> Problem {
    let detail = refusal.to_string();
    // The refusal names the standard header; a route may read another.
    let detail = if *header == IDEMPOTENCY_KEY {
        detail
    } else {
        detail.replace("Idempotency-Key", header.as_str())
    };
    match refusal {
        KeyRefusal::Missing | KeyRefusal::MissingDimension(_) => Problem::missing_key(detail),
        _ => Problem::malformed_key(detail),
    }
}

/// Reads the request body up to `limit`.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Problem> {
    if declared_length(headers).is_some_and(|n| exceeds(n, limit)) {
        return Err(Problem::body_too_large(limit));
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Problem::body_too_large(limit)),
        Err(e) => Err(match crate::BodyTimeout::find(&*e) {
            Some(crate::BodyTimeout(deadline)) => Problem::request_body_timeout(deadline),
            None => Problem::request_body_unreadable(),
        }),
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok())
}

fn exceeds(n: u64, limit: usize) -> bool {
    n > u64::try_from(limit).unwrap_or(u64::MAX)
}

pub(crate) fn prefers_async(headers: &HeaderMap) -> bool {
    headers.get_all(PREFER).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|pref| {
                pref.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async"))
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn prefer_parsing() {
        let mut h = HeaderMap::new();
        assert!(!prefers_async(&h));
        h.insert(
            PREFER,
            HeaderValue::from_static("return=minimal, Respond-Async; wait=5"),
        );
        assert!(prefers_async(&h));
        h.insert(PREFER, HeaderValue::from_static("respond-asyncx"));
        assert!(!prefers_async(&h));
    }

    /// A preference token that is not `respond-async` (any case).
    fn other_pref() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::strategy::Strategy;
        "[a-zA-Z-]{1,16}(=[a-z0-9\"]{0,6})?".prop_filter("not respond-async", |p| {
            !p.split('=')
                .next()
                .is_some_and(|t| t.eq_ignore_ascii_case("respond-async"))
        })
    }

    proptest::proptest! {
        /// Whatever bytes a `Prefer` header holds, the answer is a plain
        /// yes or no (never a panic).
        #[test]
        fn prefer_of_any_bytes_never_panics(values in proptest::collection::vec(
            proptest::collection::vec(proptest::num::u8::ANY, 0..80), 0..3,
        )) {
            let mut h = HeaderMap::new();
            for v in &values {
                if let Ok(value) = HeaderValue::from_bytes(v) {
                    h.append(PREFER, value);
                }
            }
            let _ = prefers_async(&h);
        }

        /// `respond-async` is found in any case, in any place of a list,
        /// with parameters and whitespace; a list without it is not async.
        #[test]
        fn respond_async_is_found_anywhere_in_the_list(
            others in proptest::collection::vec(other_pref(), 0..5),
            at in 0..6usize,
            upper in proptest::collection::vec(proptest::bool::ANY, 13),
            param in "(; ?wait=[0-9]{1,3})?",
            ws in "[ \t]{0,2}",
        ) {
            let token: String = "respond-async"
                .chars()
                .zip(&upper)
                .map(|(c, up)| if *up { c.to_ascii_uppercase() } else { c })
                .collect();
            let without = others.join(&format!(",{ws}"));
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&without) {
                h.insert(PREFER, v);
                proptest::prop_assert!(!prefers_async(&h), "{without}");
            }
            let mut list = others.clone();
            list.insert(at.min(list.len()), format!("{ws}{token}{param}{ws}"));
            let with = list.join(",");
            h.insert(PREFER, HeaderValue::from_str(&with).unwrap());
            proptest::prop_assert!(prefers_async(&h), "{with}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]

        /// Among up to 100,000 other preferences (a header of about a
        /// megabyte), `respond-async` is found wherever it stands, and
        /// its absence is seen.
        #[test]
        fn respond_async_is_found_among_a_hundred_thousand_preferences(
            n in 0usize..=100_000,
            at in proptest::num::usize::ANY,
        ) {
            let mut list = vec!["wait=10; x=\"y\""; n];
            let mut h = HeaderMap::new();
            h.insert(PREFER, HeaderValue::from_str(&list.join(", ")).unwrap());
            proptest::prop_assert!(!prefers_async(&h));
            list.insert(at % (n + 1), " Respond-Async ;wait=1");
            h.insert(PREFER, HeaderValue::from_str(&list.join(",")).unwrap());
            proptest::prop_assert!(prefers_async(&h));
        }
    }
}
