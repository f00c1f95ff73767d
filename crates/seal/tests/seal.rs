//! Sealing and opening: round trips, identity binding, tampering,
//! truncation, rotation.

use idemgate_seal::{
    FORMAT_VERSION, KeyRing, Malformed, NONCE_LEN, SealError, SealErrorKind, TAG_LEN,
    associated_data, generate_key_line, sealed_key_id,
};
use proptest::prelude::*;

const KEY_A: &str = "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
const KEY_B: &str = "yv66vgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

fn ring(text: &str) -> KeyRing {
    KeyRing::parse(text).expect("valid key file")
}

fn ring_a() -> KeyRing {
    ring(&format!("*ka:{KEY_A}"))
}

fn identity(tenant: &str, route: &str, key: &str, fingerprint: &str) -> Vec<u8> {
    associated_data(["idemgate/response/v1", tenant, route, key, fingerprint])
}

fn kind(result: Result<Vec<u8>, SealError>) -> SealErrorKind {
    result.expect_err("must not open").kind().clone()
}

#[test]
fn round_trip() {
    let ring = ring_a();
    let ad = identity("t1", "chat", "k-1", "fp");
    for plaintext in [
        &b""[..],
        b"x",
        b"{\"status\":200,\"body\":\"hello\"}",
        &[0u8; 5000],
    ] {
        let sealed = ring.seal(&ad, plaintext).expect("seal");
        assert_eq!(ring.open(&ad, &sealed).expect("open"), plaintext);
    }
    let sealed = ring.seal(b"", b"no ad").expect("seal");
    assert_eq!(ring.open(b"", &sealed).expect("open"), b"no ad");
}

#[test]
fn layout_is_version_key_id_nonce_ciphertext_tag() {
    let ring = ring_a();
    let plaintext = b"hello";
    let sealed = ring.seal(b"ad", plaintext).expect("seal");
    assert_eq!(sealed[0], FORMAT_VERSION);
    assert_eq!(sealed[1], 2);
    assert_eq!(&sealed[2..4], b"ka");
    assert_eq!(sealed.len(), 4 + NONCE_LEN + plaintext.len() + TAG_LEN);
    assert_eq!(sealed_key_id(&sealed), Ok("ka"));
    assert!(
        !sealed.windows(plaintext.len()).any(|w| w == plaintext),
        "plaintext must not appear in the sealed bytes"
    );
}

#[test]
fn each_seal_uses_a_fresh_nonce() {
    let ring = ring_a();
    let one = ring.seal(b"ad", b"same").expect("seal");
    let two = ring.seal(b"ad", b"same").expect("seal");
    assert_ne!(one[4..4 + NONCE_LEN], two[4..4 + NONCE_LEN]);
    assert_ne!(one, two);
}

#[test]
fn wrong_ad_fails() {
    let ring = ring_a();
    let sealed = ring.seal(b"right", b"secret").expect("seal");
    assert_eq!(kind(ring.open(b"wrong", &sealed)), SealErrorKind::Tampered);
    assert_eq!(kind(ring.open(b"", &sealed)), SealErrorKind::Tampered);
    assert_eq!(kind(ring.open(b"righ", &sealed)), SealErrorKind::Tampered);
    assert_eq!(
        kind(ring.open(b"right\0", &sealed)),
        SealErrorKind::Tampered
    );
}

#[test]
fn copied_under_another_identity_fails() {
    let ring = ring_a();
    let original = identity("tenant-a", "chat", "key-1", "fp-1");
    let sealed = ring.seal(&original, b"tenant a's answer").expect("seal");
    for other in [
        identity("tenant-b", "chat", "key-1", "fp-1"),
        identity("tenant-a", "embeddings", "key-1", "fp-1"),
        identity("tenant-a", "chat", "key-2", "fp-1"),
        identity("tenant-a", "chat", "key-1", "fp-2"),
        // The same characters split differently between the parts.
        identity("tenant-ac", "hat", "key-1", "fp-1"),
        associated_data(["idemgate/response/v1", "tenant-a", "chat", "key-1"]),
    ] {
        assert_eq!(kind(ring.open(&other, &sealed)), SealErrorKind::Tampered);
    }
    assert_eq!(
        ring.open(&original, &sealed).expect("open"),
        b"tenant a's answer"
    );
}

