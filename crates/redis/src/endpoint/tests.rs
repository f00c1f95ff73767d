use super::*;

fn urls(url: &str) -> Vec<String> {
    Endpoint::parse(url).expect("a valid URL parses").urls
}

#[test]
fn cluster_urls_split_per_node() {
    assert_eq!(
        urls("redis+cluster://a:1,b:2"),
        ["redis://a:1", "redis://b:2"]
    );
    assert_eq!(
        urls("redis+cluster://u:p@a:1,b:2/0"),
        ["redis://u:p@a:1/0", "redis://u:p@b:2/0"]
    );
    assert_eq!(
        urls("rediss+cluster://:p@a:1,b:2/?protocol=resp3"),
        [
            "rediss://:p@a:1/?protocol=resp3",
            "rediss://:p@b:2/?protocol=resp3"
        ]
    );
    assert_eq!(
        urls("redis://a:1/2?protocol=resp3"),
        ["redis://a:1/2?protocol=resp3"]
    );
    let e = Endpoint::parse("rediss+cluster://a:1").expect("parses");
    assert!(e.is_cluster() && e.is_tls());
    let e = Endpoint::parse("redis://a:1").expect("parses");
    assert!(!e.is_cluster() && !e.is_tls());
    assert!(Endpoint::parse("redis+cluster://").is_err());
}

#[cfg(feature = "tls")]
#[test]
fn tls_ca_is_read_and_taken_out_of_the_driver_url() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    )
    .expect("write the file");
    let url = format!(
        "rediss://:pw@h:6380/1?tls_ca={}&protocol=resp3",
        ca.display()
    );
    let e = Endpoint::parse(&url).expect("parses");
    assert_eq!(e.urls, ["rediss://:pw@h:6380/1?protocol=resp3"]);
    assert!(e.ca.is_some());
    let e = Endpoint::parse(&format!("rediss+cluster://a:1,b:2?tls_ca={}", ca.display()))
        .expect("parses");
    assert_eq!(e.urls, ["rediss://a:1", "rediss://b:2"]);
    assert!(e.ca.is_some());
}

#[test]
fn tls_ca_mistakes_are_named_without_the_password() {
    let plain = Endpoint::parse("redis://:s3cr3t-pw@h:1/?tls_ca=/x.pem").expect_err("no TLS");
    assert!(plain.to_string().contains("tls_ca"), "{plain}");
    let missing = Endpoint::parse("rediss://:s3cr3t-pw@h:1/?tls_ca=/nonexistent/ca.pem")
        .expect_err("no such file");
    let shown = format!("{missing} {missing:?}");
    assert!(shown.contains("/nonexistent/ca.pem"), "{shown}");
    assert!(!shown.contains("s3cr3t-pw"), "{shown}");
    let e = Endpoint::parse("redis+cluster://:s3cr3t-pw@a:1,b:2").expect("parses");
    assert!(!format!("{e:?}").contains("s3cr3t-pw"));
}

#[test]
fn node_clients_turn_nagle_off() {
    // redis 1.x leaves Nagle on: a command written while another awaits
    // its answer would wait for that answer's ACK.
    for url in [
        "redis://127.0.0.1:6379/0",
        "redis://:pw@127.0.0.1:6379/?protocol=resp3",
    ] {
        let client = Endpoint::parse(url)
            .and_then(|e| e.node_client())
            .expect("a valid URL makes a client");
        assert!(
            client.get_connection_info().tcp_settings().nodelay(),
            "{url}"
        );
    }
}
