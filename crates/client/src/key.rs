//! The idempotency key of one logical operation.

use std::fmt;
use std::sync::Arc;

/// Longest key the gateway accepts, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key` of one logical operation.
///
/// Mint it (or build it from a natural key) **once, before the first
/// attempt**, and send it with every retry of that operation: a key minted
/// inside a retry loop makes every retry a new operation, and the gateway
/// then runs (and the provider bills) each of them. [`Client::post`] mints
/// one for you when the request is built; the retries this crate makes
/// always reuse it.
///
/// Cloning is cheap (the text is shared).
///
/// [`Client::post`]: crate::Client::post
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// A fresh random key: a UUID version 4 in its hyphenated lower-case
    /// form, e.g. `1b4e28ba-2fa1-4d2e-883f-0016d3cca427`.
    pub fn mint() -> Self {
        let mut bytes: [u8; 16] = rand::random();
        // RFC 9562: version 4 in the high nibble of byte 6, variant 0b10 in
        // the top bits of byte 8.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        );
        Self(text.into())
    }

    /// A caller-chosen ("natural") key, e.g. `order-81:summary`, for an
    /// operation that has an identity of its own: every process that
    /// performs that operation then uses the same key, even one that never
    /// saw the first attempt.
    ///
    /// # Errors
    /// [`InvalidKey`] unless the key is 1 to [`MAX_KEY_LEN`] printable ASCII
    /// characters without a double quote and without leading or trailing
    /// spaces (what the gateway accepts as a bare key, with no room for a
    /// second reading).
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidKey::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(InvalidKey::TooLong { len: key.len() });
        }
        if let Some(position) = key.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
            return Err(InvalidKey::NotPrintable { position });
        }
        if let Some(position) = key.bytes().position(|b| b == b'"') {
            return Err(InvalidKey::Quote { position });
        }
        if key.starts_with(' ') || key.ends_with(' ') {
            return Err(InvalidKey::Padded);
        }
        Ok(Self(key.into()))
    }

    /// The key text, as sent in the `Idempotency-Key` header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey")
            .field(&self.as_str())
            .finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = InvalidKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

/// Why a natural key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The key is empty.
    #[error("idempotency key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("idempotency key is {len} bytes long; the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key holds a byte outside printable ASCII.
    #[error("idempotency key has a byte outside printable ASCII at position {position}")]
    NotPrintable {
        /// Offset of the first such byte.
        position: usize,
    },
    /// The key holds a double quote (the gateway would read a quoted key
    /// as a structured-field string).
    #[error("idempotency key has a double quote at position {position}")]
    Quote {
        /// Offset of the first quote.
        position: usize,
    },
    /// The key starts or ends with a space (header values are trimmed).
    #[error("idempotency key starts or ends with a space")]
    Padded,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_are_uuid_v4_and_distinct() {
        let a = IdempotencyKey::mint();
        let b = IdempotencyKey::mint();
        assert_ne!(a, b);
        let s = a.as_str();
        assert_eq!(s.len(), 36);
        let groups: Vec<&str> = s.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('4'), "version 4: {s}");
        assert!(
            matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "variant 10: {s}"
        );
        assert_eq!(IdempotencyKey::new(s).unwrap(), a);
    }

    #[test]
    fn natural_keys_are_validated() {
        assert_eq!(
            IdempotencyKey::new("order-81:summary").unwrap().as_str(),
            "order-81:summary"
        );
        assert_eq!(IdempotencyKey::new(""), Err(InvalidKey::Empty));
        assert_eq!(
            IdempotencyKey::new("x".repeat(256)),
            Err(InvalidKey::TooLong { len: 256 })
        );
        assert!(IdempotencyKey::new("x".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("caf\u{e9}"),
            Err(InvalidKey::NotPrintable { position: 3 })
        );
        assert_eq!(
            IdempotencyKey::new("a\nb"),
            Err(InvalidKey::NotPrintable { position: 1 })
        );
        assert_eq!(
            IdempotencyKey::new("\"k\""),
            Err(InvalidKey::Quote { position: 0 })
        );
        assert_eq!(IdempotencyKey::new(" k"), Err(InvalidKey::Padded));
        assert!("a b".parse::<IdempotencyKey>().is_ok());
    }
}
