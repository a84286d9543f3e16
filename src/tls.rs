//! TLS: the server config (TLS 1.2 and 1.3, ALPN h2 and http/1.1), the served
//! certificate behind a resolver that can be swapped without a restart, and the
//! development certificate generated when none is configured.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Installs the crypto backend once per process; jsonwebtoken panics at first
/// use without one. Safe to call repeatedly.
pub(crate) fn install_crypto_provider() {
    let _ = jsonwebtoken::crypto::aws_lc::DEFAULT_PROVIDER.install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{0}: no certificate found")]
    NoCertificate(PathBuf),
    #[error("{path}: unusable private key: {message}")]
    Key { path: PathBuf, message: String },
    #[error("generating the development certificate: {0}")]
    Generate(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A loaded certificate chain and key, with the leaf's expiry.
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// Unix time the leaf certificate stops being valid, when readable.
    pub not_after: Option<i64>,
}

/// Serves whichever certificate was loaded last.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        CertResolver {
            current: RwLock::new(key),
        }
    }

    /// Swaps the served certificate; new handshakes get it at once.
    pub fn replace(&self, key: Arc<CertifiedKey>) {
        if let Ok(mut current) = self.current.write() {
            *current = key;
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|k| k.clone())
    }
}

/// The rustls server configuration shared by every TLS connection.
pub(crate) fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // Stateless session tickets (encrypted under a key rotated every six
    // hours, as rustls's ticketer does), in place of rustls's default cache
    // of 256 sessions: a fleet of devices reconnecting together resumed
    // only as far as the last 256 sessions reached, and every other one
    // paid a full handshake (`benches/run`'s resumed case, 512 clients:
    // none resumed). A ticket resumes on the replica that issued it.
    config.ticketer =
        rustls::crypto::aws_lc_rs::Ticketer::new().map_err(|e| TlsError::Config(e.to_string()))?;
    // The server's order (AES-256-GCM, AES-128-GCM, ChaCha20) wins over a
    // client's: a client cannot steer the handshake to its weakest choice.
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// Checks the certificate and key files as `check-config` does: each file
/// holds what its setting names (not the other one, as when the two are
/// swapped), and the key matches the certificate. One message per problem.
pub fn check_files(cert_path: &Path, key_path: &Path) -> Vec<String> {
    let kinds = |path: &Path| -> Result<(bool, bool), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
        Ok((
            text.contains("-----BEGIN CERTIFICATE-----"),
            text.contains("PRIVATE KEY-----"),
        ))
    };
    let mut problems = Vec::new();
    let cert = kinds(cert_path);
    let key = kinds(key_path);
    match &cert {
        Err(e) => problems.push(format!("tls.cert: {e}")),
        Ok((false, true)) => problems.push(format!(
            "tls.cert: {} holds a private key, not a certificate (are tls.cert and tls.key swapped?)",
            cert_path.display()
        )),
        Ok((false, false)) => problems.push(format!(
            "tls.cert: {} holds no PEM certificate",
            cert_path.display()
        )),
        Ok(_) => {}
    }
    match &key {
        Err(e) => problems.push(format!("tls.key: {e}")),
        Ok((true, false)) => problems.push(format!(
            "tls.key: {} holds a certificate, not a private key (are tls.cert and tls.key swapped?)",
            key_path.display()
        )),
        Ok((false, false)) => problems.push(format!(
            "tls.key: {} holds no PEM private key",
            key_path.display()
        )),
        Ok(_) => {}
    }
    if problems.is_empty()
        && let Err(error) = load_files(cert_path, key_path)
    {
        problems.push(format!("tls: {error}"));
    }
    problems
}

