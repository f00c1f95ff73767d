//! Request fingerprints: what "the same request" means.
//!
//! A key reused with a different payload is a client bug (or an attack), and
//! must be refused rather than answered with the other payload's result. The
//! fingerprint is SHA-256 over the method, the path and a digest of the body:
//!
//! - **JSON** is reduced to a canonical form — object keys sorted,
//!   insignificant whitespace dropped, strings re-escaped one way — so two
//!   serializations of the same value match. Numbers keep their exact literal
//!   text: `12345678901234567890123` and `…124` are different requests, which
//!   a parse into `f64` would merge. An object with a duplicate key is
//!   refused ([`BodyError::DuplicateKey`]): parsers disagree on which value
//!   wins, so the upstream may see a different request than the one we
//!   fingerprinted. So is one nested deeper than [`MAX_JSON_DEPTH`]
//!   ([`BodyError::TooDeep`]). Configured JSON pointers (e.g. `/metadata/request_time`)
//!   are left out, for fields that clients legitimately change between
//!   retries.
//! - **multipart** bodies are hashed without their boundary: a client picks a
//!   fresh random boundary on every attempt, so the boundary must not make a
//!   retry look like a different request.
//! - anything else is hashed as raw bytes.
//!
//! The canonical form is built in one pass by the `canonical` module, with an
//! explicit stack instead of recursion, so a body's nesting costs neither
//! stack nor extra time; nesting deeper than [`MAX_JSON_DEPTH`] is refused
//! ([`BodyError::TooDeep`]). Numbers keep their source text, so no
//! crate-wide `arbitrary_precision` feature is needed (it would change
//! every crate's `Value`).

use std::fmt;

use serde::de;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod canonical;

pub use canonical::MAX_JSON_DEPTH;
use canonical::{Failure, Pointers};

/// SHA-256 of a request's method, path and canonical body.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(#[serde(with = "hex_bytes")] [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a request from its method, path and body digest.
    pub fn of_digest(method: &str, path: &str, body: &BodyDigest) -> Self {
        let mut h = Sha256::new();
        h.update(method.as_bytes());
        h.update([0]);
        h.update(path.as_bytes());
        h.update([0]);
        h.update(body.0);
        Self(h.finalize().into())
    }

    /// The fingerprint of a request whose body is JSON or raw bytes.
    ///
    /// A convenience for library callers that do not refuse bad bodies: a
    /// JSON body with a duplicate object key is hashed as raw bytes here. A
    /// server that must refuse it uses [`digest_body`] and
    /// [`Fingerprint::of_digest`].
    pub fn of_request(method: &str, path: &str, body: &[u8], ignore: &[String]) -> Self {
        Self::of_digest(method, path, &BodyDigest::lenient(body, ignore))
    }

    /// The fingerprint of a value the caller already holds (library use):
    /// its canonical JSON serialization.
    ///
    /// # Errors
    /// When `value` cannot be serialized to JSON.
    pub fn of_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let text = serde_json::to_vec(value)?;
        let mut out = Vec::with_capacity(text.len());
        canonical::write(&text, &Pointers::default(), &mut out).map_err(|e| match e {
            Failure::Refused(e) => de::Error::custom(e),
            Failure::NotJson => de::Error::custom("the value has no canonical JSON form"),
        })?;
        Ok(Self(Sha256::digest(&out).into()))
    }

    /// Lower-case hex form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The fingerprint's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from its bytes, as a store kept them.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Parses the hex form.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

/// SHA-256 of a body in its canonical form (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BodyDigest([u8; 32]);

impl BodyDigest {
    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// [`digest_body`] without a content type, hashing a JSON body with a
    /// duplicate key as raw bytes instead of refusing it.
    pub(crate) fn lenient(body: &[u8], ignore: &[String]) -> Self {
        digest_body(None, body, ignore).unwrap_or_else(|_| Self::raw(body))
    }

    fn raw(body: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"r");
        h.update(body);
        Self(h.finalize().into())
    }
}

impl fmt::Debug for BodyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BodyDigest({})", &hex::encode(self.0)[..16])
    }
}

/// A body that cannot be fingerprinted faithfully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// A JSON object names the same key twice.
    #[error("the JSON body repeats the object key {key:?}; send each key once")]
    DuplicateKey {
        /// The repeated key (at most 64 characters of it).
        key: String,
    },
    /// Arrays and objects nest deeper than [`MAX_JSON_DEPTH`].
    #[error("the JSON body nests arrays and objects deeper than {limit} levels")]
    TooDeep {
        /// The deepest nesting accepted.
        limit: usize,
    },
}

/// The digest of `body`: canonical JSON (with `ignore` pointers left out),
/// multipart without its boundary, or raw bytes.
///
/// `content_type` is the request's `Content-Type`; only a `multipart/*`
/// type changes the result. JSON is recognised by parsing, whatever the
/// content type says.
///
/// # Errors
/// [`BodyError::DuplicateKey`] for JSON with a repeated object key.
pub fn digest_body(
    content_type: Option<&str>,
    body: &[u8],
    ignore: &[String],
) -> Result<BodyDigest, BodyError> {
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(b'j');
    match canonical::write(body, &Pointers::new(ignore), &mut out) {
        Ok(()) => return Ok(BodyDigest(Sha256::digest(&out).into())),
        Err(Failure::Refused(e)) => return Err(e),
        Err(Failure::NotJson) => {}
    }
    if let Some(boundary) = content_type.and_then(multipart_boundary) {
        return Ok(BodyDigest(multipart_digest(body, boundary.as_bytes())));
    }
    Ok(BodyDigest::raw(body))
}

/// Canonical JSON text of `body` (sorted keys, no whitespace, numbers as
/// written), if it is JSON without duplicate keys.
pub fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    canonical::write(body, &Pointers::default(), &mut out).ok()?;
    Some(out)
}

/// The `boundary` parameter of a `multipart/*` content type.
fn multipart_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let essence = params.next()?.trim();
    if !essence
        .get(..10)
        .is_some_and(|p| p.eq_ignore_ascii_case("multipart/"))
    {
        return None;
    }
    params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim().trim_matches('"');
        (!value.is_empty() && value.len() <= 70).then(|| value.to_owned())
    })
}

/// SHA-256 of a multipart body with every occurrence of its boundary left
/// out: the parts (their headers and content) and their order remain.
fn multipart_digest(body: &[u8], boundary: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"m");
    let mut from = 0;
    for at in memchr::memmem::find_iter(body, boundary) {
        h.update(&body[from..at]);
        h.update([0]);
        from = at + boundary.len();
    }
    h.update(&body[from..]);
    h.finalize().into()
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(b: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
