//! Who is asking (tenant) and which operation it is (key).
//!
//! The tenant is a hash of a credential, never the credential: records and
//! logs may then be read by operators without leaking API keys. It is read
//! from whichever credential header the client's API uses (`Authorization`,
//! `x-api-key`, `api-key`, `x-goog-api-key`) unless the route names its own
//! headers: a client whose credential were not read would share the
//! `anonymous` tenant, and with it every other such client's results. The key is
//! the client's `Idempotency-Key` (bare token or quoted sf-string, the same
//! key either way), or one derived from natural dimensions of the request.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};
use idemgate_engine::BodyDigest;
use idemgate_engine::{ClientKey, KeyError, natural_key};
use sha2::{Digest, Sha256};

pub use crate::config::IDEMPOTENCY_KEY;
use crate::config::{DerivePart, DeriveTemplate, TenantSource};

/// Tenant of requests without a credential.
pub const ANONYMOUS: &str = "anonymous";

/// The tenant id of a credential: the first 32 hex digits of its SHA-256.
pub fn tenant_id(credential: &[u8]) -> String {
    let digest = Sha256::digest(credential);
    hex::encode(&digest[..16])
}

/// The tenant of a request: [`tenant_id`] of the value of the first header
/// of `source` that the request carries, or [`ANONYMOUS`] when it carries
/// none. A header sent several times counts with all its values (joined by
/// `, `), so adding a second value never lands a request in the first
/// value's tenant.
pub fn tenant_of(headers: &HeaderMap, source: &TenantSource) -> String {
    for name in source.headers() {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else {
            continue;
        };
        let mut joined = first.as_bytes().to_vec();
        for v in values {
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(v.as_bytes());
        }
        return tenant_id(&joined);
    }
    ANONYMOUS.to_owned()
}

/// Why a request's key could not be determined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRefusal {
    /// The route requires a key and none was sent.
    #[error("the Idempotency-Key header is required on this route")]
    Missing,
    /// The key was sent but is not valid.
    #[error(transparent)]
    Malformed(KeyError),
    /// The header was sent more than once.
    #[error("the Idempotency-Key header was sent more than once")]
    Repeated,
    /// A header the derived key is built from is missing.
    #[error("the {0} header is required to derive the idempotency key")]
    MissingDimension(HeaderName),
}

/// The client's key, if it sent one (in `Idempotency-Key`).
///
/// # Errors
/// [`KeyRefusal::Malformed`] or [`KeyRefusal::Repeated`].
pub fn client_key(headers: &HeaderMap) -> Result<Option<ClientKey>, KeyRefusal> {
    client_key_in(headers, &IDEMPOTENCY_KEY)
}

/// The client's key, if it sent one in the header `name`.
///
/// # Errors
/// [`KeyRefusal::Malformed`] or [`KeyRefusal::Repeated`].
pub fn client_key_in(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<ClientKey>, KeyRefusal> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyRefusal::Repeated);
    }
    ClientKey::parse_bytes(first.as_bytes())
        .map(Some)
        .map_err(KeyRefusal::Malformed)
}

/// A key built from `template` for a request whose body has `body` as its
/// digest (the one its fingerprint is made from).
///
/// Readable (`d:…` with the dimensions joined) when the dimensions make a
/// valid key; otherwise (too long, or a header value that is not printable
/// ASCII) the dimensions are hashed into `dh:<hex>`. The choice depends only
/// on the request, so retries land on the same key.
///
/// # Errors
/// [`KeyRefusal::MissingDimension`] when a header of the template is absent.
pub fn derive_key(
    template: &DeriveTemplate,
    tenant: &str,
    headers: &HeaderMap,
    body: &BodyDigest,
    now: SystemTime,
) -> Result<ClientKey, KeyRefusal> {
    let mut parts: Vec<Vec<u8>> = vec![b"d".to_vec()];
    for part in &template.parts {
        match part {
            DerivePart::Tenant => parts.push(tenant.as_bytes().to_vec()),
            DerivePart::Header(name) => {
                let mut values = headers.get_all(name).iter();
                let first = values
                    .next()
                    .ok_or_else(|| KeyRefusal::MissingDimension(name.clone()))?;
                let mut joined = first.as_bytes().to_vec();
                for v in values {
                    joined.extend_from_slice(b", ");
                    joined.extend_from_slice(v.as_bytes());
                }
                parts.push(dimension_hash(name, &joined).into_bytes());
            }
            DerivePart::BodyHash => {
                parts.push(hex::encode(&body.as_bytes()[..12]).into_bytes());
            }
        }
    }
    if let Some(window) = template.window {
        parts.push(window_label(window, now).into_bytes());
    }
    let readable = parts
        .iter()
        .map(|p| std::str::from_utf8(p).ok())
        .collect::<Option<Vec<&str>>>()
        .and_then(|strs| natural_key(strs).ok());
    if let Some(key) = readable {
        return Ok(key);
    }
    let mut h = Sha256::new();
    for p in &parts {
        h.update(u64::try_from(p.len()).unwrap_or(u64::MAX).to_be_bytes());
        h.update(p);
    }
    ClientKey::parse(&format!("dh:{}", hex::encode(h.finalize()))).map_err(KeyRefusal::Malformed)
}

