//! Idempotency keys: parsing what clients send, and building keys that stay
//! stable across retries.
//!
//! The first rule of idempotency keys is that a key must not change between attempts of one
//! operation. The helpers here produce keys from things that do not change:
//! business identifiers ([`natural_key`]), a value minted once before the first
//! attempt and carried through every retry ([`ClientKey::mint`]), or — when a
//! caller has neither — user + session + content hash + time window
//! ([`DerivedKey`]). A content hash alone is never offered: two identical
//! questions from one user are two operations.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Longest accepted client key, in characters (the HTTP contract in docs/design.md).
pub const MAX_KEY_LEN: usize = 255;

/// Why a client-supplied key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string (or `""`).
    #[error("idempotency key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("idempotency key is {len} characters long; the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// Length of the refused key.
        len: usize,
    },
    /// The key holds a byte outside printable ASCII (0x20–0x7E).
    #[error("idempotency key holds a non-printable or non-ASCII character at byte {position}")]
    NotPrintable {
        /// Byte offset of the first offending character.
        position: usize,
    },
    /// A quoted key (`"..."`) is not a valid structured-field string.
    #[error("idempotency key is not a valid quoted string: {reason}")]
    BadQuoting {
        /// What is wrong with the quoting.
        reason: &'static str,
    },
}

/// A validated idempotency key as a client sent it.
///
/// Both forms of the `Idempotency-Key` header are accepted and mean the same
/// key: the structured-field string `"abc"` (IETF draft) and the bare token
/// `abc` that most clients send.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClientKey(String);

impl ClientKey {
    /// Parses a header value in either accepted form.
    ///
    /// # Errors
    /// [`KeyError`] when the key is empty, too long, holds characters outside
    /// printable ASCII, or is badly quoted.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let raw = raw.trim_matches(|c| c == ' ' || c == '\t');
        let inner = if let Some(rest) = raw.strip_prefix('"') {
            unquote_sf_string(rest)?
        } else {
            raw.to_owned()
        };
        Self::validate(&inner)?;
        Ok(Self(inner))
    }

    /// Parses raw header bytes (which need not be UTF-8).
    ///
    /// # Errors
    /// As [`ClientKey::parse`]; invalid UTF-8 is reported as
    /// [`KeyError::NotPrintable`].
    pub fn parse_bytes(raw: &[u8]) -> Result<Self, KeyError> {
        match std::str::from_utf8(raw) {
            Ok(s) => Self::parse(s),
            Err(e) => Err(KeyError::NotPrintable {
                position: e.valid_up_to(),
            }),
        }
    }

    /// Mints a fresh random key. Call this **once, before the first attempt**,
    /// and send the same key with every retry of the operation; minting inside
    /// a retry loop defeats idempotency: each retry looks like a new operation.
    pub fn mint() -> Self {
        let bits: u128 = rand::random();
        Self(format!("ik_{bits:032x}"))
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn validate(s: &str) -> Result<(), KeyError> {
        if s.is_empty() {
            return Err(KeyError::Empty);
        }
        if s.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: s.len() });
        }
        if let Some(position) = s.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
            return Err(KeyError::NotPrintable { position });
        }
        Ok(())
    }
}

/// Decodes the body of an RFC 8941 sf-string whose opening quote is consumed.
fn unquote_sf_string(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => out.push(e),
                _ => {
                    return Err(KeyError::BadQuoting {
                        reason: "backslash must escape '\"' or '\\'",
                    });
                }
            },
            '"' => {
                if i + 1 != rest.len() {
                    return Err(KeyError::BadQuoting {
                        reason: "characters after the closing quote",
                    });
                }
                return Ok(out);
            }
            c => out.push(c),
        }
    }
    Err(KeyError::BadQuoting {
        reason: "missing closing quote",
    })
}

impl TryFrom<String> for ClientKey {
    type Error = KeyError;
    fn try_from(s: String) -> Result<Self, KeyError> {
        Self::validate(&s)?;
        Ok(Self(s))
    }
}

impl From<ClientKey> for String {
    fn from(k: ClientKey) -> String {
        k.0
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({:?})", self.0)
    }
}

/// The address of a record: (tenant, namespace, client key).
///
/// Two tenants sending the same client key never share a record, and neither
/// do two routes (namespaces) of one tenant.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct ScopedKey {
    /// Whose key this is: a hash of the caller's credential, never the
    /// credential itself.
    pub tenant: String,
    /// Which operation family: a route, a service name.
    pub namespace: String,
    /// The client's key.
    pub key: ClientKey,
}

impl ScopedKey {
    /// Builds a scoped key.
    pub fn new(tenant: impl Into<String>, namespace: impl Into<String>, key: ClientKey) -> Self {
        Self {
            tenant: tenant.into(),
            namespace: namespace.into(),
            key,
        }
    }