/// Loads a PEM certificate chain and private key.
pub(crate) fn load_files(cert_path: &Path, key_path: &Path) -> Result<LoadedCert, TlsError> {
    let read_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| read_err(cert_path, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(cert_path, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| read_err(key_path, &e))?;
    certified(certs, key, key_path)
}

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    key_path: &Path,
) -> Result<LoadedCert, TlsError> {
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: key_path.to_path_buf(),
            message: e.to_string(),
        })?;
    let not_after = certs.first().and_then(|c| not_after(c.as_ref()));
    let key = CertifiedKey::new(certs, signing_key);
    key.keys_match().map_err(|e| TlsError::Key {
        path: key_path.to_path_buf(),
        message: format!("does not match the certificate: {e}"),
    })?;
    Ok(LoadedCert {
        key: Arc::new(key),
        not_after,
    })
}

/// Paths of the development CA, certificate and key under the data directory.
pub fn dev_paths(data_dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        data_dir.join("dev-ca.pem"),
        data_dir.join("dev-cert.pem"),
        data_dir.join("dev-key.pem"),
    )
}

/// Loads the development certificate from the data directory, generating it
/// (a local CA and a `localhost` / `127.0.0.1` / `::1` leaf) on first start.
pub fn load_or_generate_dev(data_dir: &Path) -> Result<LoadedCert, TlsError> {
    let (ca_path, cert_path, key_path) = dev_paths(data_dir);
    if cert_path.is_file() && key_path.is_file() {
        return load_files(&cert_path, &key_path);
    }
    std::fs::create_dir_all(data_dir)
        .map_err(|e| TlsError::Generate(format!("{}: {e}", data_dir.display())))?;
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let year = 1970 + (crate::clock::now_secs() / 31_556_952) as i32;

    let ca_key = rcgen::KeyPair::generate().map_err(generate)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "keygate development CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca_params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    ca_params.not_after = rcgen::date_time_ymd(year + 3, 1, 1);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(generate)?;

    let leaf_key = rcgen::KeyPair::generate().map_err(generate)?;
    let mut params = rcgen::CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])
    .map_err(generate)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "keygate development certificate");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf = params.signed_by(&leaf_key, &issuer).map_err(generate)?;

    write_file(&ca_path, ca_cert.pem().as_bytes(), false)?;
    write_file(
        &cert_path,
        format!("{}{}", leaf.pem(), ca_cert.pem()).as_bytes(),
        false,
    )?;
    write_file(&key_path, leaf_key.serialize_pem().as_bytes(), true)?;
    tracing::warn!(
        ca = %ca_path.display(),
        "generated a self-signed DEVELOPMENT certificate for localhost; configure [tls] cert and key for production"
    );
    load_files(&cert_path, &key_path)
}

fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    options
        .open(path)
        .and_then(|mut f| f.write_all(contents))
        .map_err(|e| TlsError::Generate(format!("{}: {e}", path.display())))
}

// --- certificate expiry, read from the DER without a full X.509 parser --------

/// Reads one DER element: (tag, contents, rest).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The `notAfter` of a certificate as Unix time.
pub(crate) fn not_after(cert_der: &[u8]) -> Option<i64> {
    let (_, cert, _) = der_element(cert_der)?;
    let (_, tbs, _) = der_element(cert)?;
    let mut rest = tbs;
    let (tag, _, after) = der_element(rest)?;
    if tag == 0xa0 {
        rest = after; // explicit version
    }
    for _ in 0..3 {
        let (_, _, after) = der_element(rest)?; // serial, signature, issuer
        rest = after;
    }
    let (_, validity, _) = der_element(rest)?;
    let (_, _, after_before) = der_element(validity)?;
    let (tag, time, _) = der_element(after_before)?;
    parse_time(tag, std::str::from_utf8(time).ok()?)
}

