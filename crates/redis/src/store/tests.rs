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