/// A header dimension as it goes into the key: the first 128 bits of
/// SHA-256 over the header name and value, as hex. The derived key is
/// forwarded upstream and logged; user and session ids must reach neither.
fn dimension_hash(name: &HeaderName, value: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"idemgate/derive-dimension/v1\0");
    h.update(name.as_str().as_bytes());
    h.update(b"\0");
    h.update(value);
    hex::encode(&h.finalize()[..16])
}

/// `{window}s{bucket}`: the same label for every instant of one window.
fn window_label(window: Duration, now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let w = window.as_secs().max(1);
    format!("{w}s{}", secs / w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn tenant_is_a_hash_never_the_credential() {
        let h = headers(&[("authorization", b"Bearer sk-secret")]);
        let t = tenant_of(&h, &TenantSource::Credential);
        assert_eq!(t.len(), 32);
        assert!(!t.contains("secret"));
        assert_eq!(t, tenant_id(b"Bearer sk-secret"));
        assert_ne!(t, tenant_id(b"Bearer sk-other"));
        assert_eq!(
            tenant_of(&HeaderMap::new(), &TenantSource::Credential),
            ANONYMOUS
        );
        let custom = TenantSource::Headers(vec![HeaderName::from_static("x-tenant")]);
        assert_eq!(tenant_of(&h, &custom), ANONYMOUS);
        let h2 = headers(&[("x-tenant", b"acme")]);
        assert_eq!(tenant_of(&h2, &custom), tenant_id(b"acme"));
        let twice = headers(&[("x-tenant", b"acme"), ("x-tenant", b"evil")]);
        assert_ne!(tenant_of(&twice, &custom), tenant_id(b"acme"));
    }

    #[test]
    fn every_providers_credential_header_names_a_tenant() {
        for name in ["authorization", "x-api-key", "api-key", "x-goog-api-key"] {
            let a = tenant_of(&headers(&[(name, b"key-a")]), &TenantSource::Credential);
            let b = tenant_of(&headers(&[(name, b"key-b")]), &TenantSource::Credential);
            assert_eq!(a, tenant_id(b"key-a"), "{name}");
            assert_ne!(a, b, "{name}");
        }
        // The first present header wins, in the documented order.
        let both = headers(&[("x-goog-api-key", b"g"), ("x-api-key", b"x")]);
        assert_eq!(tenant_of(&both, &TenantSource::Credential), tenant_id(b"x"));
        let all = headers(&[("api-key", b"z"), ("authorization", b"Bearer a")]);
        assert_eq!(
            tenant_of(&all, &TenantSource::Credential),
            tenant_id(b"Bearer a")
        );
        // A configured list is read in its own order, and only it.
        let list = TenantSource::Headers(vec![
            HeaderName::from_static("x-tenant-id"),
            HeaderName::from_static("x-api-key"),
        ]);
        let h = headers(&[("x-api-key", b"k"), ("x-tenant-id", b"acme")]);
        assert_eq!(tenant_of(&h, &list), tenant_id(b"acme"));
        let h = headers(&[("x-api-key", b"k"), ("authorization", b"Bearer a")]);
        assert_eq!(tenant_of(&h, &list), tenant_id(b"k"));
        let h = headers(&[("authorization", b"Bearer a")]);
        assert_eq!(tenant_of(&h, &list), ANONYMOUS);
    }

    #[test]
    fn client_key_forms_and_refusals() {
        assert_eq!(client_key(&HeaderMap::new()), Ok(None));
        let bare = client_key(&headers(&[("idempotency-key", b"k-1")])).unwrap();
        let quoted = client_key(&headers(&[("idempotency-key", b"\"k-1\"")])).unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(
            client_key(&headers(&[
                ("idempotency-key", b"a"),
                ("idempotency-key", b"b")
            ])),
            Err(KeyRefusal::Repeated)
        );
        for bad in [
            &b""[..],
            b"\"\"",
            b"\"open",
            b"caf\xc3\xa9",
            &[b'x'; 256][..],
        ] {
            assert!(
                matches!(
                    client_key(&headers(&[("idempotency-key", bad)])),
                    Err(KeyRefusal::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any number of `Idempotency-Key` values, of any bytes a header may
        /// carry: none is no key, two or more are refused as repeated, one
        /// is exactly what the engine's parser makes of it.
        #[test]
        fn key_headers_of_any_bytes(values in proptest::collection::vec(
            proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..3,
        )) {
            let mut h = HeaderMap::new();
            let mut sent = Vec::new();
            for v in &values {
                if let Ok(value) = HeaderValue::from_bytes(v) {
                    h.append(IDEMPOTENCY_KEY, value);
                    sent.push(v.clone());
                }
            }
            let got = client_key(&h);
            match sent.as_slice() {
                [] => proptest::prop_assert_eq!(got, Ok(None)),
                [one] => proptest::prop_assert_eq!(
                    got,
                    ClientKey::parse_bytes(one).map(Some).map_err(KeyRefusal::Malformed)
                ),
                _ => proptest::prop_assert_eq!(got, Err(KeyRefusal::Repeated)),
            }
        }

        /// Any credential headers: the tenant is `anonymous` or 32 hex
        /// digits, and it is the hash of the first listed header present.
        #[test]
        fn tenants_of_any_credential_headers(
            present in proptest::collection::vec((0..4usize, "[ -~]{1,40}"), 0..5),
        ) {
            let mut h = HeaderMap::new();
            for (i, value) in &present {
                h.append(
                    crate::config::CREDENTIAL_HEADERS[*i].clone(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let tenant = tenant_of(&h, &TenantSource::Credential);
            let first = crate::config::CREDENTIAL_HEADERS
                .iter()
                .find(|name| h.contains_key(*name));
            match first {
                None => proptest::prop_assert_eq!(tenant, ANONYMOUS),
                Some(name) => {
                    proptest::prop_assert_eq!(tenant.len(), 32);
                    let joined: Vec<&[u8]> = h.get_all(name).iter().map(HeaderValue::as_bytes).collect();
                    proptest::prop_assert_eq!(tenant, tenant_id(&joined.join(&b", "[..])));
                }
            }
        }
    }

    fn digest(body: &[u8]) -> BodyDigest {
        idemgate_engine::digest_body(None, body, &[]).unwrap()
    }

    #[test]
    fn derived_keys_follow_their_dimensions() {
        let t = DeriveTemplate::default();
        let at = UNIX_EPOCH + Duration::from_secs(6_000_000);
        let h = headers(&[("x-user-id", b"u1"), ("x-session-id", b"s1")]);
        let k = derive_key(&t, "ten", &h, &digest(br#"{"q":1,"r":2}"#), at).unwrap();
        assert!(k.as_str().starts_with("d:ten:"), "{k}");
        let reordered = derive_key(&t, "ten", &h, &digest(br#"{"r":2,"q":1}"#), at).unwrap();
        assert_eq!(k, reordered);
        let other_user = headers(&[("x-user-id", b"u2"), ("x-session-id", b"s1")]);
        assert_ne!(
            k,
            derive_key(&t, "ten", &other_user, &digest(br#"{"q":1,"r":2}"#), at).unwrap()
        );
        let later = at + Duration::from_secs(600);
        assert_ne!(
            k,
            derive_key(&t, "ten", &h, &digest(br#"{"q":1,"r":2}"#), later).unwrap()
        );
        let missing = headers(&[("x-user-id", b"u1")]);
        assert_eq!(
            derive_key(&t, "ten", &missing, &digest(b"{}"), at),
            Err(KeyRefusal::MissingDimension(HeaderName::from_static(
                "x-session-id"
            )))
        );
    }

    #[test]
    fn user_and_session_values_never_appear_in_the_derived_key() {
        let t = DeriveTemplate::default();
        let at = UNIX_EPOCH + Duration::from_secs(6_000_000);
        let h = headers(&[
            ("x-user-id", b"alice@example.com"),
            ("x-session-id", b"session-7f3e-secret"),
        ]);
        let k = derive_key(&t, "ten", &h, &digest(b"{}"), at).unwrap();
        assert!(!k.as_str().contains("alice"), "{k}");
        assert!(!k.as_str().contains("session-7f3e"), "{k}");
        // Stable, and still one key per user.
        assert_eq!(k, derive_key(&t, "ten", &h, &digest(b"{}"), at).unwrap());
        let bob = headers(&[
            ("x-user-id", b"bob@example.com"),
            ("x-session-id", b"session-7f3e-secret"),
        ]);
        assert_ne!(k, derive_key(&t, "ten", &bob, &digest(b"{}"), at).unwrap());
    }

    #[test]
    fn unprintable_or_long_dimensions_are_hashed_stably() {
        let t = DeriveTemplate::default();
        let at = UNIX_EPOCH;
        let long = vec![b'u'; 300];
        let h = headers(&[("x-user-id", &long), ("x-session-id", b"s\xff")]);
        let a = derive_key(&t, "ten", &h, &digest(b"{}"), at).unwrap();
        let b = derive_key(&t, "ten", &h, &digest(b"{}"), at).unwrap();
        assert_eq!(a, b);
        // Header values are hashed, so any bytes make a valid key.
        assert!(!a.as_str().contains("uuuu"), "{a}");
    }
}
