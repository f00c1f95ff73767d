//! Unit tests of the parent module.

use super::*;

#[test]
fn a_records_keys_share_one_tag_free_of_user_text() {
    let client = idemgate_engine::ClientKey::parse("{evil}:key").unwrap();
    let key = ScopedKey::new("t}{", "n", client);
    let k = record_keys("idemgate", &key);
    let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
    for name in [&k.rec, &k.tl, &k.fence] {
        assert_eq!(name.matches(['{', '}']).count(), 2, "{name}");
        assert!(!name.contains("evil"));
        assert_eq!(tag(name), tag(&k.rec));
    }
    let other = ScopedKey::new("t}{", "n2", key.key.clone());
    assert_ne!(tag(&record_keys("idemgate", &other).rec), tag(&k.rec));
}

#[test]
fn a_hash_tag_is_the_storage_ids_digest_as_before() {
    // Records already in Redis are named by it: it must not change.
    let key = ScopedKey::new(
        "tenant",
        "ns",
        idemgate_engine::ClientKey::parse("k-1").unwrap(),
    );
    let digest = Sha256::digest(key.storage_id().as_bytes());
    assert_eq!(
        hash_tag(&key),
        format!("{{{}}}", hex::encode(&digest[..16]))
    );
    // `printf '6:tenant|2:ns|3:k-1' | sha256sum`, first 32 digits.
    assert_eq!(hash_tag(&key), "{a880ba71c5683ee523377522a44c6eaf}");
    let k = record_keys("pre", &key);
    assert_eq!(k.rec, format!("pre:{}:rec", hash_tag(&key)));
    assert_eq!(k.tl, format!("pre:{}:tl", hash_tag(&key)));
    assert_eq!(k.fence, format!("pre:{}:fence", hash_tag(&key)));
}