    /// One string that identifies the record in a store. Length-prefixed, so
    /// no choice of tenant or namespace text can make two scoped keys collide.
    pub fn storage_id(&self) -> String {
        let mut id = String::with_capacity(
            self.tenant.len() + self.namespace.len() + self.key.as_str().len() + 16,
        );
        self.write_storage_id(|part| id.push_str(part));
        id
    }

    /// Hands [`storage_id`](Self::storage_id) to `out` in pieces, for a
    /// caller that hashes it (a store's hash tag) and needs no string.
    pub fn write_storage_id(&self, mut out: impl FnMut(&str)) {
        let mut first = true;
        for part in [self.tenant.as_str(), &self.namespace, self.key.as_str()] {
            if !first {
                out("|");
            }
            first = false;
            out(itoa::Buffer::new().format(part.len()));
            out(":");
            out(part);
        }
    }
}

/// Builds a key from business dimensions that stay the same across retries,
/// e.g. `natural_key(["order", "8123", "summarize"])`.
///
/// Parts are joined with `:`; a `:` or `\` inside a part is escaped so that
/// `["a:b", "c"]` and `["a", "b:c"]` give different keys.
///
/// # Errors
/// [`KeyError`] when the result is empty, too long or not printable ASCII.
pub fn natural_key<I, S>(parts: I) -> Result<ClientKey, KeyError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        for c in part.as_ref().chars() {
            if c == ':' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    ClientKey::try_from(out)
}

/// A key derived from user + session + content + time window, for callers
/// that have no business identifier and did not mint a key up front.
///
/// The time window bounds the merge: the same question asked again by the
/// same user in the same session within one window is treated as the same
/// operation (a retry); in the next window it is a new one.
#[derive(Debug, Clone)]
pub struct DerivedKey {
    user: String,
    session: String,
    content_hash: [u8; 32],
    window: Duration,
}

impl DerivedKey {
    /// Starts a derived key from the user and session identifiers and the
    /// request content (hashed as canonical JSON when it parses as JSON).
    pub fn new(user: impl Into<String>, session: impl Into<String>, content: &[u8]) -> Self {
        Self {
            user: user.into(),
            session: session.into(),
            content_hash: *crate::fingerprint::BodyDigest::lenient(content, &[]).as_bytes(),
            window: Duration::from_secs(600),
        }
    }

    /// Sets the time window (default ten minutes). A zero window is treated as
    /// one second.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The key for the window containing `at`.
    ///
    /// # Errors
    /// [`KeyError`] when user and session make the key too long or non-printable.
    pub fn at(&self, at: SystemTime) -> Result<ClientKey, KeyError> {
        let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let window = self.window.as_secs().max(1);
        let bucket = secs / window;
        let hash = hex::encode(&self.content_hash[..12]);
        natural_key([
            "d",
            &self.user,
            &self.session,
            &hash,
            &format!("{window}s{bucket}"),
        ])
    }

