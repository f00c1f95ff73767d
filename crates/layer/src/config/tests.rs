//! Unit tests of the parent module.

use super::*;

#[test]
fn defaults_are_the_safe_ones() {
    let c = LayerConfig::new("charges");
    assert_eq!(c.namespace, "charges");
    assert_eq!(c.key_mode, KeyMode::Require);
    assert_eq!(c.on_store_error, StoreErrorMode::FailClosed);
    assert!(c.protects(&Method::POST));
    assert!(!c.protects(&Method::GET));
    for s in [408, 429, 500, 502, 503, 504, 599] {
        assert!(c.is_retryable(s), "{s}");
    }
    for s in [200, 201, 400, 404, 409, 422] {
        assert!(!c.is_retryable(s), "{s}");
    }
}

#[test]
fn stream_dialects_come_from_the_path_unless_configured() {
    let c = LayerConfig::default();
    for (path, d) in [
        ("/v1/chat/completions", StreamDialect::Openai),
        ("/openai/v1/completions/", StreamDialect::Openai),
        ("/v1/messages", StreamDialect::Anthropic),
        ("/v1/responses", StreamDialect::OpenaiResponses),
        ("/v1/embeddings", StreamDialect::None),
        ("/", StreamDialect::None),
    ] {
        assert_eq!(c.stream_dialect_of(path), d, "{path}");
    }
    let fixed = LayerConfig {
        stream_dialect: Some(StreamDialect::Anthropic),
        ..LayerConfig::default()
    };
    assert_eq!(
        fixed.stream_dialect_of("/v1/chat/completions"),
        StreamDialect::Anthropic
    );
    assert_eq!(
        json(&StreamDialect::OpenaiResponses),
        r#""openai_responses""#
    );
}

#[test]
fn template_warnings() {
    assert!(DeriveTemplate::default().warnings().is_empty());
    let content_only = DeriveTemplate {
        parts: vec![DerivePart::BodyHash],
        window: None,
    };
    assert!(content_only.is_content_only());
    assert_eq!(content_only.warnings().len(), 2);
    let empty = DeriveTemplate {
        parts: vec![],
        window: Some(Duration::from_secs(60)),
    };
    assert_eq!(empty.warnings().len(), 1);
}

#[test]
fn key_parts_are_written_as_text() {
    for (text, part) in [
        ("tenant", DerivePart::Tenant),
        ("body", DerivePart::BodyHash),
        (
            "header:x-user-id",
            DerivePart::Header(HeaderName::from_static("x-user-id")),
        ),
    ] {
        assert_eq!(text.parse::<DerivePart>(), Ok(part.clone()));
        assert_eq!(part.to_string(), text);
    }
    assert_eq!(
        " header: X-User-Id ".parse::<DerivePart>(),
        Ok(DerivePart::Header(HeaderName::from_static("x-user-id")))
    );
    assert!(matches!(
        "cookie".parse::<DerivePart>(),
        Err(DerivePartError::Unknown(_))
    ));
    assert!(matches!(
        "header:a b".parse::<DerivePart>(),
        Err(DerivePartError::BadHeader(_))
    ));
}

#[test]
fn modes_round_trip_through_serde_in_snake_case() {
    assert_eq!(json(&StoreErrorMode::FailOpen), r#""fail_open""#);
    assert_eq!(json(&KeyMode::Require), r#""require""#);
    assert_eq!(json(&OnInflight::Reject), r#""reject""#);
    assert_eq!(json(&TenantSource::Credential), r#""credential""#);
    let custom = TenantSource::Headers(vec![
        HeaderName::from_static("x-tenant"),
        HeaderName::from_static("x-org"),
    ]);
    assert_eq!(json(&custom), r#"{"headers":["x-tenant","x-org"]}"#);
    let back: TenantSource = serde_json::from_str(&json(&custom)).expect("valid JSON");
    assert_eq!(back, custom);
    assert!(serde_json::from_str::<TenantSource>(r#"{"headers":["a b"]}"#).is_err());
    let derive = KeyMode::Derive(DeriveTemplate::default());
    let text = json(&derive);
    assert!(
        text.contains(r#"["tenant","header:x-user-id","header:x-session-id","body"]"#),
        "{text}"
    );
    let back: KeyMode = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(back, derive);
    let wait: OnInflight =
        serde_json::from_str(r#"{"wait":{"secs":5,"nanos":0}}"#).expect("valid JSON");
    assert_eq!(wait, OnInflight::Wait(Duration::from_secs(5)));
    let bad = serde_json::from_str::<StoreErrorMode>(r#""ignore""#);
    assert!(bad.is_err());
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializable")
}
