//! Configuration: defaults, TOML, environment, flags, and every refusal.

// `figment::Jail` closures return `figment::Error`, which is large.
#![allow(clippy::result_large_err)]

use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use figment::Jail;
use idemgate_check::{Jitter, RetryPolicy};
use idemgate_gateway::config::{
    DerivePart, KeyMode, OnInflight, RawKeyMode, StoreErrorMode, StreamDialect, Timeouts,
};
use idemgate_gateway::{ConfigError, GatewayConfig, Overrides, StoreUrl};

fn load(file: Option<&str>, overrides: &Overrides) -> Result<GatewayConfig, ConfigError> {
    GatewayConfig::load(file.map(Path::new), overrides)
}

fn jail_err(e: ConfigError) -> figment::Error {
    figment::Error::from(e.to_string())
}

#[test]
fn only_an_upstream_gives_the_documented_defaults() {
    Jail::expect_with(|_jail| {
        let over = Overrides {
            upstream: Some("http://127.0.0.1:9/".into()),
            ..Overrides::default()
        };
        let c = load(None, &over).map_err(jail_err)?;
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.admin_listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.store, StoreUrl::Sqlite("idemgate.db".into()));
        assert_eq!(c.pending_ttl, Duration::from_secs(30));
        assert_eq!(c.done_ttl, Duration::from_secs(24 * 3600));
        assert_eq!(c.routes.len(), 1);
        let r = &c.routes[0];
        assert_eq!(r.prefix, "/");
        assert_eq!(r.methods, vec![http::Method::POST]);
        assert_eq!(r.key_mode, KeyMode::Optional);
        assert!(matches!(r.on_inflight, OnInflight::Attach(_)));
        assert_eq!(r.upstream.as_str(), "http://127.0.0.1:9/");
        assert_eq!(r.upstream_key_header.as_str(), "idempotency-key");
        assert_eq!(r.timeouts, Timeouts::default());
        assert_eq!(r.body_limit, 10 * 1024 * 1024);
        assert!(r.retryable_statuses.contains(&429));
        assert!(r.retryable_statuses.contains(&503));
        assert!(!r.retryable_statuses.contains(&400));
        assert_eq!(r.on_store_error, StoreErrorMode::FailClosed);
        Ok(())
    });
}

