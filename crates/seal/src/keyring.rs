//! The key ring: parsing key files, sealing and opening.

use std::fmt;
use std::io::Read;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, Generate, Payload};
use chacha20poly1305::{AeadInOut, KeyInit, XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

use crate::error::{GenerateKeyError, KeyFileError, SealError, SealErrorKind};
use crate::format::{self, KEY_LEN, NONCE_LEN, TAG_LEN, validate_key_id};

/// One key: its id and the cipher holding its bytes (zeroized on drop by
/// the `zeroize` feature of `chacha20poly1305`).
#[derive(Clone)]
struct Entry {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// Keys by id, one of them active: seals under the active key, opens
/// under whichever key the payload's header names.
///
/// Build one with [`KeyRing::from_file`] or [`KeyRing::parse`]; the
/// [crate docs](crate) describe the key file. `Debug` shows key ids only.
#[derive(Clone)]
pub struct KeyRing {
    active: Entry,
    /// Keys kept for opening only, in file order.
    others: Vec<Entry>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let others: Vec<&str> = self.others.iter().map(|e| e.id.as_str()).collect();
        f.debug_struct("KeyRing")
            .field("active", &self.active.id)
            .field("open_only", &others)
            .finish()
    }
}

impl KeyRing {
    /// Reads and parses a key file (see the [crate docs](crate) for the
    /// format).
    ///
    /// # Errors
    /// [`KeyFileError::Io`] when the file cannot be read or is not UTF-8;
    /// otherwise as [`KeyRing::parse`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyFileError> {
        let path = path.as_ref();
        let io = |source| KeyFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        // Size the buffer up front so reading does not leave reallocated,
        // un-zeroized copies of the key text behind.
        let size = file
            .metadata()
            .ok()
            .and_then(|m| usize::try_from(m.len()).ok())
            .unwrap_or(0);
        let mut text = Zeroizing::new(String::with_capacity(size.saturating_add(1)));
        file.read_to_string(&mut text).map_err(io)?;
        Self::parse(&text)
    }

    /// Parses key-file text (see the [crate docs](crate) for the format).
    ///
    /// # Errors
    /// A [`KeyFileError`] naming the first offending line and what is wrong
    /// with it, or saying that the file has no keys, two lines marked
    /// active, or several keys and none marked. Errors never contain key
    /// text.
    ///
    /// ```
    /// let ring = idemgate_seal::KeyRing::parse(
    ///     "# example keys: never use these\n\
    ///      2025-01:3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\
    ///      *2025-06:yv66vgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
    /// )?;
    /// assert_eq!(ring.active_key_id(), "2025-06");
    /// assert_eq!(ring.key_ids().collect::<Vec<_>>(), ["2025-06", "2025-01"]);
    /// assert_eq!(
    ///     format!("{ring:?}"),
    ///     r#"KeyRing { active: "2025-06", open_only: ["2025-01"] }"#
    /// );
    /// # Ok::<(), idemgate_seal::KeyFileError>(())
    /// ```
    pub fn parse(text: &str) -> Result<Self, KeyFileError> {
        struct Line {
            number: usize,
            active: bool,
            key: Zeroizing<Vec<u8>>,
            entry: Entry,
        }
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines: Vec<Line> = Vec::new();
        let mut active_line: Option<usize> = None;
        for (index, raw) in text.lines().enumerate() {
            let number = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (active, rest) = match line.strip_prefix('*') {
                Some(rest) => (true, rest.trim_start()),
                None => (false, line),
            };
            let (id, key_text) = rest
                .split_once(':')
                .ok_or(KeyFileError::MissingSeparator { line: number })?;
            let id = id.trim();
            validate_key_id(id).map_err(|reason| KeyFileError::InvalidKeyId {
                line: number,
                reason,
            })?;
            let key = Zeroizing::new(STANDARD.decode(key_text.trim()).map_err(|_| {
                KeyFileError::InvalidBase64 {
                    line: number,
                    id: id.to_owned(),
                }
            })?);
            let wrong_length = || KeyFileError::WrongKeyLength {
                line: number,
                id: id.to_owned(),
                len: key.len(),
            };
            if key.len() != KEY_LEN {
                return Err(wrong_length());
            }
            let cipher = XChaCha20Poly1305::new_from_slice(&key).map_err(|_| wrong_length())?;
            if let Some(first) = lines.iter().find(|l| l.entry.id == id) {
                return Err(KeyFileError::DuplicateKeyId {
                    line: number,
                    id: id.to_owned(),
                    first_line: first.number,
                });
            }
            if let Some(other) = lines.iter().find(|l| l.key == key) {
                return Err(KeyFileError::DuplicateKey {
                    line: number,
                    id: id.to_owned(),
                    other_line: other.number,
                    other_id: other.entry.id.clone(),
                });
            }
            if active {
                if let Some(first_line) = active_line {
                    return Err(KeyFileError::MultipleActiveKeys {
                        line: number,
                        first_line,
                    });
                }
                active_line = Some(number);
            }
            lines.push(Line {
                number,
                active,
                key,
                entry: Entry {
                    id: id.to_owned(),
                    cipher,
                },
            });
        }
        if lines.is_empty() {
            return Err(KeyFileError::NoKeys);
        }
        let mut active = None;
        let mut others = Vec::with_capacity(lines.len().saturating_sub(1));
        for line in lines {
            if line.active {
                active = Some(line.entry);
            } else {
                others.push(line.entry);
            }
        }
        let active = match active {
            Some(active) => active,
            // A single unmarked key: the file as `generate-encryption-key`
            // prints it, a first key. Never with two or more: a key added
            // beside the one in use must not become active unmarked.
            None if others.len() == 1 => others.remove(0),
            None => return Err(KeyFileError::NoActiveKey { keys: others.len() }),
        };
        Ok(Self { active, others })
    }

    /// The id of the key new payloads are sealed under.
    pub fn active_key_id(&self) -> &str {
        &self.active.id
    }

    /// Every key id in the ring, the active one first.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&self.active)
            .chain(&self.others)
            .map(|e| e.id.as_str())
    }

    fn entry(&self, id: &str) -> Option<&Entry> {
        std::iter::once(&self.active)
            .chain(&self.others)
            .find(|e| e.id == id)
    }

    /// Seals `plaintext` under the active key with a fresh random nonce,
    /// binding `ad` (the record's identity, see
    /// [`associated_data`](crate::associated_data)) and the header.
    ///
    /// The result is `version ‖ id length ‖ key id ‖ nonce ‖ ciphertext ‖
    /// tag`, `2 + id length + 24 + 16` bytes longer than `plaintext`.
    ///
    /// # Errors
    /// [`SealErrorKind::TooLarge`] for a plaintext past the cipher's
    /// per-message limit (about 256 GiB), [`SealErrorKind::Rng`] if the
    /// operating system's random number generator fails.
    pub fn seal(&self, ad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let id = &self.active.id;
        let nonce = XNonce::try_generate().map_err(|_| SealErrorKind::Rng)?;
        let header_len = 2 + id.len();
        let mut out = Vec::with_capacity(header_len + NONCE_LEN + plaintext.len() + TAG_LEN);
        format::write_header(&mut out, id);
        let aad = bound_ad(&out, ad);
        out.extend_from_slice(&nonce);
        let body_start = out.len();
        out.extend_from_slice(plaintext);
        let too_large = SealErrorKind::TooLarge {
            len: plaintext.len(),
        };
        let body = out.get_mut(body_start..).ok_or(too_large.clone())?;
        let tag = self
            .active
            .cipher
            .encrypt_inout_detached(&nonce, &aad, body.into())
            .map_err(|_| too_large)?;
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Opens a payload made by [`KeyRing::seal`] with the key its header
    /// names, checking it against `ad` and the header.
    ///
    /// # Errors
    /// - [`SealErrorKind::Malformed`]: not in the sealed format (too short,
    ///   unknown version, invalid key id).
    /// - [`SealErrorKind::UnknownKeyId`]: the named key is not in the ring.
    /// - [`SealErrorKind::Tampered`]: authentication failed (wrong key,
    ///   other associated data, modified bytes).
    pub fn open(&self, ad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let parsed = format::parse(sealed)?;
        let entry = self
            .entry(parsed.key_id)
            .ok_or_else(|| SealErrorKind::UnknownKeyId(parsed.key_id.to_owned()))?;
        let nonce = XNonce::try_from(parsed.nonce).map_err(|_| SealErrorKind::Tampered)?;
        let aad = bound_ad(parsed.header, ad);
        entry
            .cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: parsed.body,
                    aad: &aad,
                },
            )
            .map_err(|_| SealErrorKind::Tampered.into())
    }
}

