//! `Prefer: respond-async`: the client is told where the result will be
//! (202 + `Location`) and fetches it later with a `GET`.
//!
//! The operation id holds the namespace, the key and the first 16 bytes of
//! the request's fingerprint, URL-safe encoded; it holds no tenant. The
//! `GET` is checked as the original request was: scoped by its own
//! credential (a leaked id is useless to another tenant: 404), and the
//! record must have been made by the request the id names (another
//! request under the same key, or an id built from a key alone, finds
//! nothing: 404). Reading the operation is the asker collecting its own
//! result: counted as `operation_read`, never as a replay (a hit) or as
//! tokens saved.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idemgate_engine::{ClientKey, Fingerprint, ScopedKey};

use crate::config::LayerConfig;
use crate::key::tenant_of;
use crate::problem::Problem;
use crate::replay::replay_stored;
use crate::shared::Shared;
use crate::sse::resume_of;
use crate::telemetry::RequestOutcome;

const ID_VERSION: u8 = 2;

/// Bytes of the fingerprint an operation id carries: enough that an id
/// cannot be made without the request, short enough for a URL.
const FINGERPRINT_BYTES: usize = 16;

/// What an operation id names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationId {
    /// The route's namespace.
    pub namespace: String,
    /// The client's key (given or derived).
    pub key: ClientKey,
    /// The start of the fingerprint of the request that made it.
    pub fingerprint: [u8; FINGERPRINT_BYTES],
}

/// The opaque id of the operation `key` in `namespace`, made by the
/// request with `fingerprint`.
pub fn operation_id(namespace: &str, key: &ClientKey, fingerprint: &Fingerprint) -> String {
    let ns = namespace.as_bytes();
    let len = u16::try_from(ns.len()).unwrap_or(u16::MAX);
    let ns = ns.get(..usize::from(len)).unwrap_or(ns);
    let mut raw = Vec::with_capacity(3 + FINGERPRINT_BYTES + ns.len() + key.as_str().len());
    raw.push(ID_VERSION);
    raw.extend_from_slice(&fingerprint.as_bytes()[..FINGERPRINT_BYTES]);
    raw.extend_from_slice(&len.to_be_bytes());
    raw.extend_from_slice(ns);
    raw.extend_from_slice(key.as_str().as_bytes());
    URL_SAFE_NO_PAD.encode(raw)
}

/// What an operation id names, if it is one.
pub fn parse_operation_id(id: &str) -> Option<OperationId> {
    let raw = URL_SAFE_NO_PAD.decode(id).ok()?;
    let (&version, rest) = raw.split_first()?;
    if version != ID_VERSION {
        return None;
    }
    let fingerprint: [u8; FINGERPRINT_BYTES] = rest.get(..FINGERPRINT_BYTES)?.try_into().ok()?;
    let rest = rest.get(FINGERPRINT_BYTES..)?;
    let len_bytes: [u8; 2] = rest.get(..2)?.try_into().ok()?;
    let len = usize::from(u16::from_be_bytes(len_bytes));
    let ns = rest.get(2..2 + len)?;
    let key = rest.get(2 + len..)?;
    let namespace = String::from_utf8(ns.to_vec()).ok()?;
    // The key's own text, as `operation_id` wrote it: not a header value
    // to trim and unquote, which would read `" ab"` as the key `ab`.
    let key = ClientKey::try_from(String::from_utf8(key.to_vec()).ok()?).ok()?;
    Some(OperationId {
        namespace,
        key,
        fingerprint,
    })
}

/// 202 pointing at the operation of `key`, made by the request with
/// `fingerprint`, on the route `config` protects.
pub(crate) fn accepted_for(
    config: &LayerConfig,
    key: &ClientKey,
    fingerprint: &Fingerprint,
) -> Response {
    let id = operation_id(&config.namespace, key, fingerprint);
    accepted(&format!("{}{id}", config.operations_path))
}

/// 202 pointing at the operation.
fn accepted(location: &str) -> Response {
    let body = serde_json::json!({ "status": "pending", "operation": location }).to_string();
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = StatusCode::ACCEPTED;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(location) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// Answers a `GET` of an operation of this layer's namespace; `None` when
/// the id belongs to another namespace (another layer may own it).
pub(crate) async fn get(shared: &Shared, path: &str, headers: &HeaderMap) -> Option<Response> {
    let cfg = &shared.config;
    let id = path.strip_prefix(cfg.operations_path.as_str())?;
    let Some(op) = parse_operation_id(id) else {
        return Some(Problem::operation_not_found().into_response());
    };
    if op.namespace != cfg.namespace {
        return None;
    }
    let scoped = ScopedKey::new(tenant_of(headers, &cfg.tenant), op.namespace, op.key);
    let record = match shared.engine.store().get(&scoped).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "operation lookup failed");
            return Some(Problem::store_unavailable().into_response());
        }
    };
    // Another request's record under this key is not this operation.
    let record = record.filter(|r| r.fingerprint.as_bytes()[..FINGERPRINT_BYTES] == op.fingerprint);
    Some(match record {
        None => Problem::operation_not_found().into_response(),
        Some(r) if r.is_done() => replay_stored(
            shared,
            &r,
            &scoped,
            resume_of(headers),
            RequestOutcome::OperationRead,
        ),
        Some(r) => accepted_for(cfg, &scoped.key, &r.fingerprint),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_round_trip_and_are_url_safe() {
        let key = ClientKey::parse("a/b+c=d \"q\"").unwrap();
        let fp = Fingerprint::from_bytes([7; 32]);
        let id = operation_id("chat/completions", &key, &fp);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(
            parse_operation_id(&id),
            Some(OperationId {
                namespace: "chat/completions".to_owned(),
                key,
                fingerprint: [7; 16],
            })
        );
        assert_eq!(parse_operation_id("not*base64"), None);
        assert_eq!(parse_operation_id(""), None);
    }

    #[test]
    fn keys_with_spaces_or_quotes_round_trip_as_themselves() {
        // Sent quoted, these keys keep their spaces and quotes; their
        // operation must be theirs, not the trimmed or unquoted key's.
        for header in [
            r#"" ab""#,
            r#""ab ""#,
            r#""    ""#,
            r#""\"u}""#,
            r#""a\"b\\ ""#,
        ] {
            let key = ClientKey::parse(header).unwrap();
            let fp = Fingerprint::from_bytes([1; 32]);
            let id = operation_id("ns", &key, &fp);
            assert_eq!(
                parse_operation_id(&id),
                Some(OperationId {
                    namespace: "ns".to_owned(),
                    key,
                    fingerprint: [1; 16],
                }),
                "{header}"
            );
        }
        let fp = Fingerprint::from_bytes([1; 32]);
        assert_ne!(
            operation_id("ns", &ClientKey::parse(r#"" ab""#).unwrap(), &fp),
            operation_id("ns", &ClientKey::parse("ab").unwrap(), &fp)
        );
    }

    proptest! {
        #[test]
        fn parsing_random_ids_never_panics(s in "[A-Za-z0-9_-]{0,80}") {
            let _ = parse_operation_id(&s);
        }
    }
}