#[test]
fn toml_file_is_read_whole() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "gw.toml",
            r#"
            listen = "127.0.0.1:18080"
            admin_listen = "127.0.0.1:19090"
            store = "memory:"
            pending_ttl = "5s"
            done_ttl = "2h"
            shutdown_grace = "500ms"
            admin_token = "s3cret-token"

            [[routes]]
            id = "chat"
            prefix = "/v1/chat/"
            upstream = "http://127.0.0.1:1234/base"
            methods = ["post", "PUT"]
            key = "require"
            on_inflight = "wait"
            inflight_wait = "45s"
            done_ttl = "48h"
            body_limit = "1MiB"
            retryable_statuses = [429, 503]
            upstream_key_header = "X-Request-Key"
            tenant_headers = ["X-Tenant", "x-api-key"]
            fingerprint_ignore = ["/stream_options", "/user"]
            concurrency_limit = 4
            on_store_error = "fail_open"
            strip_prefix = true
            stream_dialect = "anthropic"
            [routes.timeouts]
            connect = "2s"
            first_byte = "30s"
            idle = "10s"
            total = "5m"

            [[routes]]
            prefix = "/"
            upstream = "http://127.0.0.1:1235"
            key = "derive"
            key_template = ["tenant", "header:x-user-id", "header:x-session-id", "body"]
            key_window = "10m"
            on_inflight = "reject"
            "#,
        )?;
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.listen.port(), 18080);
        assert_eq!(c.admin_listen.port(), 19090);
        assert_eq!(c.store, StoreUrl::Memory);
        assert_eq!(c.pending_ttl, Duration::from_secs(5));
        assert_eq!(c.shutdown_grace, Duration::from_millis(500));
        assert_eq!(
            c.admin_token.as_ref().map(|t| t.expose()),
            Some("s3cret-token")
        );
        // The token never shows in Debug output.
        assert!(!format!("{c:?}").contains("s3cret-token"));
        // Longest prefix first.
        let chat = &c.routes[0];
        assert_eq!(chat.id, "chat");
        assert_eq!(chat.prefix, "/v1/chat");
        assert_eq!(chat.methods, vec![http::Method::POST, http::Method::PUT]);
        assert_eq!(chat.key_mode, KeyMode::Require);
        assert_eq!(chat.on_inflight, OnInflight::Wait(Duration::from_secs(45)));
        assert_eq!(
            chat.pending_ttl,
            Duration::from_secs(5),
            "inherits the default"
        );
        assert_eq!(chat.done_ttl, Duration::from_secs(48 * 3600));
        assert_eq!(chat.body_limit, 1 << 20);
        assert_eq!(chat.retryable_statuses, vec![429, 503]);
        assert_eq!(chat.upstream_key_header.as_str(), "x-request-key");
        assert_eq!(
            chat.tenant.headers(),
            [
                http::HeaderName::from_static("x-tenant"),
                http::HeaderName::from_static("x-api-key")
            ]
        );
        assert_eq!(chat.fingerprint_ignore, vec!["/stream_options", "/user"]);
        assert_eq!(chat.concurrency_limit, Some(4));
        assert_eq!(chat.on_store_error, StoreErrorMode::FailOpen);
        assert_eq!(chat.stream_dialect, Some(StreamDialect::Anthropic));
        assert_eq!(c.routes[1].stream_dialect, None, "recognised from the path");
        assert!(chat.strip_prefix);
        assert_eq!(
            chat.timeouts,
            Timeouts {
                connect: Duration::from_secs(2),
                first_byte: Duration::from_secs(30),
                idle: Duration::from_secs(10),
                total: Duration::from_secs(300),
            }
        );
        let root = &c.routes[1];
        assert_eq!(root.prefix, "/");
        assert_eq!(root.on_inflight, OnInflight::Reject);
        match &root.key_mode {
            KeyMode::Derive(t) => {
                assert_eq!(t.parts.len(), 4);
                assert_eq!(t.parts[0], DerivePart::Tenant);
                assert_eq!(
                    t.parts[1],
                    DerivePart::Header(http::HeaderName::from_static("x-user-id"))
                );
                assert_eq!(t.parts[3], DerivePart::BodyHash);
                assert_eq!(t.window, Some(Duration::from_secs(600)));
            }
            other => panic!("expected derive, got {other:?}"),
        }
        assert_eq!(
            c.route_for("/v1/chat/completions").map(|r| r.id.as_str()),
            Some("chat")
        );
        assert_eq!(c.route_for("/v1/chatty").map(|r| r.id.as_str()), Some("/"));
        Ok(())
    });
}

#[test]
fn environment_overrides_the_file_and_flags_override_both() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "gw.toml",
            r#"
            upstream = "http://127.0.0.1:1000"
            listen = "127.0.0.1:1001"
            admin_listen = "127.0.0.1:1002"
            pending_ttl = "10s"
            store = "memory:"
            workers = 4
            "#,
        )?;
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.workers.map(NonZeroUsize::get), Some(4));
        jail.set_env("IDEMGATE_LISTEN", "127.0.0.1:2001");
        jail.set_env("IDEMGATE_WORKERS", "3");
        jail.set_env("IDEMGATE_PENDING_TTL", "20s");
        jail.set_env("IDEMGATE_ADMIN_TOKEN", "from-env");
        jail.set_env("IDEMGATE_CONFIG", "ignored.toml");
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.listen.port(), 2001, "env beats file");
        assert_eq!(c.admin_listen.port(), 1002, "file value kept");
        assert_eq!(c.pending_ttl, Duration::from_secs(20));
        assert_eq!(c.admin_token.as_ref().map(|t| t.expose()), Some("from-env"));
        assert_eq!(c.workers.map(NonZeroUsize::get), Some(3));

        let over = Overrides {
            listen: Some("127.0.0.1:3001".into()),
            pending_ttl: Some("750ms".into()),
            upstream: Some("http://127.0.0.1:3000".into()),
            store: Some("sqlite:/tmp/flag.db".into()),
            done_ttl: Some("1h".into()),
            admin_listen: None,
            encryption_key_file: None,
            workers: Some(1),
        };
        let c = load(Some("gw.toml"), &over).map_err(jail_err)?;
        assert_eq!(c.listen.port(), 3001, "flag beats env");
        assert_eq!(c.workers.map(NonZeroUsize::get), Some(1));
        assert_eq!(c.admin_listen.port(), 1002);
        assert_eq!(c.pending_ttl, Duration::from_millis(750));
        assert_eq!(c.done_ttl, Duration::from_secs(3600));
        assert_eq!(c.store, StoreUrl::Sqlite("/tmp/flag.db".into()));
        assert_eq!(c.routes[0].upstream.as_str(), "http://127.0.0.1:3000/");
        assert_eq!(c.routes[0].pending_ttl, Duration::from_millis(750));
        Ok(())
    });
}