/// The associated data the AEAD sees: the self-delimiting header, then the
/// caller's associated data.
fn bound_ad(header: &[u8], ad: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(header.len() + ad.len());
    aad.extend_from_slice(header);
    aad.extend_from_slice(ad);
    aad
}

/// A new key-file line `ID:BASE64KEY` with a fresh random 32-byte key from
/// the operating system's random number generator.
///
/// The line is not marked active. As a file's only key it is active
/// (`idemgate keys generate-encryption-key > keys` makes a working first
/// key file); added to a file that has keys already, it only opens records
/// until it is marked: prefix it with `*` (and remove the `*` from the
/// previous active line) to seal new records under it.
///
/// # Errors
/// [`GenerateKeyError::InvalidKeyId`] when `id` is not a valid key id,
/// [`GenerateKeyError::Rng`] if the random number generator fails.
pub fn generate_key_line(id: &str) -> Result<String, GenerateKeyError> {
    validate_key_id(id)?;
    let key = Zeroizing::new(<[u8; KEY_LEN]>::try_generate().map_err(|_| GenerateKeyError::Rng)?);
    let encoded = Zeroizing::new(STANDARD.encode(key.as_slice()));
    let mut line = String::with_capacity(id.len() + 1 + encoded.len());
    line.push_str(id);
    line.push(':');
    line.push_str(&encoded);
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring holding the same key bytes under two ids, which `parse`
    /// refuses: it shows that the header is bound into the associated data,
    /// since without that binding rewriting the id would still open.
    #[test]
    fn edited_key_id_fails_even_with_the_same_key_bytes() {
        let key = [7u8; KEY_LEN];
        let entry = |id: &str| Entry {
            id: id.to_owned(),
            cipher: XChaCha20Poly1305::new_from_slice(&key).expect("32-byte key"),
        };
        let ring = KeyRing {
            active: entry("ka"),
            others: vec![entry("kb")],
        };
        let sealed = ring.seal(b"ad", b"secret").expect("seal");
        assert_eq!(ring.open(b"ad", &sealed).expect("open"), b"secret");
        let mut edited = sealed.clone();
        edited[3] = b'b';
        assert_eq!(format::sealed_key_id(&edited), Ok("kb"));
        assert_eq!(
            ring.open(b"ad", &edited).map_err(|e| e.kind().clone()),
            Err(SealErrorKind::Tampered)
        );
    }
}
