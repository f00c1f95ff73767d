//! `Prefer: respond-async`: the client is told where the result will be
//! (202 + `Location`) and fetches it later with a `GET`.
//!
//! The operation id is the namespace and the key, URL-safe encoded; it holds
//! no tenant. The `GET` is scoped by its own credential, so a leaked id is
//! useless to another tenant (it finds nothing: 404).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idemgate_engine::{ClientKey, ScopedKey};

use crate::config::LayerConfig;
use crate::key::tenant_of;
use crate::problem::Problem;
use crate::replay::replay_stored;
use crate::shared::Shared;
use crate::sse::events_to_skip;
use crate::telemetry::Outcome;

const ID_VERSION: u8 = 1;

/// The opaque id of the operation `key` in `namespace`.
pub fn operation_id(namespace: &str, key: &ClientKey) -> String {
    let ns = namespace.as_bytes();
    let len = u16::try_from(ns.len()).unwrap_or(u16::MAX);
    let mut raw = Vec::with_capacity(3 + ns.len() + key.as_str().len());
    raw.push(ID_VERSION);
    raw.extend_from_slice(&len.to_be_bytes());
    raw.extend_from_slice(ns.get(..usize::from(len)).unwrap_or(ns));
    raw.extend_from_slice(key.as_str().as_bytes());
    URL_SAFE_NO_PAD.encode(raw)
}

/// The namespace and key of an operation id, if it is one.
pub fn parse_operation_id(id: &str) -> Option<(String, ClientKey)> {
    let raw = URL_SAFE_NO_PAD.decode(id).ok()?;
    let (&version, rest) = raw.split_first()?;
    if version != ID_VERSION {
        return None;
    }
    let len_bytes: [u8; 2] = rest.get(..2)?.try_into().ok()?;
    let len = usize::from(u16::from_be_bytes(len_bytes));
    let ns = rest.get(2..2 + len)?;
    let key = rest.get(2 + len..)?;
    let ns = String::from_utf8(ns.to_vec()).ok()?;
    let key = ClientKey::parse_bytes(key).ok()?;
    Some((ns, key))
}

/// The `Location` of an operation.
fn location(operations_path: &str, namespace: &str, key: &ClientKey) -> String {
    format!("{operations_path}{}", operation_id(namespace, key))
}

/// 202 pointing at the operation of `key` on the route `config` protects.
pub(crate) fn accepted_for(config: &LayerConfig, key: &ClientKey) -> Response {
    accepted(&location(&config.operations_path, &config.namespace, key))
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
    let Some((namespace, key)) = parse_operation_id(id) else {
        return Some(Problem::operation_not_found().into_response());
    };
    if namespace != cfg.namespace {
        return None;
    }
    let scoped = ScopedKey::new(tenant_of(headers, &cfg.tenant), namespace, key);
    let record = match shared.engine.store().get(&scoped).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "operation lookup failed");
            return Some(Problem::store_unavailable().into_response());
        }
    };
    Some(match record {
        None => Problem::operation_not_found().into_response(),
        Some(r) if r.is_done() => replay_stored(
            shared,
            &r,
            &scoped,
            events_to_skip(headers),
            Outcome::Replayed,
        ),
        Some(_) => accepted_for(cfg, &scoped.key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_round_trip_and_are_url_safe() {
        let key = ClientKey::parse("a/b+c=d \"q\"").unwrap();
        let id = operation_id("chat/completions", &key);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(
            parse_operation_id(&id),
            Some(("chat/completions".to_owned(), key))
        );
        assert_eq!(parse_operation_id("not*base64"), None);
        assert_eq!(parse_operation_id(""), None);
    }

    proptest! {
        #[test]
        fn parsing_random_ids_never_panics(s in "[A-Za-z0-9_-]{0,80}") {
            let _ = parse_operation_id(&s);
        }
    }
}
