//! What the operator writes: the gateway's TOML configuration and store
//! URLs (also the driver's own reading of a Redis URL).

use figment::Figment;
use figment::providers::{Format, Toml};
use idemgate_gateway::{GatewayConfig, StoreUrl};
use url::Url;

/// The password of a URL, when finding it in printed text can be no
/// accident: long, and nowhere else in the URL.
fn password_of(text: &str) -> Option<String> {
    let url = Url::parse(text).ok()?;
    secret_password(&url)
}

fn secret_password(url: &Url) -> Option<String> {
    let pw = url.password()?;
    (pw.len() >= 12 && url.as_str().matches(pw).count() == 1).then(|| pw.to_owned())
}

/// The gateway's configuration from TOML text (no file, no environment).
///
/// A configuration that loads routes every route's own prefix to a route
/// at least as specific, and its `Debug` shows neither the admin token nor
/// the store's password.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let figment = Figment::new().merge(Toml::string(&text));
    let Ok(cfg) = GatewayConfig::from_figment(&figment) else {
        return;
    };
    for route in &cfg.routes {
        let found = cfg
            .route_for(&route.prefix)
            .unwrap_or_else(|| panic!("no route for its own prefix {:?}", route.prefix));
        assert!(found.prefix.len() >= route.prefix.len());
        let _ = route.layer_config();
    }
    let shown = format!("{cfg:?}");
    if let Some(token) = &cfg.admin_token
        && token.expose().len() >= 12
        && text.matches(token.expose()).count() == 1
    {
        assert!(!shown.contains(token.expose()), "the admin token is shown");
    }
    let store_password = match &cfg.store {
        StoreUrl::Redis(u) | StoreUrl::RedisCluster(u) | StoreUrl::Postgres(u) => {
            secret_password(u)
        }
        _ => None,
    };
    if let Some(pw) = store_password
        && text.matches(pw.as_str()).count() == 1
    {
        assert!(!shown.contains(&pw), "the store's password is shown");
    }
    // The plan reads the alert rules and key files it names: only plans
    // that name none are made here.
    if cfg.alert_rules.is_none() && cfg.encryption_key_file.is_none() {
        let _ = idemgate_gateway::plan::findings(&cfg);
    }
}

/// Store URLs, as the gateway reads them and as the Redis driver does.
///
/// A store URL's `Display` and `Debug` never show its password, and the
/// displayed form reads back as the same kind of store.
pub fn store_url(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let password = password_of(text.trim());
    match StoreUrl::parse(&text) {
        Ok(url) => {
            let shown = format!("{url} {url:?}");
            if let Some(pw) = &password {
                assert!(!shown.contains(pw.as_str()), "{shown}");
            }
            let again = StoreUrl::parse(&url.to_string())
                .unwrap_or_else(|e| panic!("{url} does not read back: {e}"));
            assert_eq!(again.backend(), url.backend());
        }
        Err(message) => {
            if let Some(pw) = &password {
                assert!(!message.contains(pw.as_str()), "{message}");
            }
        }
    }
    // `tls_ca` names a file to read: not something to fuzz.
    if !text.contains("tls_ca")
        && let Err(e) = idemgate_redis::Endpoint::parse(&text)
        && let Some(pw) = &password
    {
        assert!(!e.to_string().contains(pw.as_str()), "{e}");
    }
}