#[test]
fn edited_key_id_fails() {
    let ring = ring(&format!("*ka:{KEY_A}\nkb:{KEY_B}"));
    let sealed = ring.seal(b"ad", b"secret").expect("seal");

    // Renamed to an id in the ring: the header is authenticated.
    let mut to_known = sealed.clone();
    to_known[3] = b'b';
    assert_eq!(sealed_key_id(&to_known), Ok("kb"));
    assert_eq!(kind(ring.open(b"ad", &to_known)), SealErrorKind::Tampered);

    // Renamed to an id not in the ring: no key to try.
    let mut to_unknown = sealed.clone();
    to_unknown[3] = b'z';
    assert_eq!(
        kind(ring.open(b"ad", &to_unknown)),
        SealErrorKind::UnknownKeyId("kz".to_owned())
    );

    // Renamed to something that is no key id at all.
    let mut to_invalid = sealed.clone();
    to_invalid[3] = b':';
    assert_eq!(
        kind(ring.open(b"ad", &to_invalid)),
        SealErrorKind::Malformed(Malformed::BadKeyId)
    );

    // Length byte edited.
    let mut to_shorter = sealed.clone();
    to_shorter[1] = 1;
    assert!(ring.open(b"ad", &to_shorter).is_err());
    let mut to_zero = sealed;
    to_zero[1] = 0;
    assert_eq!(
        kind(ring.open(b"ad", &to_zero)),
        SealErrorKind::Malformed(Malformed::BadKeyId)
    );
}

#[test]
fn other_version_is_malformed() {
    let ring = ring_a();
    let mut sealed = ring.seal(b"ad", b"secret").expect("seal");
    sealed[0] = 2;
    let err = ring.open(b"ad", &sealed).expect_err("must not open");
    assert_eq!(
        err.kind(),
        &SealErrorKind::Malformed(Malformed::UnsupportedVersion(2))
    );
    assert_eq!(
        err.to_string(),
        "sealed payload is malformed: unsupported format version 2 (this build reads version 1)"
    );
}

#[test]
fn same_id_with_another_key_fails() {
    let sealed = ring(&format!("*k:{KEY_A}"))
        .seal(b"ad", b"secret")
        .expect("seal");
    let other = ring(&format!("*k:{KEY_B}"));
    assert_eq!(kind(other.open(b"ad", &sealed)), SealErrorKind::Tampered);
}

#[test]
fn every_single_bit_flip_fails() {
    let ring = ring(&format!("*ka:{KEY_A}\nkb:{KEY_B}"));
    let sealed = ring.seal(b"ad", b"a short answer").expect("seal");
    for byte in 0..sealed.len() {
        for bit in 0..8 {
            let mut flipped = sealed.clone();
            flipped[byte] ^= 1 << bit;
            assert!(
                ring.open(b"ad", &flipped).is_err(),
                "flip of bit {bit} in byte {byte} opened"
            );
        }
    }
}

#[test]
fn every_truncation_and_extension_fails() {
    let ring = ring_a();
    let sealed = ring.seal(b"ad", b"a short answer").expect("seal");
    for len in 0..sealed.len() {
        assert!(
            ring.open(b"ad", &sealed[..len]).is_err(),
            "prefix {len} opened"
        );
    }
    // Too short for the tag is Malformed, not Tampered.
    let min = 4 + NONCE_LEN + TAG_LEN;
    for len in 0..min {
        assert!(matches!(
            kind(ring.open(b"ad", &sealed[..len])),
            SealErrorKind::Malformed(_)
        ));
    }
    assert_eq!(
        kind(ring.open(b"ad", &sealed[..min - 1])),
        SealErrorKind::Malformed(Malformed::TooShort { len: min - 1 })
    );
    let mut longer = sealed.clone();
    longer.push(0);
    assert_eq!(kind(ring.open(b"ad", &longer)), SealErrorKind::Tampered);
}

