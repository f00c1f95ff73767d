//! The example configuration shipped in config/ must load: README points
//! newcomers at it. Its upstreams are HTTPS, so without the `tls` feature the
//! load must fail and say why.

use std::path::Path;

use idemgate_gateway::config::{GatewayConfig, Overrides};

#[test]
fn shipped_example_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/idemgate.example.toml");
    let loaded = GatewayConfig::load(Some(&path), &Overrides::default());
    if cfg!(feature = "tls") {
        let config =
            loaded.unwrap_or_else(|e| panic!("config/idemgate.example.toml does not load: {e}"));
        assert_eq!(config.routes.len(), 2);
        assert!(config.route_for("/v1/chat/completions").is_some());
        assert!(config.route_for("/v1/messages").is_some());
        // The example is also what a sound configuration looks like, once
        // it has its own key file (no key is shipped: a published key
        // protects nothing).
        assert_eq!(config.encryption_key_file, None);
        let dir = tempfile::tempdir().expect("create a temp dir");
        let keys = dir.path().join("keys");
        let line = idemgate_seal::generate_key_line("example").expect("generate a key");
        std::fs::write(&keys, format!("*{line}\n")).expect("write the key file");
        let mut config = config;
        config.encryption_key_file = Some(keys);
        let findings = idemgate_gateway::plan::findings(&config);
        assert!(findings.is_empty(), "{findings:#?}");
    } else {
        let err = loaded
            .expect_err("https upstreams need the tls feature")
            .to_string();
        assert!(err.contains("tls") || err.contains("https"), "{err}");
    }
}