#[test]
fn environment_upstream_applies_to_routes_without_one() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "gw.toml",
            r#"
            upstream = "http://127.0.0.1:1000"
            [[routes]]
            prefix = "/v1"
            "#,
        )?;
        jail.set_env("IDEMGATE_UPSTREAM", "http://127.0.0.1:4000");
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.routes[0].upstream.as_str(), "http://127.0.0.1:4000/");
        Ok(())
    });
}

/// Each bad configuration is refused with an error naming its field.
#[test]
fn bad_configurations_name_their_field() {
    let cases: &[(&str, &str)] = &[
        ("listen = \"nowhere\"\nupstream = \"http://h\"", "listen"),
        (
            "admin_listen = \"1.2.3.4\"\nupstream = \"http://h\"",
            "admin_listen",
        ),
        ("store = \"mysql://h/db\"\nupstream = \"http://h\"", "store"),
        (
            "pending_ttl = \"soon\"\nupstream = \"http://h\"",
            "pending_ttl",
        ),
        ("done_ttl = \"0s\"\nupstream = \"http://h\"", "done_ttl"),
        (
            "shutdown_grace = \"5 parsecs\"\nupstream = \"http://h\"",
            "shutdown_grace",
        ),
        ("admin_token = \"\"\nupstream = \"http://h\"", "admin_token"),
        ("upstream = \"ftp://h\"", "upstream"),
        ("upstream = \"not a url\"", "upstream"),
        ("store = \"memory:\"", "routes"),
        ("[[routes]]\nupstream = \"http://h\"", "routes[0].prefix"),
        (
            "[[routes]]\nprefix = \"v1\"\nupstream = \"http://h\"",
            "routes[0].prefix",
        ),
        ("[[routes]]\nprefix = \"/v1\"", "routes[0].upstream"),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nmethods = [\"P OST\"]",
            "routes[0].methods",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nmethods = []",
            "routes[0].methods",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"maybe\"",
            "routes[0].key",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"derive\"",
            "routes[0].key_template",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"derive\"\nkey_template = []",
            "routes[0].key_template",
        ),
        (
            "upstream = \"http://h\"\n[client_retry]\nattempts = 0",
            "client_retry.attempts",
        ),
        (
            "upstream = \"http://h\"\n[client_retry]\nattempt_timeout = \"0s\"",
            "client_retry.attempt_timeout",
        ),
        (
            "upstream = \"http://h\"\n[client_retry]\njitter = \"some\"",
            "client_retry.jitter",
        ),
        (
            "upstream = \"http://h\"\n[client_retry]\nbackoff_base = \"10s\"\nbackoff_cap = \"1s\"",
            "client_retry.backoff_cap",
        ),
        (
            "upstream = \"http://h\"\n[client_retry]\nretries = 3",
            "retries",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\n[routes.client_retry]\ncompensation_delay = \"later\"",
            "routes[0].client_retry.compensation_delay",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nlongest_generation = \"0s\"",
            "routes[0].longest_generation",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\ncharges = \"yes\"",
            "charges",
        ),
        ("upstream = \"http://h\"\nalert_rules = \"\"", "alert_rules"),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"derive\"\nkey_template = [\"cookie\"]",
            "routes[0].key_template",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey_template = [\"tenant\"]",
            "routes[0].key_template",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\non_inflight = \"queue\"",
            "routes[0].on_inflight",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\ninflight_wait = \"forever\"",
            "routes[0].inflight_wait",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nbody_limit = \"lots\"",
            "routes[0].body_limit",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nbody_limit = 0",
            "routes[0].body_limit",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nretryable_statuses = [42]",
            "routes[0].retryable_statuses",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nupstream_key_header = \"bad header\"",
            "routes[0].upstream_key_header",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\ntenant_headers = [\"x-ok\", \"a:b\"]",
            "routes[0].tenant_headers",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\ntenant_headers = []",
            "routes[0].tenant_headers",
        ),
        // One spelling: the single-header form is gone, and says so.
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\ntenant_header = \"x-tenant\"",
            "`tenant_header`",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nfingerprint_ignore = [\"user\"]",
            "routes[0].fingerprint_ignore",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nconcurrency_limit = 0",
            "routes[0].concurrency_limit",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\non_store_error = \"ignore\"",
            "routes[0].on_store_error",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nstream_dialect = \"OpenAI\"",
            "routes[0].stream_dialect",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\n[routes.timeouts]\nidle = \"-1s\"",
            "routes[0].timeouts.idle",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\n[routes.timeouts]\nfirst_byte = \"10m\"\ntotal = \"1m\"",
            "routes[0].timeouts.total",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/a\"\n[[routes]]\nprefix = \"/a/\"",
            "routes[1]",
        ),
        // Phase one: wrong types and unknown fields name their key too.
        (
            "upstream = \"http://h\"\npending_tll = \"1s\"",
            "pending_tll",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nconcurrency_limit = \"many\"",
            "concurrency_limit",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\n[routes.timeouts]\nfirst = \"1s\"",
            "first",
        ),
    ];
    for (toml, field) in cases {
        Jail::expect_with(|jail| {
            jail.create_file("bad.toml", toml)?;
            match load(Some("bad.toml"), &Overrides::default()) {
                Ok(c) => panic!("accepted bad config {toml:?}: {c:?}"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(field),
                        "error for {toml:?} should name `{field}`: {msg}"
                    );
                }
            }
            Ok(())
        });
    }
}