#[test]
fn rotation() {
    let line_a = generate_key_line("key-a").expect("line");
    let line_b = generate_key_line("key-b").expect("line");
    let ad = identity("t", "chat", "k", "fp");

    // Only A, active.
    let before = ring(&format!("*{line_a}\n"));
    let old = before.seal(&ad, b"old record").expect("seal");
    assert_eq!(sealed_key_id(&old), Ok("key-a"));

    // B added and made active; A kept for opening.
    let during = ring(&format!("{line_a}\n*{line_b}\n"));
    assert_eq!(during.active_key_id(), "key-b");
    assert_eq!(during.open(&ad, &old).expect("old opens"), b"old record");
    let new = during.seal(&ad, b"new record").expect("seal");
    assert_eq!(sealed_key_id(&new), Ok("key-b"));
    assert_eq!(during.open(&ad, &new).expect("new opens"), b"new record");

    // A removed once its records expired.
    let after = ring(&format!("*{line_b}\n"));
    assert_eq!(after.open(&ad, &new).expect("new opens"), b"new record");
    let err = after.open(&ad, &old).expect_err("old key removed");
    assert_eq!(err.kind(), &SealErrorKind::UnknownKeyId("key-a".to_owned()));
    assert_eq!(
        err.to_string(),
        "sealed under key id `key-a`, which is not in the key ring (removed before its records expired?)"
    );
}

#[test]
fn error_messages_hold_no_plaintext_or_key() {
    let ring = ring_a();
    let plaintext = b"PLAINTEXT-MARKER";
    let mut sealed = ring.seal(b"ad", plaintext).expect("seal");
    let mut messages = vec![ring.open(b"other", &sealed).expect_err("ad").to_string()];
    sealed[0] = 9;
    messages.push(ring.open(b"ad", &sealed).expect_err("version").to_string());
    messages.push(
        ring.open(b"ad", &sealed[..3])
            .expect_err("short")
            .to_string(),
    );
    for message in messages {
        assert!(!message.contains("PLAINTEXT"), "{message}");
        assert!(!message.contains(KEY_A), "{message}");
    }
}

/// A sealed payload's header for key id `ka`, to aim random bytes past the
/// shape checks at authentication.
fn header_ka() -> Vec<u8> {
    vec![FORMAT_VERSION, 2, b'k', b'a']
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_round_trip(
        ad in proptest::collection::vec(any::<u8>(), 0..64),
        plaintext in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let ring = ring_a();
        let sealed = ring.seal(&ad, &plaintext).expect("seal");
        prop_assert_eq!(ring.open(&ad, &sealed).expect("open"), plaintext);
    }

    #[test]
    fn prop_single_bit_flip_fails(
        ad in proptest::collection::vec(any::<u8>(), 0..64),
        plaintext in proptest::collection::vec(any::<u8>(), 0..256),
        position in any::<proptest::sample::Index>(),
        bit in 0u8..8,
    ) {
        let ring = ring(&format!("*ka:{KEY_A}\nkb:{KEY_B}"));
        let mut sealed = ring.seal(&ad, &plaintext).expect("seal");
        let byte = position.index(sealed.len());
        sealed[byte] ^= 1 << bit;
        prop_assert!(ring.open(&ad, &sealed).is_err());
    }

    #[test]
    fn prop_truncation_fails(
        plaintext in proptest::collection::vec(any::<u8>(), 0..256),
        cut in any::<proptest::sample::Index>(),
    ) {
        let ring = ring_a();
        let sealed = ring.seal(b"ad", &plaintext).expect("seal");
        let len = cut.index(sealed.len());
        prop_assert!(ring.open(b"ad", &sealed[..len]).is_err());
    }

    #[test]
    fn prop_random_bytes_never_open(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ad in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let ring = ring_a();
        prop_assert!(ring.open(&ad, &bytes).is_err());
        let _ = sealed_key_id(&bytes);
    }

    #[test]
    fn prop_random_body_after_valid_header_is_tampered(
        body in proptest::collection::vec(any::<u8>(), NONCE_LEN + TAG_LEN..256),
    ) {
        let ring = ring_a();
        let mut bytes = header_ka();
        bytes.extend_from_slice(&body);
        prop_assert_eq!(kind(ring.open(b"ad", &bytes)), SealErrorKind::Tampered);
    }
}

#[test]
fn shareable_across_tasks() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    shareable::<KeyRing>();
    error::<SealError>();
    error::<idemgate_seal::KeyFileError>();
    error::<idemgate_seal::GenerateKeyError>();
}
