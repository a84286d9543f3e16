use std::sync::Arc;

use super::*;

/// A CA and a `localhost` server certificate it signed, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, name: &str) -> Pki {
    pki_for(dir, name, &["localhost"])
}

/// A CA and a certificate it signed for `names` (DNS names or IP
/// addresses), as PEM files in `dir`.
fn pki_for(dir: &Path, name: &str, names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} CA"));
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    let params = rcgen::CertificateParams::new(names).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf = params.signed_by(&leaf_key, &issuer).unwrap();
    let files = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        cert: dir.join(format!("{name}-cert.pem")),
        key: dir.join(format!("{name}-key.pem")),
    };
    std::fs::write(&files.ca, ca_cert.pem()).unwrap();
    std::fs::write(&files.cert, leaf.pem()).unwrap();
    std::fs::write(&files.key, leaf_key.serialize_pem()).unwrap();
    files
}

/// A server configuration showing `server`'s certificate and offering
/// `http/1.1` and `h2` by ALPN.
fn served_by(server: &Pki) -> rustls::ServerConfig {
    let chain = read_certificates(&server.cert).unwrap();
    let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// A handshake of `client` with a server showing `server`'s certificate,
/// as `host`.
async fn handshake(client: rustls::ClientConfig, server: &Pki, host: &str) -> Result<(), String> {
    let (near, far) = tokio::io::duplex(16 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(served_by(server)));
    let served = tokio::spawn(async move { acceptor.accept(far).await.map(|_| ()) });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let result = connector.connect(name, near).await.map(|_| ());
    served.abort();
    result.map_err(|e| e.to_string())
}

/// A handshake made by `connector` with a server showing `server`'s
/// certificate, connecting to `host`; the protocol ALPN chose.
async fn connect_with(
    connector: &Connector,
    server: &Pki,
    host: &str,
) -> Result<Option<Vec<u8>>, String> {
    let (near, far) = tokio::io::duplex(16 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(served_by(server)));
    let served = tokio::spawn(async move { acceptor.accept(far).await.map(|_| ()) });
    let result = connector.connect(host, near).await;
    served.abort();
    let stream = result.map_err(|e| e.to_string())?;
    Ok(stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
}

/// A connector trusting `ca` alone, offering `http/1.1`, verifying
/// `server_name` when given.
fn connector_trusting(ca: &Path, server_name: Option<&str>) -> Connector {
    let mut settings = trusting(ca);
    settings.alpn = vec![b"http/1.1".to_vec()];
    let config = settings.client_config_over(Ok(vec![])).unwrap();
    Connector::over(config, server_name).unwrap()
}

fn trusting(ca: &Path) -> ClientTls {
    ClientTls {
        ca_file: Some(ca.to_path_buf()),
        identity: None,
        alpn: Vec::new(),
    }
}

#[tokio::test]
async fn a_server_signed_by_the_ca_file_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let config = trusting(&service.ca)
        .client_config_over(Ok(vec![]))
        .unwrap();
    handshake(config, &service, "localhost").await.unwrap();
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let other = pki(dir.path(), "other");
    let config = trusting(&other.ca).client_config_over(Ok(vec![])).unwrap();
    let error = handshake(config, &service, "localhost").await.unwrap_err();
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[tokio::test]
async fn a_server_named_otherwise_than_its_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let config = trusting(&service.ca)
        .client_config_over(Ok(vec![]))
        .unwrap();
    let error = handshake(config, &service, "db.example").await.unwrap_err();
    assert!(error.contains("not valid for name"), "{error}");
}

#[test]
fn the_system_roots_are_trusted_besides_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let system = read_certificates(&service.ca).unwrap();
    // No CA file: the system's roots alone make a configuration.
    ClientTls::default().client_config_over(Ok(system)).unwrap();
}

#[test]
fn file_problems_name_the_file_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let error = trusting(&missing)
        .client_config_over(Ok(vec![]))
        .unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with(&missing.display().to_string()), "{text}");
    assert!(text.contains("No such file"), "{text}");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let text = trusting(&empty)
        .client_config_over(Ok(vec![]))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("empty.pem") && text.contains("no PEM certificate"),
        "{text}"
    );
}

#[test]
fn without_any_root_the_reason_the_system_gave_none_is_told() {
    let error = ClientTls::default()
        .client_config_over(Err("/etc/none.pem: not found".into()))
        .unwrap_err();
    assert_eq!(
        error,
        TlsClientError::NoRoots("/etc/none.pem: not found".into())
    );
}

#[test]
fn a_client_certificate_is_shown_and_a_missing_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let client = pki(dir.path(), "client");
    let mut settings = trusting(&service.ca);
    settings.identity = Some((client.cert.clone(), client.key.clone()));
    let config = settings.client_config_over(Ok(vec![])).unwrap();
    assert!(config.client_auth_cert_resolver.has_certs());

    let missing = dir.path().join("missing-key.pem");
    settings.identity = Some((client.cert.clone(), missing.clone()));
    let text = settings
        .client_config_over(Ok(vec![]))
        .unwrap_err()
        .to_string();
    assert!(text.contains("missing-key.pem"), "{text}");
}

