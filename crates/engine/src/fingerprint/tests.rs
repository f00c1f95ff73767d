//! Unit tests of the parent module.

use super::*;

#[test]
fn key_order_and_whitespace_do_not_matter() {
    let a = Fingerprint::of_request("POST", "/v1", br#"{"a":1,"b":{"y":2,"x":[1,2]}}"#, &[]);
    let b = Fingerprint::of_request(
        "POST",
        "/v1",
        b"{ \"b\": {\"x\": [1, 2], \"y\": 2},\n \"a\": 1 }",
        &[],
    );
    assert_eq!(a, b);
}

#[test]
fn payload_method_and_path_all_count() {
    let base = Fingerprint::of_request("POST", "/v1", br#"{"a":1}"#, &[]);
    assert_ne!(
        base,
        Fingerprint::of_request("POST", "/v1", br#"{"a":2}"#, &[])
    );
    assert_ne!(
        base,
        Fingerprint::of_request("PUT", "/v1", br#"{"a":1}"#, &[])
    );
    assert_ne!(
        base,
        Fingerprint::of_request("POST", "/v2", br#"{"a":1}"#, &[])
    );
    let arr = Fingerprint::of_request("POST", "/v1", br#"[1,2]"#, &[]);
    assert_ne!(
        arr,
        Fingerprint::of_request("POST", "/v1", br#"[2,1]"#, &[])
    );
}

#[test]
fn ignored_pointers_are_removed() {
    let ignore = vec!["/meta/sent_at".to_owned(), "/a~1b".to_owned()];
    let a = Fingerprint::of_request(
        "POST",
        "/",
        br#"{"q":1,"meta":{"sent_at":5},"a/b":1}"#,
        &ignore,
    );
    let b = Fingerprint::of_request("POST", "/", br#"{"q":1,"meta":{"sent_at":9}}"#, &ignore);
    assert_eq!(a, b);
    let c = Fingerprint::of_request("POST", "/", br#"{"q":2,"meta":{"sent_at":9}}"#, &ignore);
    assert_ne!(a, c);
}

#[test]
fn non_json_bodies_hash_raw_and_never_equal_json() {
    let raw = Fingerprint::of_request("POST", "/", b"{not json", &[]);
    assert_eq!(raw, Fingerprint::of_request("POST", "/", b"{not json", &[]));
    assert_ne!(
        raw,
        Fingerprint::of_request("POST", "/", b"{not  json", &[])
    );
    assert_eq!(
        canonical_json(br#"{"b":1, "a":"x"}"#).unwrap(),
        br#"{"a":"x","b":1}"#
    );
}

#[test]
fn numbers_compare_by_their_exact_literal() {
    let a = br#"{"amount": 12345678901234567890123}"#;
    let b = br#"{"amount": 12345678901234567890124}"#;
    assert_ne!(
        Fingerprint::of_request("POST", "/", a, &[]),
        Fingerprint::of_request("POST", "/", b, &[])
    );
    assert_ne!(
        Fingerprint::of_request("POST", "/", br#"[0.1000000000000000000001]"#, &[]),
        Fingerprint::of_request("POST", "/", br#"[0.1]"#, &[])
    );
    assert_eq!(
        canonical_json(br#"{"b": 1.50, "a": -0}"#).unwrap(),
        br#"{"a":-0,"b":1.50}"#
    );
}

#[test]
fn duplicate_object_keys_are_refused_at_any_depth() {
    for body in [
        &br#"{"a":1,"a":2}"#[..],
        br#"{"x":[{"k":1,"j":0,"k":1}]}"#,
        br#"{"\u0061":1,"a":1}"#,
    ] {
        let err = digest_body(Some("application/json"), body, &[]).unwrap_err();
        assert!(matches!(err, BodyError::DuplicateKey { .. }), "{err}");
        assert!(err.to_string().contains("repeats the object key"));
        assert_eq!(canonical_json(body), None);
    }
    // The lenient form used by library callers hashes such a body raw.
    assert_eq!(
        Fingerprint::of_request("POST", "/", br#"{"a":1,"a":2}"#, &[]),
        Fingerprint::of_request("POST", "/", br#"{"a":1,"a":2}"#, &[])
    );
}

#[test]
fn strings_are_compared_by_value_not_escape() {
    assert_eq!(
        digest_body(None, br#"{"q":"caf\u00e9 \/"}"#, &[]),
        digest_body(None, "{\"q\":\"café /\"}".as_bytes(), &[])
    );
}

fn multipart(boundary: &str, text: &str) -> (String, Vec<u8>) {
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{text}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n{{\"x\":1}}\r\n--{boundary}--\r\n"
    );
    (
        format!("multipart/form-data; boundary={boundary}"),
        body.into_bytes(),
    )
}

#[test]
fn multipart_bodies_are_fingerprinted_by_their_parts_not_their_boundary() {
    let (ct1, b1) = multipart("----a1b2c3", "fine-tune");
    let (ct2, b2) = multipart("----zz99", "fine-tune");
    let (ct3, b3) = multipart("----zz99", "batch");
    let d1 = digest_body(Some(&ct1), &b1, &[]).unwrap();
    assert_eq!(d1, digest_body(Some(&ct2), &b2, &[]).unwrap());
    assert_ne!(d1, digest_body(Some(&ct3), &b3, &[]).unwrap());
    // A quoted boundary parameter is the same boundary.
    let quoted = ct1.replace("boundary=----a1b2c3", "Boundary=\"----a1b2c3\"");
    assert_eq!(d1, digest_body(Some(&quoted), &b1, &[]).unwrap());
    // Without the multipart content type the boundary counts.
    assert_ne!(
        digest_body(None, &b1, &[]).unwrap(),
        digest_body(None, &b2, &[]).unwrap()
    );
}

proptest::proptest! {
    #[test]
    fn any_bytes_digest_without_panicking(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
                                         ct in "[ -~]{0,40}") {
        let _ = digest_body(Some(&ct), &body, &["/a".to_owned(), "".to_owned(), "/".to_owned()]);
        let _ = canonical_json(&body);
    }

    #[test]
    fn reformatting_json_keeps_the_digest(v in json_value()) {
        let compact = serde_json::to_vec(&v).unwrap();
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        proptest::prop_assert_eq!(
            digest_body(None, &compact, &[]).unwrap(),
            digest_body(None, &pretty, &[]).unwrap()
        );
        let canon = canonical_json(&compact).unwrap();
        proptest::prop_assert_eq!(canonical_json(&canon).unwrap(), canon);
    }
}

fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        "[a-z\\u{e9}\"\\\\ ]{0,8}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn hex_round_trip() {
    let f = Fingerprint::of_value(&serde_json::json!({"k": [1, "two"]})).unwrap();
    assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
    assert_eq!(Fingerprint::from_hex("zz"), None);
}
