//! Key files: parsing, errors that name the line and never the key,
//! generation, and `Debug` without key material.

use std::io::Write as _;

use idemgate_seal::{GenerateKeyError, KeyFileError, KeyIdError, KeyRing, generate_key_line};

const KEY_A: &str = "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
const KEY_B: &str = "yv66vgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

fn parse_err(text: &str) -> KeyFileError {
    KeyRing::parse(text).expect_err("must be refused")
}

/// The message, checked to hold no key text (whole or a long piece).
fn message(err: &KeyFileError, key_texts: &[&str]) -> String {
    let message = err.to_string();
    for key in key_texts {
        assert!(!message.contains(key), "{message}");
        for piece in key.as_bytes().windows(8) {
            let piece = std::str::from_utf8(piece).expect("ascii");
            assert!(!message.contains(piece), "{message} contains {piece}");
        }
    }
    message
}

#[test]
fn parses_comments_blank_lines_and_whitespace() {
    let text = format!(
        "\u{feff}# keys\r\n\r\n   # indented comment\r\n  old : {KEY_A}  \r\n\t*  new:{KEY_B}\r\n"
    );
    let ring = KeyRing::parse(&text).expect("valid");
    assert_eq!(ring.active_key_id(), "new");
    assert_eq!(ring.key_ids().collect::<Vec<_>>(), ["new", "old"]);
}

#[test]
fn the_active_line_may_be_anywhere() {
    let first = KeyRing::parse(&format!("*a:{KEY_A}\nb:{KEY_B}")).expect("valid");
    assert_eq!(first.active_key_id(), "a");
    let last = KeyRing::parse(&format!("a:{KEY_A}\n*b:{KEY_B}")).expect("valid");
    assert_eq!(last.active_key_id(), "b");
}

#[test]
fn keys_are_used_by_id() {
    // The same key text parsed into two rings with ids swapped: a payload
    // sealed by one opens in the other only under the id it names.
    let one = KeyRing::parse(&format!("*a:{KEY_A}\nb:{KEY_B}")).expect("valid");
    let two = KeyRing::parse(&format!("a:{KEY_A}\n*b:{KEY_B}")).expect("valid");
    let sealed = one.seal(b"ad", b"x").expect("seal");
    assert_eq!(two.open(b"ad", &sealed).expect("open"), b"x");
}

#[test]
fn missing_separator() {
    let err = parse_err(&format!("# c\n*{KEY_A}"));
    assert!(matches!(err, KeyFileError::MissingSeparator { line: 2 }));
    assert_eq!(
        message(&err, &[KEY_A]),
        "key file line 2: expected `ID:BASE64KEY` (with a leading `*` on the active key)"
    );
}

#[test]
fn invalid_key_ids() {
    let err = parse_err(&format!("*:{KEY_A}"));
    assert!(matches!(
        err,
        KeyFileError::InvalidKeyId {
            line: 1,
            reason: KeyIdError::Empty
        }
    ));
    assert_eq!(message(&err, &[KEY_A]), "key file line 1: key id is empty");

    let err = parse_err(&format!("*k 1:{KEY_A}"));
    assert_eq!(
        message(&err, &[KEY_A]),
        "key file line 1: key id character 2 is not allowed (allowed: A-Z a-z 0-9 . _ -)"
    );

    let long = "k".repeat(33);
    let err = parse_err(&format!("*{long}:{KEY_A}"));
    assert_eq!(
        message(&err, &[KEY_A]),
        "key file line 1: key id is 33 bytes long; the limit is 32"
    );

    // A key pasted before the colon is not echoed.
    let err = parse_err(&format!("*{KEY_A}:{KEY_B}"));
    assert!(matches!(err, KeyFileError::InvalidKeyId { line: 1, .. }));
    message(&err, &[KEY_A, KEY_B]);
}

#[test]
fn bad_base64() {
    for bad in [
        "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA!A=", // bad symbol
        "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", // URL-safe alphabet
        "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",  // padding missing
        "3q2+7wAAAAAAAAAA AAAAAAAAAAAAAAAAAAAAAAAAAAA=", // inner space
    ] {
        let err = parse_err(&format!("a:{KEY_B}\n*k1:{bad}"));
        assert!(
            matches!(&err, KeyFileError::InvalidBase64 { line: 2, id } if id == "k1"),
            "{err:?}"
        );
        assert_eq!(
            message(&err, &[bad, KEY_B]),
            "key file line 2: key `k1` is not valid standard base64 (alphabet A-Z a-z 0-9 + / with `=` padding)"
        );
    }
}

#[test]
fn wrong_key_length() {
    let short = "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="; // 31 bytes
    let err = parse_err(&format!("*k1:{short}"));
    assert!(matches!(
        &err,
        KeyFileError::WrongKeyLength { line: 1, id, len: 31 } if id == "k1"
    ));
    assert_eq!(
        message(&err, &[short]),
        "key file line 1: key `k1` decodes to 31 bytes; keys must be exactly 32 bytes"
    );
    let long = "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"; // 33 bytes
    let err = parse_err(&format!("*k1:{long}"));
    assert!(matches!(err, KeyFileError::WrongKeyLength { len: 33, .. }));
    message(&err, &[long]);
    let err = parse_err("*k1:");
    assert!(matches!(err, KeyFileError::WrongKeyLength { len: 0, .. }));
}

#[test]
fn duplicate_key_ids() {
    let err = parse_err(&format!("*k1:{KEY_A}\n\nk1:{KEY_B}"));
    assert!(matches!(
        &err,
        KeyFileError::DuplicateKeyId { line: 3, id, first_line: 1 } if id == "k1"
    ));
    assert_eq!(
        message(&err, &[KEY_A, KEY_B]),
        "key file line 3: key id `k1` is already used on line 1"
    );
}

