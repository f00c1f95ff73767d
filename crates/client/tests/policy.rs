//! The client's policy, written as the gateway's `[client_retry]` table,
//! loads into the gateway's configuration unchanged: `idemgate check` then
//! sizes `done_ttl` against what this client really does.

use std::time::Duration;

use idemgate_client::{IdempotencyKey, Jitter, RetryPolicy};
use idemgate_gateway::config::{GatewayConfig, Overrides};

#[test]
fn the_policy_loads_as_the_gateways_client_retry_table() {
    let mut policy = RetryPolicy::default();
    policy.attempts = 5;
    policy.attempt_timeout = Some(Duration::from_secs(30));
    policy.backoff_base = Duration::from_millis(250);
    policy.backoff_cap = Duration::from_secs(4);
    policy.jitter = Jitter::Equal;
    let toml = format!(
        "store = \"memory:\"\nupstream = \"http://127.0.0.1:9\"\n\n{}",
        policy.client_retry_toml()
    );
    let path =
        std::env::temp_dir().join(format!("idemgate-client-{}.toml", IdempotencyKey::mint()));
    std::fs::write(&path, toml).unwrap();
    let loaded = GatewayConfig::load(Some(&path), &Overrides::default());
    std::fs::remove_file(&path).unwrap();
    let config = loaded.unwrap();

    let seen = config.client_retry;
    assert_eq!(seen.attempts, 5);
    assert_eq!(seen.attempt_timeout, Duration::from_secs(30));
    assert_eq!(seen.backoff_base, Duration::from_millis(250));
    assert_eq!(seen.backoff_cap, Duration::from_secs(4));
    assert_eq!(format!("{:?}", seen.jitter), "Equal");
    // The same backoff bound on both sides.
    for retry in 0..6 {
        assert_eq!(
            seen.max_backoff(retry),
            policy.max_backoff(retry),
            "retry {retry}"
        );
    }
}
