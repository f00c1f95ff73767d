//! Sealing of stored LLM answers: authenticated encryption of records at
//! rest, with a key ring for rotation.
//!
//! The answers idemgate stores for replay (status, headers, body, SSE
//! events) are as sensitive as the prompts that produced them. Every store
//! (SQLite, Redis, PostgreSQL) receives them only as *sealed* bytes made by
//! [`KeyRing::seal`], and replay gets them back through [`KeyRing::open`].
//! A store operator, a backup or a stolen dump sees neither the answers nor
//! a way to alter them unnoticed.
//!
//! ```
//! use idemgate_seal::{KeyRing, SealErrorKind, associated_data, generate_key_line};
//!
//! let ring = KeyRing::parse(&format!("*{}", generate_key_line("2025-06")?))?;
//! let ad = associated_data(["idemgate/response/v1", "tenant-a", "chat", "key-1", "fp"]);
//! let sealed = ring.seal(&ad, b"{\"answer\":42}")?;
//! assert_eq!(ring.open(&ad, &sealed)?, b"{\"answer\":42}");
//!
//! // The same bytes under another record's identity do not open.
//! let other = associated_data(["idemgate/response/v1", "tenant-b", "chat", "key-1", "fp"]);
//! let err = ring.open(&other, &sealed).unwrap_err();
//! assert_eq!(err.kind(), &SealErrorKind::Tampered);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cipher: XChaCha20-Poly1305 with random nonces
//!
//! Each payload is sealed with XChaCha20-Poly1305 under a fresh nonce drawn
//! from the operating system's random number generator. Its nonce is 192
//! bits long, so random nonces never realistically collide, whatever the
//! volume and however many processes share a key: no counter has to be
//! kept or coordinated across gateway replicas. (With the 96-bit nonce of
//! plain ChaCha20-Poly1305 or AES-GCM, random nonces are only safe for
//! about 2³² messages per key; a repeated nonce there leaks plaintext and
//! allows forgeries.)
//!
//! # Associated data binds the record's identity
//!
//! The caller passes associated data (AD) naming the record: tenant,
//! route or namespace, idempotency key, request fingerprint. Build it with
//! [`associated_data`], which length-prefixes every part so that no two
//! different identities give the same bytes. The AD is not stored; it is
//! authenticated. A sealed answer copied under another tenant's or another
//! key's record (by someone with write access to the store) therefore
//! fails to open with [`SealErrorKind::Tampered`] instead of being
//! replayed to the wrong client.
//!
//! The header (format version and key id) is bound into the AD as well, so
//! editing the key id or the version of a stored payload also makes it
//! fail to open.
//!
//! # Sealed format
//!
//! ```text
//! offset  size  field
//! 0       1     format version, 0x01
//! 1       1     key id length n, 1..=32
//! 2       n     key id, ASCII A-Z a-z 0-9 . _ -
//! 2+n     24    XChaCha20 nonce (random)
//! 26+n    *     ciphertext, as long as the plaintext
//! end-16  16    Poly1305 tag
//! ```
//!
//! The AEAD's associated data is `bytes[0 .. 2+n] ‖ caller AD`. A payload is
//! `2 + n + 40` bytes longer than its plaintext. [`sealed_key_id`] reads the
//! key id without opening. Opening picks the key by this id; it never tries
//! keys one after another.
//!
//! # Key file
//!
//! ```text
//! # idemgate encryption keys: one key per line, ID:BASE64KEY.
//! # The line starting with `*` is the active key: new records are sealed
//! # under it. Every key listed opens the records sealed under it.
//! 2025-01:3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
//! *2025-06:yv66vgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
//! ```
//!
//! - One key per line: `ID:BASE64KEY`. The id is 1 to 32 characters of
//!   `A-Z a-z 0-9 . _ -`; the key is 32 bytes in standard base64
//!   (`A-Z a-z 0-9 + /`, with `=` padding: 44 characters).
//! - The line starting with `*` is active. Its position in the file does
//!   not matter. A file with two such lines is refused.
//! - A file with a single key and no `*` has that key active: the first
//!   key file is the line [`generate_key_line`] (and
//!   `idemgate keys generate-encryption-key`) prints, as it is. A file
//!   with two or more keys and no `*` is refused: a key added beside the
//!   one in use never becomes active by being added (the first step of a
//!   rotation), and which of several keys is in use is never guessed.
//! - Lines whose first non-blank character is `#` are comments; blank lines
//!   are ignored; whitespace around a line, around the `*`, and around the
//!   `:` is ignored.
//! - Ids must be unique, and so must keys: a line copied under a new id is
//!   refused, since it would look like a rotation without being one.
//! - Errors name the line number and what is wrong, never the key text.
//!   Keep the file readable by the gateway's user only (`chmod 600`).
//!
//! [`generate_key_line`] makes a new line with a random key (it is not
//! marked active: it is active only as the file's one key).
//!
//! # Rotating keys
//!
//! Add the new key everywhere first (unmarked), then mark it active, then
//! remove the old one once every record sealed under it has expired; a
//! record still sealed under a removed key fails with
//! [`SealErrorKind::UnknownKeyId`]. The steps, with the commands, are in
//! the README's "Encryption at rest" section
//! (<https://github.com/idemgate/idemgate#encryption-at-rest>).
//!
//! # Key material in memory
//!
//! Keys live only inside the ciphers, which zeroize them on drop; decoded
//! key bytes and the text read by [`KeyRing::from_file`] are zeroized after
//! parsing. `Debug` for [`KeyRing`] shows key ids and which is active, no
//! key bytes. No error message contains key material or plaintext.
//!
//! # Layout
//! - `keyring`: [`KeyRing`]: parsing key files, sealing and opening.
//! - `format`: the sealed byte layout, key-id rules and
//!   [`associated_data`].
//! - `error`: the errors of sealing, opening, parsing and generation.
//! - [`store`]: [`SealedStore`], the `Store` wrapper
//!   that seals every payload before the backend sees it; its `retain`
//!   submodule keeps the sealed bytes a retried `complete` needs, for
//!   seconds ([`store::RETRY_WINDOW`]).

mod error;
mod format;
mod keyring;
pub mod store;

pub use error::{GenerateKeyError, KeyFileError, KeyIdError, Malformed, SealError, SealErrorKind};
pub use format::{
    FORMAT_VERSION, KEY_LEN, MAX_KEY_ID_LEN, NONCE_LEN, TAG_LEN, associated_data, sealed_key_id,
    validate_key_id,
};
pub use keyring::{KeyRing, generate_key_line};
pub use store::SealedStore;
