//! Errors of sealing, opening, key-file parsing and key generation.
//!
//! No message here ever contains key material or plaintext: key ids (which
//! are validated, short ASCII and not secret), line numbers and lengths are
//! the only data they carry.

use std::path::PathBuf;

/// Why [`KeyRing::seal`](crate::KeyRing::seal) or
/// [`KeyRing::open`](crate::KeyRing::open) failed; see [`SealError::kind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct SealError {
    kind: SealErrorKind,
}

impl SealError {
    /// What went wrong.
    pub fn kind(&self) -> &SealErrorKind {
        &self.kind
    }
}

impl From<SealErrorKind> for SealError {
    fn from(kind: SealErrorKind) -> Self {
        Self { kind }
    }
}

impl From<Malformed> for SealError {
    fn from(reason: Malformed) -> Self {
        Self {
            kind: SealErrorKind::Malformed(reason),
        }
    }
}

/// The kinds of [`SealError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealErrorKind {
    /// The payload was sealed under a key id that is not in the ring: the
    /// key was removed while records sealed under it were still live, or
    /// the payload comes from another deployment.
    #[error(
        "sealed under key id `{0}`, which is not in the key ring (removed before its records expired?)"
    )]
    UnknownKeyId(String),
    /// Authentication failed: the key is wrong, the associated data (the
    /// record's identity) differs from the one it was sealed with, or bytes
    /// were modified.
    #[error(
        "sealed payload failed authentication: wrong key, different record identity, or modified bytes"
    )]
    Tampered,
    /// The payload is not in the sealed format at all.
    #[error("sealed payload is malformed: {0}")]
    Malformed(Malformed),
    /// The plaintext is longer than XChaCha20-Poly1305 can seal in one
    /// message (about 256 GiB).
    #[error("plaintext of {len} bytes exceeds the XChaCha20-Poly1305 per-message limit")]
    TooLarge {
        /// Length of the refused plaintext.
        len: usize,
    },
    /// The operating system's random number generator failed to produce a
    /// nonce.
    #[error("the operating system's random number generator failed")]
    Rng,
}

/// Why a payload is [`SealErrorKind::Malformed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// The payload ends before its header, nonce and tag are complete.
    #[error("{len} bytes is shorter than its header, nonce and tag")]
    TooShort {
        /// Length of the payload.
        len: usize,
    },
    /// The first byte is not a format version this crate knows.
    #[error("unsupported format version {0} (this build reads version {v})", v = crate::FORMAT_VERSION)]
    UnsupportedVersion(u8),
    /// The key id in the header is empty, too long or has a character
    /// outside `A-Z a-z 0-9 . _ -`.
    #[error("the key id in the header is not a valid key id")]
    BadKeyId,
}

/// Why a key id is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyIdError {
    /// The id is empty.
    #[error("key id is empty")]
    Empty,
    /// The id is longer than [`MAX_KEY_ID_LEN`](crate::MAX_KEY_ID_LEN).
    #[error("key id is {len} bytes long; the limit is {max}", max = crate::MAX_KEY_ID_LEN)]
    TooLong {
        /// Length of the refused id.
        len: usize,
    },
    /// The id has a character outside `A-Z a-z 0-9 . _ -`.
    #[error("key id character {position} is not allowed (allowed: A-Z a-z 0-9 . _ -)")]
    BadChar {
        /// 1-based position of the first refused character.
        position: usize,
    },
}

/// Why a key file was refused by [`KeyRing::parse`](crate::KeyRing::parse)
/// or [`KeyRing::from_file`](crate::KeyRing::from_file).
///
/// Line numbers are 1-based. Messages name lines and key ids, never key
/// text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    #[error("cannot read key file {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// A key line has no `:` between id and key.
    #[error("key file line {line}: expected `ID:BASE64KEY` (with a leading `*` on the active key)")]
    MissingSeparator {
        /// The line.
        line: usize,
    },
    /// A key line's id is not a valid key id.
    #[error("key file line {line}: {reason}")]
    InvalidKeyId {
        /// The line.
        line: usize,
        /// What is wrong with the id.
        reason: KeyIdError,
    },
    /// A key is not standard base64.
    #[error(
        "key file line {line}: key `{id}` is not valid standard base64 (alphabet A-Z a-z 0-9 + / with `=` padding)"
    )]
    InvalidBase64 {
        /// The line.
        line: usize,
        /// The key's id.
        id: String,
    },
    /// A key does not decode to 32 bytes.
    #[error(
        "key file line {line}: key `{id}` decodes to {len} bytes; keys must be exactly 32 bytes"
    )]
    WrongKeyLength {
        /// The line.
        line: usize,
        /// The key's id.
        id: String,
        /// Length of the decoded key.
        len: usize,
    },
    /// Two lines use the same key id.
    #[error("key file line {line}: key id `{id}` is already used on line {first_line}")]
    DuplicateKeyId {
        /// The later line.
        line: usize,
        /// The id.
        id: String,
        /// The earlier line.
        first_line: usize,
    },
    /// Two ids carry the same key bytes (a copied line, not a new key).
    #[error(
        "key file line {line}: key `{id}` has the same key bytes as `{other_id}` on line {other_line}; every key id needs its own freshly generated key"
    )]
    DuplicateKey {
        /// The later line.
        line: usize,
        /// The later line's id.
        id: String,
        /// The earlier line.
        other_line: usize,
        /// The earlier line's id.
        other_id: String,
    },
    /// More than one line is marked active.
    #[error(
        "key file line {line}: a second active key (`*`); line {first_line} is already active, exactly one line may start with `*`"
    )]
    MultipleActiveKeys {
        /// The later line.
        line: usize,
        /// The line marked active first.
        first_line: usize,
    },
    /// Several keys and none marked active. (A file with one key and no
    /// `*` has that key active.) A key added for a rotation never becomes
    /// active by being added, so the file's keys say nothing of which one
    /// is in use until one is marked.
    #[error(
        "key file has {keys} keys and none is marked active: start the line of the key new records are sealed under with `*` (a key added for a rotation is not active until marked)"
    )]
    NoActiveKey {
        /// How many keys the file lists.
        keys: usize,
    },
    /// The file has no key lines at all.
    #[error("key file has no keys (only blank lines and comments)")]
    NoKeys,
}

/// Why [`generate_key_line`](crate::generate_key_line) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateKeyError {
    /// The id is not a valid key id.
    #[error(transparent)]
    InvalidKeyId(#[from] KeyIdError),
    /// The operating system's random number generator failed.
    #[error("the operating system's random number generator failed")]
    Rng,
}
