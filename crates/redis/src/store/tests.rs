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

/// A record's value as the scripts write it.
fn value(state: u8, fence: u64, exp: u64, attempt: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = vec![state];
    v.extend_from_slice(&[7; 32]);
    v.extend_from_slice(format!("{:032x}", 0xabc_u128).as_bytes());
    v.extend_from_slice(fence_arg(fence).as_bytes());
    v.extend_from_slice(format!("{exp:020}").as_bytes());
    v.extend_from_slice(format!("{}:", attempt.len()).as_bytes());
    v.extend_from_slice(attempt);
    v.extend_from_slice(body);
    v
}

#[test]
fn a_record_value_decodes_to_its_state_fence_expiry_and_payload() {
    let pending = decode_record(value(b'P', 1_733_000_000_123_456, 42, b"", b"")).unwrap();
    assert_eq!(pending.fingerprint, Fingerprint::from_bytes([7; 32]));
    assert_eq!(
        pending.state,
        RecordState::Pending {
            fence: 1_733_000_000_123_456,
            lease_expires_at_ms: 42
        }
    );
    // The attempt is skipped whatever it holds, `:` included.
    let done = decode_record(value(b'D', 9, 1_800_000_000_000, b"{\"a\":1}", b"body:1")).unwrap();
    assert_eq!(
        done.state,
        RecordState::Done {
            payload: Bytes::from_static(b"body:1"),
            expires_at_ms: 1_800_000_000_000
        }
    );
    let empty = decode_record(value(b'D', 9, 1, b"", b"")).unwrap();
    assert!(matches!(empty.state, RecordState::Done { payload, .. } if payload.is_empty()));
    assert_eq!(fence_arg(u64::MAX).len(), 20, "every fence fits the field");
}

#[test]
fn a_damaged_record_value_is_a_corrupt_error_not_a_panic() {
    let good = value(b'D', 9, 1, b"att", b"body");
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("cut in the header", good[..60].to_vec()),
        ("cut before the attempt length", good[..HEADER].to_vec()),
        ("no attempt length", good[..HEADER + 1].to_vec()),
        (
            "attempt past the end",
            value(b'D', 9, 1, b"att", b"")[..HEADER + 4].to_vec(),
        ),
    ];
    let mut state = good.clone();
    state[0] = b'X';
    cases.push(("unknown state", state));
    let mut fence = good.clone();
    fence[70] = b'x';
    cases.push(("fence not digits", fence));
    let mut length = good.clone();
    length[HEADER] = b'-';
    cases.push(("attempt length not digits", length));
    let mut huge = good[..HEADER].to_vec();
    huge.extend_from_slice(b"99999999999999999999999:");
    cases.push(("attempt length beyond usize", huge));
    for (what, raw) in cases {
        let e = decode_record(raw).expect_err(what);
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: {e}");
    }
    assert!(record_value(Value::Int(3)).is_err());
    assert_eq!(record_value(Value::Nil).unwrap(), None);
}

/// A timeline entry of `outcome`, now.
fn entry(outcome: idemgate_engine::AttemptOutcome) -> Attempt {
    Attempt {
        at_ms: idemgate_engine::backend::now_ms(),
        replica: "unit".into(),
        outcome,
        status: None,
        latency_us: 1,
        repeated: None,
    }
}

/// The shared Redis of the test suites, under a prefix of this test's own.
async fn shared_redis() -> RedisStore {
    let opts = RedisOptions::default()
        .prefix(format!("igunit{:08x}", rand::random::<u32>()))
        .fence_memory(Duration::from_secs(60));
    match RedisStore::connect_with("redis://127.0.0.1:6379", opts).await {
        Ok(store) => store,
        Err(e) => {
            idemgate_testkit::require(&format!("Redis at 127.0.0.1:6379 ({e})"), false);
            unreachable!()
        }
    }
}

/// A claim re-sent with its token after the reply was lost (as the cluster
/// client re-sends a call that timed out) gets its own lease back, never
/// its own record as someone else's.
#[tokio::test]
async fn a_claim_sent_again_with_its_token_gets_its_lease_back() {
    let store = shared_redis().await;
    let key = idemgate_testkit::fresh_key();
    let fp = Fingerprint::from_bytes([3; 32]);
    let ttl = Duration::from_secs(30);
    let token = idemgate_engine::Lease::new_token();
    let Claim::Acquired(first) = store.claim_as(&key, &fp, ttl, token).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let Claim::Acquired(again) = store.claim_as(&key, &fp, ttl, token).await.unwrap() else {
        panic!("the same claim sent again was read as someone else's");
    };
    assert_eq!(again, first, "the same lease, fence and expiry");
    // Another token (another request) still finds the key taken.
    let other = store.claim_as(&key, &fp, ttl, token ^ 1).await.unwrap();
    assert!(matches!(other, Claim::Existing(_)), "{other:?}");
    // As does the same token with another fingerprint.
    let other = store
        .claim_as(&key, &Fingerprint::from_bytes([4; 32]), ttl, token)
        .await
        .unwrap();
    assert!(matches!(other, Claim::Existing(_)), "{other:?}");
    let attempt = entry(idemgate_engine::AttemptOutcome::Executed);
    assert_eq!(
        store
            .complete(&first, Bytes::from_static(b"done"), ttl, &attempt)
            .await
            .unwrap(),
        Fenced::Applied
    );
}

/// A forget sent again after its reply was lost answers as the first one
/// did: there was a record.
#[tokio::test]
async fn a_forget_sent_again_answers_as_the_first() {
    let store = shared_redis().await;
    let key = idemgate_testkit::fresh_key();
    let ttl = Duration::from_secs(30);
    let Claim::Acquired(lease) = store
        .claim(&key, &Fingerprint::from_bytes([5; 32]), ttl)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    let attempt = entry(idemgate_engine::AttemptOutcome::Executed);
    let wrote = store
        .complete(&lease, Bytes::from_static(b"x"), ttl, &attempt)
        .await
        .unwrap();
    assert_eq!(wrote, Fenced::Applied);
    let forget = entry(idemgate_engine::AttemptOutcome::Forgotten);
    assert!(store.forget(&key, &forget, ttl).await.unwrap());
    assert!(
        store.forget(&key, &forget, ttl).await.unwrap(),
        "the same forget sent again"
    );
    let later = idemgate_engine::Attempt {
        at_ms: forget.at_ms + 1,
        ..forget.clone()
    };
    assert!(
        !store.forget(&key, &later, ttl).await.unwrap(),
        "another forget finds nothing"
    );
}