/// A mode is read by its serde enum whichever source gives it: a name that
/// is not one of it is refused with the field's path and the accepted
/// names, from the file as from an `IDEMGATE_*` variable, and a valid
/// name from the environment overrides the file's.
#[test]
fn mode_names_are_read_the_same_from_the_file_and_the_environment() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "modes.toml",
            "upstream = \"http://127.0.0.1:9\"\n[client_retry]\njitter = \"none\"\n[[routes]]\nprefix = \"/\"\non_inflight = \"queue\"\n",
        )?;
        let err = load(Some("modes.toml"), &Overrides::default()).unwrap_err();
        assert_eq!(err.field(), Some("routes[0].on_inflight"), "{err}");
        assert_eq!(
            err.to_string(),
            "configuration field `routes[0].on_inflight`: `queue`: expected `reject`, `wait` or `attach`"
        );
        jail.create_file(
            "modes.toml",
            "upstream = \"http://127.0.0.1:9\"\n[client_retry]\njitter = \"none\"\n[[routes]]\nprefix = \"/\"\non_store_error = \"ignore\"\n",
        )?;
        let err = load(Some("modes.toml"), &Overrides::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration field `routes[0].on_store_error`: `ignore`: expected `fail_closed` or `fail_open`"
        );
        jail.create_file(
            "modes.toml",
            "upstream = \"http://127.0.0.1:9\"\n[client_retry]\njitter = \"none\"\n",
        )?;
        let c = load(Some("modes.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.client_retry.jitter, Jitter::None);
        jail.set_env("IDEMGATE_CLIENT_RETRY__JITTER", "equal");
        let c = load(Some("modes.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.client_retry.jitter, Jitter::Equal);
        jail.set_env("IDEMGATE_CLIENT_RETRY__JITTER", "some");
        let err = load(Some("modes.toml"), &Overrides::default()).unwrap_err();
        assert_eq!(err.field(), Some("client_retry.jitter"), "{err}");
        assert_eq!(
            err.to_string(),
            "configuration field `client_retry.jitter`: `some`: expected `none`, `full` or `equal`"
        );
        Ok(())
    });
}

#[test]
fn syntax_errors_and_missing_files_are_errors() {
    Jail::expect_with(|jail| {
        jail.create_file("broken.toml", "upstream = \"http://h\n[[routes")?;
        assert!(matches!(
            load(Some("broken.toml"), &Overrides::default()),
            Err(ConfigError::Load(_))
        ));
        assert!(matches!(
            load(Some("absent.toml"), &Overrides::default()),
            Err(ConfigError::MissingFile(_))
        ));
        Ok(())
    });
}

#[test]
fn workers_default_to_tokios_choice_and_refuse_zero_or_absurd_counts() {
    let over = |workers| Overrides {
        upstream: Some("http://127.0.0.1:9/".into()),
        workers,
        ..Overrides::default()
    };
    Jail::expect_with(|_jail| {
        let c = load(None, &over(None)).map_err(jail_err)?;
        assert_eq!(c.workers, None);
        for bad in [0, 1025, u64::MAX] {
            let err = load(None, &over(Some(bad))).expect_err("a bad worker count accepted");
            assert_eq!(err.field(), Some("workers"), "{bad}: {err}");
        }
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.create_file("gw.toml", "upstream = \"http://h:1\"\nworkers = \"two\"\n")?;
        assert!(matches!(
            load(Some("gw.toml"), &Overrides::default()),
            Err(ConfigError::Load(_))
        ));
        Ok(())
    });
}

#[test]
fn a_bad_environment_value_is_an_error() {
    Jail::expect_with(|jail| {
        jail.set_env("IDEMGATE_UPSTREAM", "http://127.0.0.1:1");
        jail.set_env("IDEMGATE_DONE_TTL", "tomorrow");
        let err = load(None, &Overrides::default()).expect_err("bad env accepted");
        assert_eq!(err.field(), Some("done_ttl"));
        Ok(())
    });
}

#[test]
fn checklist_fields_default_to_the_official_clients_and_a_quiet_route() {
    Jail::expect_with(|_jail| {
        let over = Overrides {
            upstream: Some("http://127.0.0.1:9/".into()),
            ..Overrides::default()
        };
        let c = load(None, &over).map_err(jail_err)?;
        assert_eq!(c.client_retry, RetryPolicy::default());
        assert_eq!(c.alert_rules, None);
        let r = &c.routes[0];
        assert_eq!(r.client_retry, RetryPolicy::default());
        assert_eq!(r.heartbeat, Some(c.pending_ttl / 3));
        assert_eq!(r.longest_generation, None);
        assert!(!r.charges);
        Ok(())
    });
}

#[test]
fn client_retry_is_inherited_field_by_field_and_checklist_fields_are_read() {
    Jail::expect_with(|jail| {
        jail.create_dir("conf")?;
        jail.create_file(
            "conf/gw.toml",
            r#"
            upstream = "http://127.0.0.1:9"
            alert_rules = "rules/idemgate.yml"

            [client_retry]
            attempts = 5
            attempt_timeout = "30s"
            backoff_base = "1s"
            backoff_cap = "4s"
            jitter = "equal"
            compensation_delay = "5m"

            [[routes]]
            prefix = "/charge"
            charges = true
            heartbeat = false
            pending_ttl = "2m"
            longest_generation = "90s"
            [routes.client_retry]
            attempts = 2
            jitter = "none"

            [[routes]]
            prefix = "/chat"
            "#,
        )?;
        let c = load(Some("conf/gw.toml"), &Overrides::default()).map_err(jail_err)?;
        let top = RetryPolicy {
            attempts: 5,
            attempt_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(4),
            jitter: Jitter::Equal,
            compensation_delay: Duration::from_secs(300),
        };
        assert_eq!(c.client_retry, top);
        // Relative to the file that names it, not the working directory.
        assert_eq!(
            c.alert_rules.as_deref(),
            Some(Path::new("conf/rules/idemgate.yml"))
        );
        let charge = c.route_for("/charge").ok_or("no /charge route")?;
        assert!(charge.charges);
        assert_eq!(charge.heartbeat, None);
        assert_eq!(charge.pending_ttl, Duration::from_secs(120));
        assert_eq!(charge.longest_generation, Some(Duration::from_secs(90)));
        assert_eq!(
            charge.client_retry,
            RetryPolicy {
                attempts: 2,
                jitter: Jitter::None,
                ..top
            }
        );
        let chat = c.route_for("/chat").ok_or("no /chat route")?;
        assert_eq!(chat.client_retry, top);
        assert!(!chat.charges);
        assert_eq!(chat.heartbeat, Some(Duration::from_secs(10)));

        jail.set_env("IDEMGATE_CLIENT_RETRY__ATTEMPTS", "7");
        let c = load(Some("conf/gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(c.client_retry.attempts, 7);
        Ok(())
    });
}

#[test]
fn a_content_hash_only_template_loads_for_the_checklist_to_report() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "gw.toml",
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"derive\"\nkey_template = [\"body\"]",
        )?;
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert!(
            matches!(&c.routes[0].key_mode, KeyMode::Derive(t) if t.parts == vec![DerivePart::BodyHash])
        );
        let rules: Vec<&str> = idemgate_gateway::plan::findings(&c)
            .iter()
            .map(|f| f.rule)
            .collect();
        assert!(rules.contains(&"content-hash-only-key"), "{rules:?}");
        Ok(())
    });
}