    /// The key for the current window.
    ///
    /// # Errors
    /// As [`DerivedKey::at`].
    pub fn now(&self) -> Result<ClientKey, KeyError> {
        self.at(SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_are_the_same_key() {
        let bare = ClientKey::parse("abc-123").unwrap();
        let quoted = ClientKey::parse("\"abc-123\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(ClientKey::parse(r#""a\"b""#).unwrap().as_str(), "a\"b");
    }

    #[test]
    fn malformed_keys_are_refused_with_a_reason() {
        assert_eq!(ClientKey::parse(""), Err(KeyError::Empty));
        assert_eq!(ClientKey::parse("\"\""), Err(KeyError::Empty));
        assert_eq!(
            ClientKey::parse(&"x".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(ClientKey::parse(&"x".repeat(255)).is_ok());
        assert_eq!(
            ClientKey::parse("ab\u{1}c"),
            Err(KeyError::NotPrintable { position: 2 })
        );
        assert!(matches!(
            ClientKey::parse("clé"),
            Err(KeyError::NotPrintable { .. })
        ));
        assert!(matches!(
            ClientKey::parse("\"abc"),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            ClientKey::parse("\"ab\"c"),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            ClientKey::parse(r#""a\nb""#),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            ClientKey::parse_bytes(b"\xff\xfe"),
            Err(KeyError::NotPrintable { position: 0 })
        ));
    }

    /// The structured-field string form of `key`.
    fn quoted(key: &str) -> String {
        format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
    }

    proptest::proptest! {
        /// Whatever bytes a client sends, parsing answers (never panics),
        /// and an accepted key is 1–255 printable ASCII characters whose
        /// quoted form is the same key.
        #[test]
        fn any_header_bytes_parse_or_are_refused(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            match ClientKey::parse_bytes(&raw) {
                Ok(k) => {
                    proptest::prop_assert!((1..=MAX_KEY_LEN).contains(&k.as_str().len()));
                    proptest::prop_assert!(k.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)));
                    proptest::prop_assert_eq!(ClientKey::parse(&quoted(k.as_str())), Ok(k));
                }
                Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
            }
        }

        /// A printable key means the same in its bare and its quoted form,
        /// with or without surrounding whitespace.
        #[test]
        fn bare_and_quoted_forms_agree(key in "[!#-~]([ -~]{0,253}[!-~])?", pad in "[ \t]{0,3}") {
            let bare = ClientKey::parse(&format!("{pad}{key}{pad}"));
            proptest::prop_assert_eq!(bare.as_ref().map(ClientKey::as_str), Ok(key.as_str()));
            proptest::prop_assert_eq!(ClientKey::parse(&quoted(&key)), bare);
        }

        /// Longer than the limit is refused with the length, whatever the
        /// characters.
        #[test]
        fn too_long_keys_say_their_length(key in "[!-~]{256,400}") {
            let refused = ClientKey::parse(&format!("x{key}"));
            proptest::prop_assert_eq!(refused, Err(KeyError::TooLong { len: key.len() + 1 }));
        }

        /// Natural keys of any parts are valid or refused, never merged:
        /// different part lists that both make a key make different keys.
        #[test]
        fn natural_keys_never_merge_different_parts(
            a in proptest::collection::vec("[ -~]{0,6}", 1..4),
            b in proptest::collection::vec("[ -~]{0,6}", 1..4),
        ) {
            if let (Ok(ka), Ok(kb)) = (natural_key(&a), natural_key(&b)) {
                proptest::prop_assert_eq!(ka == kb, a == b);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]

        /// A header of up to a megabyte, printable or not, quoted or not,
        /// is refused with a reason in one pass.
        #[test]
        fn megabyte_headers_are_refused_with_a_reason(
            n in 512usize..=1 << 20,
            fill in proptest::sample::select(vec![b'x', b'\\', b'"', 0x7f, 0xe9]),
            quote in proptest::bool::ANY,
        ) {
            let mut raw = vec![fill; n];
            if quote {
                raw.insert(0, b'"');
                raw.push(b'"');
            }
            let refused = ClientKey::parse_bytes(&raw);
            proptest::prop_assert!(refused.is_err(), "{} bytes of {fill:#x}", raw.len());
        }
    }

    #[test]
    fn minted_keys_are_distinct_and_valid() {
        let a = ClientKey::mint();
        let b = ClientKey::mint();
        assert_ne!(a, b);
        assert_eq!(ClientKey::parse(a.as_str()).unwrap(), a);
    }

    #[test]
    fn natural_key_escapes_separators() {
        let a = natural_key(["a:b", "c"]).unwrap();
        let b = natural_key(["a", "b:c"]).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            natural_key(["order", "81", "summary"]).unwrap().as_str(),
            "order:81:summary"
        );
    }

    #[test]
    fn a_storage_id_is_each_part_after_its_length() {
        // Stores name records by it (and by hashes of it): it must not
        // change from one version to the next.
        let key = ScopedKey::new("tenant", "ns", ClientKey::parse("k:1|x").unwrap());
        assert_eq!(key.storage_id(), "6:tenant|2:ns|5:k:1|x");
        let mut pieces = Vec::new();
        key.write_storage_id(|p| pieces.push(p.to_owned()));
        assert_eq!(pieces.concat(), key.storage_id());
        let long = "t".repeat(1234);
        let key = ScopedKey::new(long.clone(), "", ClientKey::parse("k").unwrap());
        assert_eq!(key.storage_id(), format!("1234:{long}|0:|1:k"));
    }

    #[test]
    fn scoped_storage_ids_do_not_collide() {
        let k = ClientKey::parse("k").unwrap();
        let a = ScopedKey::new("t|1:x", "n", k.clone());
        let b = ScopedKey::new("t", "1:x|n", k);
        assert_ne!(a.storage_id(), b.storage_id());
    }

    #[test]
    fn derived_key_is_stable_within_a_window_and_changes_across() {
        let body = br#"{"b":1,"a":[1,2]}"#;
        let reordered = br#"{"a":[1,2],"b":1}"#;
        let d = DerivedKey::new("u1", "s1", body).window(Duration::from_secs(60));
        let t0 = UNIX_EPOCH + Duration::from_secs(6000);
        let same = DerivedKey::new("u1", "s1", reordered).window(Duration::from_secs(60));
        assert_eq!(
            d.at(t0).unwrap(),
            same.at(t0 + Duration::from_secs(59)).unwrap()
        );
        assert_ne!(
            d.at(t0).unwrap(),
            d.at(t0 + Duration::from_secs(60)).unwrap()
        );
        let other_user = DerivedKey::new("u2", "s1", body).window(Duration::from_secs(60));
        assert_ne!(d.at(t0).unwrap(), other_user.at(t0).unwrap());
    }
}
