//! Request fingerprints: what "the same request" means.
//!
//! A key reused with a different payload is a client bug (or an attack), and
//! must be refused rather than answered with the other payload's result. The
//! fingerprint is SHA-256 over the method, the path and the body in canonical
//! JSON form — object keys sorted, insignificant whitespace dropped — so that
//! two serializations of the same JSON value match. Configured JSON pointers
//! (e.g. `/metadata/request_time`) are removed first, for fields that clients
//! legitimately change between retries. A body that is not JSON is hashed as
//! raw bytes.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of a request's method, path and canonical body.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(#[serde(with = "hex_bytes")] pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of an HTTP-like request.
    pub fn of_request(method: &str, path: &str, body: &[u8], ignore: &[String]) -> Self {
        let mut h = Sha256::new();
        h.update(method.as_bytes());
        h.update([0]);
        h.update(path.as_bytes());
        h.update([0]);
        h.update(canonical_content_hash(body, ignore));
        Self(h.finalize().into())
    }

    /// The fingerprint of a value the caller already holds (library use):
    /// its canonical JSON serialization.
    ///
    /// # Errors
    /// When `value` cannot be serialized to JSON.
    pub fn of_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let v = serde_json::to_value(value)?;
        let mut out = Vec::new();
        write_canonical(&v, &mut out);
        Ok(Self(Sha256::digest(&out).into()))
    }

    /// Lower-case hex form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
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

/// SHA-256 of `body` in canonical JSON form with `ignore` pointers removed,
/// or of the raw bytes when `body` is not JSON.
pub fn canonical_content_hash(body: &[u8], ignore: &[String]) -> [u8; 32] {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut v) => {
            for pointer in ignore {
                remove_pointer(&mut v, pointer);
            }
            let mut out = Vec::with_capacity(body.len());
            out.push(b'j');
            write_canonical(&v, &mut out);
            Sha256::digest(&out).into()
        }
        Err(_) => {
            let mut h = Sha256::new();
            h.update(b"r");
            h.update(body);
            h.finalize().into()
        }
    }
}

/// Canonical JSON text of `body` (sorted keys, no whitespace), if it is JSON.
pub fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&v, &mut out);
    Some(out)
}

/// Writes `v` with object keys sorted, independent of serde_json's
/// `preserve_order` feature (which another crate in a build could enable).
fn write_canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(k.clone()), out);
                out.push(b':');
                write_canonical(val, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(v: &Value, out: &mut Vec<u8>) {
    // Serializing a scalar `Value` into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// Removes the value at an RFC 6901 pointer, if present.
fn remove_pointer(v: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let target = if parent.is_empty() {
        Some(v)
    } else {
        v.pointer_mut(parent)
    };
    match target {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
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
mod tests {
    use super::*;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = Fingerprint::of_request("POST", "/v1", br#"{"a":1,"b":{"y":2,"x":[1,2]}}"#, &[]);
        let b = Fingerprint::of_request(
            "POST",
            "/v1",
            b"{ \"b\": {\"x\": [1, 2], \"y\": 2},\n \"a\": 1 }",
            &[],
        );
        assert_eq!(a, b);
    }

    #[test]
    fn payload_method_and_path_all_count() {
        let base = Fingerprint::of_request("POST", "/v1", br#"{"a":1}"#, &[]);
        assert_ne!(
            base,
            Fingerprint::of_request("POST", "/v1", br#"{"a":2}"#, &[])
        );
        assert_ne!(
            base,
            Fingerprint::of_request("PUT", "/v1", br#"{"a":1}"#, &[])
        );
        assert_ne!(
            base,
            Fingerprint::of_request("POST", "/v2", br#"{"a":1}"#, &[])
        );
        let arr = Fingerprint::of_request("POST", "/v1", br#"[1,2]"#, &[]);
        assert_ne!(
            arr,
            Fingerprint::of_request("POST", "/v1", br#"[2,1]"#, &[])
        );
    }

    #[test]
    fn ignored_pointers_are_removed() {
        let ignore = vec!["/meta/sent_at".to_owned(), "/a~1b".to_owned()];
        let a = Fingerprint::of_request(
            "POST",
            "/",
            br#"{"q":1,"meta":{"sent_at":5},"a/b":1}"#,
            &ignore,
        );
        let b = Fingerprint::of_request("POST", "/", br#"{"q":1,"meta":{"sent_at":9}}"#, &ignore);
        assert_eq!(a, b);
        let c = Fingerprint::of_request("POST", "/", br#"{"q":2,"meta":{"sent_at":9}}"#, &ignore);
        assert_ne!(a, c);
    }

    #[test]
    fn non_json_bodies_hash_raw_and_never_equal_json() {
        let raw = Fingerprint::of_request("POST", "/", b"{not json", &[]);
        assert_eq!(raw, Fingerprint::of_request("POST", "/", b"{not json", &[]));
        assert_ne!(
            raw,
            Fingerprint::of_request("POST", "/", b"{not  json", &[])
        );
        assert_eq!(
            canonical_json(br#"{"b":1, "a":"x"}"#).unwrap(),
            br#"{"a":"x","b":1}"#
        );
    }

    #[test]
    fn hex_round_trip() {
        let f = Fingerprint::of_value(&serde_json::json!({"k": [1, "two"]})).unwrap();
        assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }
}
