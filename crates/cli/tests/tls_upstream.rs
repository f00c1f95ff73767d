//! `idemgate serve` in front of an HTTPS upstream, as a real process.
//!
//! The upstream is the simulator behind a TLS terminator made here, with a
//! certificate signed by a throwaway authority. The gateway trusts the
//! platform's roots; `SSL_CERT_FILE` names the authority for the process, as
//! an operator would for a private CA. Without it the handshake must fail:
//! an upstream whose certificate is not trusted never sees the request.
#![cfg(feature = "tls")]

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemgate_testkit::tls::TestCerts;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

mod support;

use support::{free_port, sim, spawn_quiet, wait_admin};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");

/// A TLS terminator on a loopback port in front of `backend`; counts the
/// handshakes that completed.
struct TlsFront {
    port: u16,
    handshakes: Arc<AtomicUsize>,
}

async fn tls_front(certs: &TestCerts, backend: std::net::SocketAddr) -> TlsFront {
    let chain = CertificateDer::pem_slice_iter(certs.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("parse the server certificate");
    let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).expect("parse the key");
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("a server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("an address").port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&handshakes);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut plain) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    TlsFront { port, handshakes }
}

/// `idemgate serve` in front of `upstream`, with `SSL_CERT_FILE` set to
/// `ca_file`; returns the process and its listen port once it is ready.
async fn serve(upstream: &str, ca_file: &std::path::Path, dir: &std::path::Path) -> (Child, u16) {
    let (port, admin) = (free_port().await, free_port().await);
    let mut child = spawn_quiet(
        Command::new(BIN)
            .args(["serve", "--upstream", upstream, "--store", "memory:"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .env("SSL_CERT_FILE", ca_file)
            .env_remove("SSL_CERT_DIR")
            .current_dir(dir),
        Stdio::null(),
    );
    wait_admin(admin, "/readyz", &mut child).await;
    (child, port)
}

/// Sends a chat completion with `key` to the gateway on `port` and asserts
/// the answer's status is `status`.
async fn chat(port: u16, key: &str, status: u16) -> reqwest::Response {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(r#"{"model":"sim-1","messages":[{"role":"user","content":"hello over tls"}]}"#)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(r.status(), status);
    r
}

/// The simulator behind a TLS terminator, and `idemgate serve` in front
/// of it trusting the terminator's authority (`trusted`) or another one.
struct Setup {
    sim: idemgate_llm_sim::SimHandle,
    front: TlsFront,
    port: u16,
    _gateway: Child,
    _dirs: [tempfile::TempDir; 2],
}

async fn setup(trusted: bool) -> Setup {
    let sim = sim().await;
    let certs = TestCerts::generate();
    let dir = tempfile::tempdir().expect("a temp dir");
    let other = tempfile::tempdir().expect("a temp dir");
    let ca = if trusted {
        certs.write(dir.path()).ca
    } else {
        TestCerts::generate().write(other.path()).ca
    };
    let backend = sim
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("the simulator's address");
    let front = tls_front(&certs, backend).await;
    let upstream = format!("https://localhost:{}", front.port);
    let (gateway, port) = serve(&upstream, &ca, dir.path()).await;
    Setup {
        sim,
        front,
        port,
        _gateway: gateway,
        _dirs: [dir, other],
    }
}

#[tokio::test]
async fn an_https_upstream_with_a_trusted_certificate_runs_once_and_replays() {
    // Bound whole: the gateway and the directories live to the end.
    let up = setup(true).await;
    let (sim, front, port) = (&up.sim, &up.front, up.port);

    let first = chat(port, "tls-key-1", 200).await;
    assert_eq!(first.headers()["idempotent-replayed"], "false");
    let first = first.bytes().await.expect("the first body");
    let again = chat(port, "tls-key-1", 200).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("the replayed body"), first);
    assert_eq!(sim.executions_for("tls-key-1"), 1);
    assert!(front.handshakes.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn an_https_upstream_with_an_untrusted_certificate_is_refused_before_sending() {
    // The gateway trusts another authority only. Bound whole: the gateway
    // and the directories live to the end.
    let up = setup(false).await;
    let (sim, front, port) = (&up.sim, &up.front, up.port);

    let refused = chat(port, "tls-key-2", 502).await;
    let problem: serde_json::Value =
        serde_json::from_slice(&refused.bytes().await.expect("a body"))
            .expect("a problem document");
    assert_eq!(
        problem["type"],
        "https://idemgate.dev/problems/upstream-unavailable"
    );
    assert_eq!(front.handshakes.load(Ordering::SeqCst), 0);
    assert_eq!(sim.executions_for("tls-key-2"), 0);
    // Nothing ran, so the key was released: the same key is tried again
    // (and refused again) rather than answered from a stored failure.
    let retried = chat(port, "tls-key-2", 502).await;
    assert!(
        retried
            .headers()
            .get("idempotent-replayed")
            .is_none_or(|v| v == "false")
    );
}
