//! The sealed byte layout, key-id rules, and the associated-data helper.

use crate::error::{KeyIdError, Malformed, SealError};

/// The format version byte this build writes and reads.
pub const FORMAT_VERSION: u8 = 1;
/// Longest key id, in bytes.
pub const MAX_KEY_ID_LEN: usize = 32;
/// Length of a key, in bytes.
pub const KEY_LEN: usize = 32;
/// Length of the XChaCha20 nonce, in bytes.
pub const NONCE_LEN: usize = 24;
/// Length of the Poly1305 tag, in bytes.
pub const TAG_LEN: usize = 16;

/// Checks that `id` is a key id: 1 to [`MAX_KEY_ID_LEN`] bytes of
/// `A-Z a-z 0-9 . _ -`.
///
/// # Errors
/// Says which rule the id breaks (without echoing it).
pub fn validate_key_id(id: &str) -> Result<(), KeyIdError> {
    if id.is_empty() {
        return Err(KeyIdError::Empty);
    }
    if id.len() > MAX_KEY_ID_LEN {
        return Err(KeyIdError::TooLong { len: id.len() });
    }
    match id
        .chars()
        .position(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(i) => Err(KeyIdError::BadChar { position: i + 1 }),
        None => Ok(()),
    }
}

/// Builds associated data from `parts`, unambiguously: each part is written
/// as its length (8 bytes, big-endian) followed by its bytes, so
/// `["ab", "c"]` and `["a", "bc"]` give different results, and so do
/// `["a"]` and `["a", ""]`.
///
/// Pass the record's whole identity, most general first, and start with a
/// fixed label naming what is sealed, so the same identity used for
/// another kind of value cannot be confused with it:
///
/// ```
/// let ad = idemgate_seal::associated_data([
///     "idemgate/response/v1".as_bytes(),
///     b"tenant-a",
///     b"openai/chat",
///     b"key-123",
///     b"fingerprint-hex",
/// ]);
/// assert_ne!(
///     idemgate_seal::associated_data(["ab", "c"]),
///     idemgate_seal::associated_data(["a", "bc"]),
/// );
/// # let _ = ad;
/// ```
pub fn associated_data<I, P>(parts: I) -> Vec<u8>
where
    I: IntoIterator<Item = P>,
    P: AsRef<[u8]>,
{
    let mut out = Vec::new();
    for part in parts {
        let part = part.as_ref();
        // usize is at most 64 bits on every target Rust supports.
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// Writes the header that is both stored and bound into the AEAD's
/// associated data: version byte, key-id length byte, key id.
///
/// `id` must already be valid (it comes from a parsed key ring).
pub(crate) fn write_header(out: &mut Vec<u8>, id: &str) {
    out.push(FORMAT_VERSION);
    // A valid id is at most MAX_KEY_ID_LEN (32) bytes, so this never saturates.
    out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(id.as_bytes());
}

/// The parts of a sealed payload.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    /// Version byte, id length and id: bound into the associated data.
    pub(crate) header: &'a [u8],
    /// The key id named by the header.
    pub(crate) key_id: &'a str,
    /// The 24-byte nonce.
    pub(crate) nonce: &'a [u8],
    /// Ciphertext followed by the 16-byte tag (at least `TAG_LEN` bytes).
    pub(crate) body: &'a [u8],
}

/// Splits a sealed payload into its parts, checking only its shape.
pub(crate) fn parse(sealed: &[u8]) -> Result<Parsed<'_>, SealError> {
    let too_short = Malformed::TooShort { len: sealed.len() };
    let (&version, rest) = sealed.split_first().ok_or(too_short)?;
    if version != FORMAT_VERSION {
        return Err(Malformed::UnsupportedVersion(version).into());
    }
    let (&id_len, rest) = rest.split_first().ok_or(too_short)?;
    let id_len = usize::from(id_len);
    if id_len == 0 || id_len > MAX_KEY_ID_LEN {
        return Err(Malformed::BadKeyId.into());
    }
    let (id, rest) = rest.split_at_checked(id_len).ok_or(too_short)?;
    let key_id = std::str::from_utf8(id).map_err(|_| Malformed::BadKeyId)?;
    validate_key_id(key_id).map_err(|_| Malformed::BadKeyId)?;
    let (nonce, body) = rest.split_at_checked(NONCE_LEN).ok_or(too_short)?;
    if body.len() < TAG_LEN {
        return Err(too_short.into());
    }
    let header = sealed.get(..2 + id_len).ok_or(too_short)?;
    Ok(Parsed {
        header,
        key_id,
        nonce,
        body,
    })
}

/// The key id a sealed payload names, read from its header without
/// opening it (to count records still sealed under an old key, say).
///
/// # Errors
/// [`SealErrorKind::Malformed`](crate::SealErrorKind::Malformed) when the
/// payload is not in the sealed format.
pub fn sealed_key_id(sealed: &[u8]) -> Result<&str, SealError> {
    parse(sealed).map(|p| p.key_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_rules() {
        assert_eq!(validate_key_id("k1"), Ok(()));
        assert_eq!(validate_key_id("2025-06.prod_a"), Ok(()));
        assert_eq!(validate_key_id(&"a".repeat(32)), Ok(()));
        assert_eq!(validate_key_id(""), Err(KeyIdError::Empty));
        assert_eq!(
            validate_key_id(&"a".repeat(33)),
            Err(KeyIdError::TooLong { len: 33 })
        );
        assert_eq!(
            validate_key_id("ab c"),
            Err(KeyIdError::BadChar { position: 3 })
        );
        assert_eq!(
            validate_key_id("é"),
            Err(KeyIdError::BadChar { position: 1 })
        );
        assert!(validate_key_id("a:b").is_err());
        assert!(validate_key_id("*a").is_err());
    }

    #[test]
    fn associated_data_is_unambiguous() {
        assert_ne!(associated_data(["ab", "c"]), associated_data(["a", "bc"]));
        assert_ne!(associated_data(["a"]), associated_data(["a", ""]));
        assert_ne!(associated_data(["", "a"]), associated_data(["a", ""]));
        assert_eq!(associated_data(Vec::<&[u8]>::new()), Vec::<u8>::new());
        assert_eq!(
            associated_data(["ab"]),
            [0, 0, 0, 0, 0, 0, 0, 2, b'a', b'b']
        );
    }
}