fn parse_time(tag: u8, text: &str) -> Option<i64> {
    let text = text.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 if text.len() == 12 => {
            let yy: i64 = text[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        0x18 if text.len() == 14 => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| rest.get(i..i + 2)?.parse::<i64>().ok();
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_certificate_is_generated_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_generate_dev(dir.path()).unwrap();
        let (ca, cert, key) = dev_paths(dir.path());
        assert!(ca.is_file() && cert.is_file() && key.is_file());
        let pem = std::fs::read(&cert).unwrap();
        let second = load_or_generate_dev(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(&cert).unwrap(),
            pem,
            "reused, not regenerated"
        );
        assert_eq!(first.key.cert[0], second.key.cert[0]);
        let expiry = first.not_after.unwrap();
        assert!(expiry > crate::clock::now_secs() + 86_400 * 180, "{expiry}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    #[test]
    fn handshakes_offer_only_forward_secret_aead_suites_in_the_servers_order() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load_or_generate_dev(dir.path()).unwrap();
        let config = server_config(Arc::new(CertResolver::new(loaded.key))).unwrap();
        assert!(config.ignore_client_order);
        let suites = &config.crypto_provider().cipher_suites;
        assert!(!suites.is_empty());
        for suite in suites {
            let name = format!("{:?}", suite.suite());
            assert!(
                name.contains("GCM") || name.contains("CHACHA20_POLY1305"),
                "{name} is not an AEAD suite"
            );
            assert!(
                name.starts_with("TLS13_") || name.starts_with("TLS_ECDHE_"),
                "{name} is not forward secret"
            );
        }
    }

    /// Moves TLS records both ways until neither side has more to say.
    fn exchange(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
        let mut wire = Vec::new();
        while client.wants_write() || server.wants_write() {
            while client.wants_write() {
                wire.clear();
                client.write_tls(&mut wire).unwrap();
                server.read_tls(&mut &wire[..]).unwrap();
                server.process_new_packets().unwrap();
            }
            while server.wants_write() {
                wire.clear();
                server.write_tls(&mut wire).unwrap();
                client.read_tls(&mut &wire[..]).unwrap();
                client.process_new_packets().unwrap();
            }
        }
    }

    #[test]
    fn a_fleet_larger_than_a_session_cache_resumes_every_session() {
        use rustls::pki_types::pem::PemObject as _;
        let dir = tempfile::tempdir().unwrap();
        let loaded = load_or_generate_dev(dir.path()).unwrap();
        let server = server_config(Arc::new(CertResolver::new(loaded.key))).unwrap();
        let (ca, _, _) = dev_paths(dir.path());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_file(&ca).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        // 600 devices, each with its own session store: more than rustls's
        // default server cache (256) holds.
        let devices: Vec<Arc<rustls::ClientConfig>> = (0..600)
            .map(|_| {
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap()
                    .with_root_certificates(roots.clone())
                    .with_no_client_auth()
                    .into()
            })
            .collect();
        let connect = |device: &Arc<rustls::ClientConfig>| {
            let name = "localhost".try_into().unwrap();
            let mut client = rustls::ClientConnection::new(device.clone(), name).unwrap();
            let mut conn = rustls::ServerConnection::new(server.clone()).unwrap();
            exchange(&mut client, &mut conn);
            assert!(!client.is_handshaking());
            client.handshake_kind()
        };
        for device in &devices {
            assert_eq!(connect(device), Some(rustls::HandshakeKind::Full));
        }
        for device in &devices {
            assert_eq!(connect(device), Some(rustls::HandshakeKind::Resumed));
        }
    }

    #[test]
    fn civil_dates_convert_to_unix_time() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(parse_time(0x17, "300101000000Z"), Some(1_893_456_000));
        assert_eq!(parse_time(0x18, "20300101000000Z"), Some(1_893_456_000));
        assert_eq!(parse_time(0x18, "garbage"), None);
    }

    #[test]
    fn mismatched_key_is_refused() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        load_or_generate_dev(a.path()).unwrap();
        load_or_generate_dev(b.path()).unwrap();
        let (_, cert, _) = dev_paths(a.path());
        let (_, _, key) = dev_paths(b.path());
        assert!(matches!(load_files(&cert, &key), Err(TlsError::Key { .. })));
    }
}