#[test]
fn the_roots_as_pem_are_the_system_ones_and_the_ca_files() {
    let dir = tempfile::tempdir().unwrap();
    let system = pki(dir.path(), "system");
    let service = pki(dir.path(), "service");
    let roots = trusting(&service.ca)
        .roots_over(Ok(read_certificates(&system.ca).unwrap()))
        .unwrap();
    let pem = pem_certificates(&roots);
    let read: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .unwrap();
    let mut expected = read_certificates(&system.ca).unwrap();
    expected.extend(read_certificates(&service.ca).unwrap());
    assert_eq!(read, expected);
    // A certificate that cannot be a root, from the system's store, is left out.
    let roots = ClientTls::default()
        .roots_over(Ok(vec![CertificateDer::from(vec![1, 2, 3])]))
        .unwrap_err();
    assert!(matches!(roots, TlsClientError::NoRoots(_)), "{roots}");
}

#[test]
fn a_ca_file_is_checked_alone_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    check_ca_file(&service.ca).unwrap();
    let text = check_ca_file(&service.key).unwrap_err().to_string();
    assert!(
        text.contains("service-key.pem") && text.contains("no PEM certificate"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_certificate_is_told_apart_from_other_handshake_failures() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let other = pki(dir.path(), "other");
    let config = trusting(&other.ca).client_config_over(Ok(vec![])).unwrap();
    let chain = read_certificates(&service.cert).unwrap();
    let key = PrivateKeyDer::from_pem_file(&service.key).unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let (near, far) = tokio::io::duplex(16 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let served = tokio::spawn(async move { acceptor.accept(far).await.map(|_| ()) });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config.clone()));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let error = connector.connect(name.clone(), near).await.unwrap_err();
    served.abort();
    let refused = certificate_error(&error).expect("a certificate error");
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

    // A peer that answers with something other than TLS is not one.
    let (near, mut far) = tokio::io::duplex(16 * 1024);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut hello = [0u8; 512];
        let _ = far.read(&mut hello).await;
        let _ = far.write_all(b"-ERR unknown command\r\n").await;
    });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let error = connector.connect(name, near).await.unwrap_err();
    assert_eq!(certificate_error(&error), None, "{error}");
    let refused = std::io::Error::other("connection refused");
    assert_eq!(certificate_error(&refused), None);
}

#[test]
fn protocol_versions_are_named_as_people_write_them() {
    assert_eq!(version_name(rustls::ProtocolVersion::TLSv1_3), "TLSv1.3");
    assert_eq!(version_name(rustls::ProtocolVersion::TLSv1_2), "TLSv1.2");
}

#[tokio::test]
async fn a_connector_verifies_the_host_and_offers_http1_alone() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let connector = connector_trusting(&service.ca, None);
    let chosen = connect_with(&connector, &service, "localhost").await;
    // The server would take h2 too: only what keygate speaks is offered.
    assert_eq!(chosen.unwrap(), Some(b"http/1.1".to_vec()));
    let error = connect_with(&connector, &service, "db.example")
        .await
        .unwrap_err();
    assert!(error.contains("not valid for name"), "{error}");
}

#[tokio::test]
async fn a_configured_server_name_is_verified_in_place_of_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let named = connector_trusting(&service.ca, Some("localhost"));
    connect_with(&named, &service, "10.1.2.3").await.unwrap();
    let other = connector_trusting(&service.ca, Some("api.example"));
    let error = connect_with(&other, &service, "localhost")
        .await
        .unwrap_err();
    assert!(error.contains("not valid for name"), "{error}");
}

#[tokio::test]
async fn an_ip_address_host_is_verified_against_the_certificates_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let by_address = pki_for(dir.path(), "addressed", &["127.0.0.1", "::1"]);
    let connector = connector_trusting(&by_address.ca, None);
    connect_with(&connector, &by_address, "127.0.0.1")
        .await
        .unwrap();
    connect_with(&connector, &by_address, "[::1]")
        .await
        .unwrap();
    let error = connect_with(&connector, &by_address, "127.0.0.2")
        .await
        .unwrap_err();
    assert!(error.contains("not valid for name"), "{error}");
    // A name is not an address the certificate holds.
    let by_name = pki(dir.path(), "named");
    let connector = connector_trusting(&by_name.ca, None);
    assert!(
        connect_with(&connector, &by_name, "127.0.0.1")
            .await
            .is_err()
    );
}

#[test]
fn a_server_name_that_is_no_name_is_refused_and_each_connector_has_its_own_id() {
    let dir = tempfile::tempdir().unwrap();
    let service = pki(dir.path(), "service");
    let config = || {
        trusting(&service.ca)
            .client_config_over(Ok(vec![]))
            .unwrap()
    };
    let error = Connector::over(config(), Some("not a name")).unwrap_err();
    assert_eq!(error, TlsClientError::ServerName("not a name".into()));
    let one = Connector::over(config(), None).unwrap();
    let two = Connector::over(config(), None).unwrap();
    assert_ne!(one.id(), two.id());
    assert_ne!(one.id(), 0);
    assert_eq!(one.clone().id(), one.id());
}
