//! `idemgate keys show` on the networked stores: records written through the
//! engine on the local Redis and PostgreSQL (a random prefix / schema per
//! run) are read back by the command as its own process.

use std::time::Duration;

use idemgate_engine::{ClientKey, Engine, Fingerprint, ScopedKey};
use idemgate_gateway::{StoreUrl, open_records};
use tokio::process::Command;

mod support;
use support::on_fresh_stores;

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

async fn shows_executed_then_replayed(url: String) {
    let parsed = StoreUrl::parse(&url).expect("a valid literal");
    let store = open_records(&parsed, None)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e} (is the server running?)"));
    let engine = Engine::new(store).with_replica("replica-a");
    let key = ScopedKey::new("tenant-1", "/v1", ClientKey::mint());
    let fp = Fingerprint::of_request("POST", "/v1", b"{}", &[]);
    for _ in 0..2 {
        engine
            .execute(&key, &fp, || async { Ok::<_, std::io::Error>(42u32) })
            .await
            .expect("execute");
    }
    // The replay's timeline entry is written in the background: poll.
    let mut out = String::new();
    for _ in 0..100 {
        let o = Command::new(BIN)
            .args(["keys", "show", key.key.as_str(), "--tenant", "tenant-1"])
            .args(["--namespace", "/v1", "--store", &url])
            .output()
            .await
            .expect("run the binary");
        out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if out.contains("replayed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        out.contains("executed") && out.contains("replayed"),
        "{out}"
    );
    assert!(out.contains("replica-a"), "{out}");
}

on_fresh_stores!(shows_executed_then_replayed("keys"): keys_show_reads_redis, keys_show_reads_postgres);