#[test]
fn the_same_key_under_two_ids() {
    let err = parse_err(&format!("*k1:{KEY_A}\nk2:{KEY_A}"));
    assert!(matches!(
        err,
        KeyFileError::DuplicateKey {
            line: 2,
            other_line: 1,
            ..
        }
    ));
    assert_eq!(
        message(&err, &[KEY_A]),
        "key file line 2: key `k2` has the same key bytes as `k1` on line 1; every key id needs its own freshly generated key"
    );
}

#[test]
fn several_keys_and_none_marked_is_refused() {
    let err = parse_err(&format!("k1:{KEY_A}\n# c\nk2:{KEY_B}"));
    assert!(matches!(err, KeyFileError::NoActiveKey { keys: 2 }));
    assert_eq!(
        message(&err, &[KEY_A, KEY_B]),
        "key file has 2 keys and none is marked active: start the line of the key new records are sealed under with `*` (a key added for a rotation is not active until marked)"
    );
}

#[test]
fn a_single_unmarked_key_is_active() {
    let ring = KeyRing::parse(&format!("# first key\n  only:{KEY_A}\n")).expect("one key");
    assert_eq!(ring.active_key_id(), "only");
    assert_eq!(ring.key_ids().collect::<Vec<_>>(), ["only"]);
    // Marked, the same.
    let marked = KeyRing::parse(&format!("*only:{KEY_A}")).expect("one marked key");
    let sealed = ring.seal(b"ad", b"x").expect("seal");
    assert_eq!(marked.open(b"ad", &sealed).expect("open"), b"x");
}

#[test]
fn a_key_added_beside_the_marked_one_only_opens() {
    // Rotation step 1, whichever order the lines are in.
    for text in [
        format!("*old:{KEY_A}\nnew:{KEY_B}"),
        format!("new:{KEY_B}\n*old:{KEY_A}"),
    ] {
        let ring = KeyRing::parse(&text).expect("valid");
        assert_eq!(ring.active_key_id(), "old", "{text}");
        assert_eq!(ring.key_ids().count(), 2);
    }
}

#[test]
fn two_active_keys() {
    let err = parse_err(&format!("# c\n*k1:{KEY_A}\n*k2:{KEY_B}"));
    assert!(matches!(
        err,
        KeyFileError::MultipleActiveKeys {
            line: 3,
            first_line: 2
        }
    ));
    assert_eq!(
        message(&err, &[KEY_A, KEY_B]),
        "key file line 3: a second active key (`*`); line 2 is already active, exactly one line may start with `*`"
    );
}

#[test]
fn no_keys() {
    for text in ["", "\n\n", "# only a comment\n  \n"] {
        let err = parse_err(text);
        assert!(matches!(err, KeyFileError::NoKeys));
        assert_eq!(
            err.to_string(),
            "key file has no keys (only blank lines and comments)"
        );
    }
}

#[test]
fn from_file() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(file, "# test\nold:{KEY_A}\n*new:{KEY_B}").expect("write");
    let ring = KeyRing::from_file(file.path()).expect("valid");
    assert_eq!(ring.active_key_id(), "new");

    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.keys");
    let err = KeyRing::from_file(&missing).expect_err("missing");
    assert!(matches!(err, KeyFileError::Io { .. }));
    assert_eq!(
        err.to_string(),
        format!("cannot read key file {}", missing.display())
    );

    let mut bad = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(bad, "*k1:{KEY_A}\n*k2:{KEY_B}").expect("write");
    let err = KeyRing::from_file(bad.path()).expect_err("two active");
    assert!(matches!(
        err,
        KeyFileError::MultipleActiveKeys { line: 2, .. }
    ));
}

#[test]
fn generated_lines() {
    let line = generate_key_line("2025-06").expect("line");
    let (id, key) = line.split_once(':').expect("separator");
    assert_eq!(id, "2025-06");
    assert_eq!(key.len(), 44);
    assert!(key.ends_with('='));
    assert_ne!(generate_key_line("2025-06").expect("line"), line);

    let ring = KeyRing::parse(&format!("*{line}")).expect("generated line parses");
    let sealed = ring.seal(b"ad", b"x").expect("seal");
    assert_eq!(ring.open(b"ad", &sealed).expect("open"), b"x");

    // Unmarked: active as a file's only key, and in a file of two
    // generated lines neither is.
    assert_eq!(
        KeyRing::parse(&line).expect("one key").active_key_id(),
        "2025-06"
    );
    let second = generate_key_line("2025-07").expect("line");
    assert!(matches!(
        parse_err(&format!("{line}\n{second}\n")),
        KeyFileError::NoActiveKey { keys: 2 }
    ));

    assert_eq!(
        generate_key_line("bad id"),
        Err(GenerateKeyError::InvalidKeyId(KeyIdError::BadChar {
            position: 4
        }))
    );
    assert_eq!(
        generate_key_line(""),
        Err(GenerateKeyError::InvalidKeyId(KeyIdError::Empty))
    );
}

#[test]
fn debug_shows_ids_only() {
    let ring = KeyRing::parse(&format!("old:{KEY_A}\n*new:{KEY_B}")).expect("valid");
    let debug = format!("{ring:?}");
    assert_eq!(debug, r#"KeyRing { active: "new", open_only: ["old"] }"#);
    let pretty = format!("{ring:#?}");
    for key in [KEY_A, KEY_B] {
        assert!(!pretty.contains(key));
    }
    // Neither as bytes: the keys start 0xde 0xad / 0xca 0xfe.
    for needle in ["222", "173", "202", "254", "0x"] {
        assert!(!pretty.contains(needle), "{pretty}");
    }
}