/// The library's `serve()` runs the start checks itself: a program that
/// embeds the gateway cannot start it with a key that merges operations.
#[tokio::test]
async fn serve_refuses_a_merging_key_template_before_opening_anything() {
    use idemgate_gateway::GatewayError;
    use idemgate_gateway::config::{RawConfig, RawRoute};

    let config = GatewayConfig::from_raw(RawConfig {
        upstream: Some("http://127.0.0.1:1".into()),
        // A store that cannot be opened: the refusal must come first.
        store: Some("redis://127.0.0.1:1".into()),
        routes: vec![RawRoute {
            prefix: Some("/v1".into()),
            key: Some(RawKeyMode::Derive),
            key_template: Some(vec!["body".into()]),
            key_window: Some("10m".into()),
            ..RawRoute::default()
        }],
        ..RawConfig::default()
    })
    .expect("a valid configuration");
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let listener = bind().await.expect("bind a loopback port");
    let admin = bind().await.expect("bind a loopback port");
    let served = tokio::time::timeout(
        Duration::from_secs(10),
        idemgate_gateway::serve(listener, admin, config, std::future::pending()),
    )
    .await
    .unwrap_or_else(|_| panic!("serve started with a merging key"));
    let err = served.expect_err("a merging key template was served");
    let msg = err.to_string();
    match err {
        GatewayError::Refused(findings) => {
            let rules: Vec<&str> = findings.iter().map(|f| f.rule).collect();
            assert_eq!(rules, vec!["content-hash-only-key"]);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(msg.contains("refusing to start"), "{msg}");
    assert!(msg.contains("route /v1"), "{msg}");
}

/// A concept has one spelling, the documented one: the former aliases are
/// refused with an error naming their field, not taken silently.
#[test]
fn undocumented_aliases_are_refused() {
    let cases: &[(&str, &str)] = &[
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nkey = \"required\"",
            "routes[0].key",
        ),
        ("upstream = \"http://h\"\nstore = \"memory\"", "store"),
        (
            "upstream = \"http://h\"\nstore = \"sqlite://x.db\"",
            "store",
        ),
        (
            "upstream = \"http://h\"\nstore = \"postgresql://h/db\"",
            "store",
        ),
        (
            "upstream = \"http://h\"\n[[routes]]\nprefix = \"/\"\nbody_limit = \"1m\"",
            "routes[0].body_limit",
        ),
    ];
    for (toml, field) in cases {
        Jail::expect_with(|jail| {
            jail.create_file("alias.toml", toml)?;
            match load(Some("alias.toml"), &Overrides::default()) {
                Ok(c) => panic!("accepted alias {toml:?}: {c:?}"),
                Err(e) => assert_eq!(e.field(), Some(*field), "{toml:?}: {e}"),
            }
            Ok(())
        });
    }
}

/// A value for a text field: plausible spellings, near misses, or any text.
fn field_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        Just("30s".to_owned()),
        Just("0s".to_owned()),
        Just("http://127.0.0.1:9".to_owned()),
        Just("memory:".to_owned()),
        Just("/v1".to_owned()),
        Just("derive".to_owned()),
        Just("fail_open".to_owned()),
        Just("x-api-key".to_owned()),
        Just("10MiB".to_owned()),
        Just("127.0.0.1:0".to_owned()),
        "[a-z0-9:/._ -]{0,12}",
        "\\PC{0,16}",
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]

    /// Any text in any field: the configuration loads, or is refused with
    /// an error that names the field it is about; it never panics. The text
    /// is read as a source gives it (the mode fields are serde enums, so
    /// their text is judged while reading).
    #[test]
    fn any_text_in_any_field_loads_or_names_its_field(
        top in proptest::collection::vec(proptest::option::of(field_text()), 7),
        route in proptest::collection::vec(proptest::option::of(field_text()), 16),
        lists in proptest::collection::vec(proptest::option::of(proptest::collection::vec(field_text(), 0..3)), 4),
    ) {
        use figment::providers::Serialized;
        use serde_json::{Map, Value};
        fn put<T: Into<Value> + Clone>(m: &mut Map<String, Value>, name: &str, v: &Option<T>) {
            if let Some(v) = v {
                m.insert(name.to_owned(), v.clone().into());
            }
        }
        let mut config = Map::new();
        for (name, v) in ["listen", "admin_listen", "store", "upstream", "pending_ttl", "done_ttl", "shutdown_grace"]
            .into_iter()
            .zip(&top)
        {
            put(&mut config, name, v);
        }
        let mut r = Map::new();
        r.insert("prefix".into(), route[0].clone().unwrap_or_else(|| "/".into()).into());
        for (name, v) in [
            "id", "upstream", "key", "key_window", "on_inflight", "inflight_wait", "pending_ttl",
            "done_ttl", "body_limit", "upstream_key_header", "on_store_error", "longest_generation",
        ]
        .into_iter()
        .zip(&route[1..13])
        {
            put(&mut r, name, v);
        }
        let mut timeouts = Map::new();
        put(&mut timeouts, "connect", &route[13]);
        put(&mut timeouts, "idle", &route[14]);
        r.insert("timeouts".into(), timeouts.into());
        let mut retry = Map::new();
        put(&mut retry, "jitter", &route[15]);
        r.insert("client_retry".into(), retry.into());
        for (name, v) in ["methods", "key_template", "tenant_headers", "fingerprint_ignore"]
            .into_iter()
            .zip(&lists)
        {
            put(&mut r, name, v);
        }
        config.insert("routes".into(), Value::Array(vec![r.into()]));
        let figment = figment::Figment::from(Serialized::defaults(Value::Object(config)));
        if let Err(e) = GatewayConfig::from_figment(&figment) {
            let field = e.field().map(str::to_owned);
            proptest::prop_assert!(field.is_some(), "{e}");
            let shown = e.to_string();
            let named = field.is_some_and(|f| shown.contains(&format!("`{f}`")));
            proptest::prop_assert!(named, "{}", shown);
        }
    }
}

