//! Sealed payloads: bytes a store holds for a DONE record, opened under
//! the record's identity, directly and through the `SealedStore` that
//! every store sits behind. Also the key file.
//!
//! The store here holds, under key A, bytes of the fuzzer's making: raw
//! input, or a genuine sealed payload (A's own, A's sealed under an older
//! key, another key's, another tenant's, another request's on the same
//! key) with bytes flipped, cut or added, under the fingerprint the input
//! picks. Reading A may only give A's own answer for that fingerprint, or
//! a `Corrupt` store error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Claim, ClientKey, Fenced, Fingerprint, MemoryStore, RecordState,
    ScopedKey, Store, StoreErrorKind,
};
use idemgate_seal::store::response_associated_data;
use idemgate_seal::{KeyRing, SealedStore, sealed_key_id, validate_key_id};

use crate::input::Input;

const OLD_KEY: &str = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
const NEW_KEY: &str = "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";

/// What the fixture sealed, and how.
struct Fixture {
    ring: Arc<KeyRing>,
    runtime: tokio::runtime::Runtime,
    /// Key A, whose record the input fills.
    a: ScopedKey,
    /// The two fingerprints A was answered under.
    fingerprints: [Fingerprint; 2],
    /// Sealed payloads: (bytes, the key and fingerprint they were sealed
    /// for, the plaintext).
    sealed: Vec<(Vec<u8>, ScopedKey, Fingerprint, Vec<u8>)>,
}

fn key(tenant: &str, k: &str) -> ScopedKey {
    ScopedKey::new(tenant, "chat", ClientKey::parse(k).expect("a valid key"))
}

fn fixture() -> Fixture {
    let ring = KeyRing::parse(&format!("{OLD_KEY}\n*{NEW_KEY}\n")).expect("the ring parses");
    let old = KeyRing::parse(&format!("*{OLD_KEY}\n")).expect("the old ring parses");
    let a = key("t-a", "key-a");
    let b = key("t-a", "key-b");
    let c = key("t-b", "key-a");
    let fp = Fingerprint::from_bytes([1; 32]);
    let fp2 = Fingerprint::from_bytes([2; 32]);
    let mut sealed = Vec::new();
    for (ring, k, f, plain) in [
        (&ring, &a, fp, &b"the answer for A"[..]),
        (&old, &a, fp, b"the answer for A, sealed under k1"),
        (&ring, &b, fp, b"the answer for B"),
        (&ring, &c, fp, b"the answer for A of tenant b"),
        (&ring, &a, fp2, b"the answer for A's other request"),
    ] {
        let bytes = ring
            .seal(&response_associated_data(k, &f), plain)
            .expect("sealing works");
        sealed.push((bytes, k.clone(), f, plain.to_vec()));
    }
    Fixture {
        ring: Arc::new(ring),
        runtime: tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime"),
        a,
        fingerprints: [fp, fp2],
        sealed,
    }
}

thread_local! {
    static FIXTURE: Fixture = fixture();
}

/// The plaintext `bytes` may open to as A's record under `fingerprint`.
fn genuine<'f>(f: &'f Fixture, bytes: &[u8], fingerprint: &Fingerprint) -> Option<&'f [u8]> {
    f.sealed
        .iter()
        .find(|(s, k, fp, _)| s == bytes && *k == f.a && fp == fingerprint)
        .map(|(_, _, _, plain)| plain.as_slice())
}

/// Sealed payloads under key A, opened directly and through a
/// `SealedStore`; with the first byte 6 or more, a key file.
pub fn sealed(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.byte();
    if mode % 8 >= 6 {
        return key_file(input.rest());
    }
    FIXTURE.with(|f| {
        let flags = input.byte();
        let mut candidate = match usize::from(mode % 8) {
            0 => input.medium().to_vec(),
            n => f.sealed[n - 1].0.clone(),
        };
        let fingerprint = match flags % 3 {
            0 => f.fingerprints[0],
            1 => f.fingerprints[1],
            _ => Fingerprint::from_bytes([flags; 32]),
        };
        if flags & 0x40 != 0 && !candidate.is_empty() {
            let at = usize::from(u16::from_be_bytes([input.byte(), input.byte()]));
            candidate.truncate(at % candidate.len());
        }
        if flags & 0x20 != 0 {
            candidate.extend_from_slice(input.short());
        }
        while let [hi, lo, x] = *input.take(3) {
            if !candidate.is_empty() {
                let at = usize::from(u16::from_be_bytes([hi, lo])) % candidate.len();
                candidate[at] ^= x;
            }
        }
        check(f, &candidate, &fingerprint);
    });
}

fn check(f: &Fixture, candidate: &[u8], fingerprint: &Fingerprint) {
    if let Ok(id) = sealed_key_id(candidate) {
        assert!(validate_key_id(id).is_ok(), "key id {id:?}");
    }
    let want = genuine(f, candidate, fingerprint);
    let ad = response_associated_data(&f.a, fingerprint);
    match f.ring.open(&ad, candidate) {
        Ok(plain) => assert_eq!(Some(plain.as_slice()), want, "opened a payload not A's"),
        Err(e) => assert!(want.is_none(), "A's own payload did not open: {e}"),
    }

    let inner = Arc::new(MemoryStore::new());
    let store = SealedStore::new(inner.clone(), f.ring.clone());
    let attempt = Attempt {
        at_ms: 1,
        replica: "fuzz".into(),
        outcome: AttemptOutcome::Executed,
        status: Some(200),
        latency_us: 1,
        repeated: None,
    };
    let ttl = Duration::from_secs(60);
    f.runtime.block_on(async {
        let Ok(Claim::Acquired(lease)) = inner.claim(&f.a, fingerprint, ttl).await else {
            panic!("a fresh memory store claims");
        };
        let written = inner
            .complete(&lease, Bytes::copy_from_slice(candidate), ttl, &attempt)
            .await;
        assert_eq!(
            written.ok(),
            Some(Fenced::Applied),
            "the memory store completes"
        );
        let read = [
            store
                .get(&f.a)
                .await
                .map(|r| r.expect("the record is there")),
            match store.claim(&f.a, fingerprint, ttl).await {
                Ok(Claim::Existing(r)) => Ok(r),
                Ok(Claim::Acquired(_)) => panic!("a DONE record was claimed"),
                Err(e) => Err(e),
            },
        ];
        for r in read {
            match r {
                Ok(record) => {
                    assert_eq!(&record.fingerprint, fingerprint);
                    let RecordState::Done { payload, .. } = &record.state else {
                        panic!("not DONE");
                    };
                    assert_eq!(Some(&payload[..]), want, "the store gave a payload not A's");
                }
                Err(e) => {
                    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
                    assert!(want.is_none(), "A's own payload did not open: {e}");
                }
            }
        }
    });
}

/// A key file: a ring that parses has its active key among its ids, and
/// its `Debug` shows no key.
fn key_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(ring) = KeyRing::parse(&text) else {
        return;
    };
    assert!(ring.key_ids().any(|id| id == ring.active_key_id()));
    let shown = format!("{ring:?}");
    for line in text.lines() {
        if let Some((_, key)) = line.split_once(':') {
            let key = key.trim();
            if key.len() >= 40 {
                assert!(!shown.contains(key), "a key is shown");
            }
        }
    }
}
