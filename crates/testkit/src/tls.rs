//! Certificates for the stores' TLS suites: a throwaway certificate
//! authority and a server certificate for `localhost` and `127.0.0.1`
//! signed by it, made fresh by each test process.
//!
//! The stores' TLS tests start their own servers (Redis with `--tls-port`,
//! a private PostgreSQL with `ssl=on`) with these files, and connect
//! trusting only the authority's certificate: the connection is verified
//! the way a managed service's is, with no certificate checked in and none
//! that can expire between runs.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A certificate authority and a server certificate it signed, in PEM.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The authority's certificate: what clients trust.
    pub ca_pem: String,
    /// The server's certificate (`localhost`, `127.0.0.1`).
    pub cert_pem: String,
    /// The server's private key (PKCS#8).
    pub key_pem: String,
}

/// Where [`TestCerts::write`] put the files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// `ca.pem`.
    pub ca: PathBuf,
    /// `server.crt`.
    pub cert: PathBuf,
    /// `server.key` (mode 0600: PostgreSQL refuses a key others can read).
    pub key: PathBuf,
}

impl TestCerts {
    /// A new authority, and a server certificate for `localhost` and
    /// `127.0.0.1` signed by it.
    pub fn generate() -> Self {
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "idemgate test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().expect("generate the server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server parameters");
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("sign the server certificate");
        Self {
            ca_pem: ca_cert.pem(),
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
        }
    }

    /// Writes `ca.pem`, `server.crt` and `server.key` into `dir`.
    pub fn write(&self, dir: &Path) -> CertFiles {
        let files = CertFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
        };
        std::fs::write(&files.ca, &self.ca_pem).expect("write ca.pem");
        std::fs::write(&files.cert, &self.cert_pem).expect("write server.crt");
        std::fs::write(&files.key, &self.key_pem).expect("write server.key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600))
                .expect("chmod 600 server.key");
        }
        files
    }
}