#[test]
fn encryption_key_file_comes_from_the_file_the_environment_or_the_flag() {
    Jail::expect_with(|jail| {
        jail.create_dir("conf")?;
        jail.create_file(
            "conf/gw.toml",
            "upstream = \"http://127.0.0.1:9\"\nencryption_key_file = \"keys/idemgate.keys\"\n",
        )?;
        let c = load(Some("conf/gw.toml"), &Overrides::default()).map_err(jail_err)?;
        // Relative to the file that names it.
        assert_eq!(
            c.encryption_key_file.as_deref(),
            Some(Path::new("conf/keys/idemgate.keys"))
        );
        let c = load(
            None,
            &Overrides {
                upstream: Some("http://127.0.0.1:9".into()),
                ..Overrides::default()
            },
        )
        .map_err(jail_err)?;
        assert_eq!(c.encryption_key_file, None);
        jail.set_env("IDEMGATE_ENCRYPTION_KEY_FILE", "/etc/idemgate/env.keys");
        let c = load(Some("conf/gw.toml"), &Overrides::default()).map_err(jail_err)?;
        assert_eq!(
            c.encryption_key_file.as_deref(),
            Some(Path::new("/etc/idemgate/env.keys"))
        );
        let over = Overrides {
            encryption_key_file: Some("/run/flag.keys".into()),
            ..Overrides::default()
        };
        let c = load(Some("conf/gw.toml"), &over).map_err(jail_err)?;
        assert_eq!(
            c.encryption_key_file.as_deref(),
            Some(Path::new("/run/flag.keys"))
        );
        jail.set_env("IDEMGATE_ENCRYPTION_KEY_FILE", "");
        let err = load(Some("conf/gw.toml"), &Overrides::default()).unwrap_err();
        assert_eq!(err.field(), Some("encryption_key_file"));
        Ok(())
    });
}

#[test]
fn store_body_defaults_to_true_and_can_be_turned_off_per_route() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "gw.toml",
            "upstream = \"http://127.0.0.1:9\"\n[[routes]]\nprefix = \"/a\"\nstore_body = false\n[[routes]]\nprefix = \"/b\"\n",
        )?;
        let c = load(Some("gw.toml"), &Overrides::default()).map_err(jail_err)?;
        let a = c.route_for("/a").ok_or("no /a")?;
        assert!(!a.store_body);
        assert!(!a.layer_config().store_body);
        assert!(c.route_for("/b").ok_or("no /b")?.store_body);
        Ok(())
    });
}
