//! TLS client settings, in one place for every connection keygate opens to a
//! service (the store's PostgreSQL, Redis, an `https://` upstream): the roots
//! it trusts, the certificate it may show and the protocols it offers.
//! Verification is always on; there is no setting that turns it off.
//! [`Connector`] is a configuration built from them, with the name a
//! server's certificate must bear, for connections keygate makes itself.
//!
//! The roots are the system's (honouring `SSL_CERT_FILE` and `SSL_CERT_DIR`,
//! as the mail client does) plus an optional CA file, for a managed service
//! whose certificates a private CA signs. Errors name the file and the
//! reason. Imports nothing of keygate's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

/// What a TLS client trusts and shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM certificates trusted besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM certificate chain and its PEM private key, for a server that
    /// asks for a client certificate.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The protocols offered by ALPN, most preferred first; none when empty.
    pub alpn: Vec<Vec<u8>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsClientError {
    /// A file could not be read or does not hold what it should.
    #[error("{}: {reason}", .path.display())]
    File { path: PathBuf, reason: String },
    /// A server name that is neither a DNS name nor an IP address.
    #[error("{0:?} is not a DNS name or an IP address")]
    ServerName(String),
    /// Neither the system nor a CA file gave a root to trust.
    #[error("no trusted root certificates: {0}")]
    NoRoots(String),
    /// The client certificate and key do not make an identity.
    #[error("client certificate {} with key {}: {reason}", .cert.display(), .key.display())]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

impl ClientTls {
    /// A rustls client configuration over the system's roots.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsClientError> {
        self.client_config_over(system_roots())
    }

    /// The roots, system's and CA file's, as one PEM text: for a client
    /// (the `redis` crate's) that takes its roots as PEM and trusts only
    /// those it is given.
    pub fn root_pem(&self) -> Result<Vec<u8>, TlsClientError> {
        Ok(pem_certificates(&self.roots_over(system_roots())?))
    }

    /// A rustls client configuration trusting `system` (what the system's
    /// store gave, or why it gave nothing) and the CA file.
    fn client_config_over(
        &self,
        system: Result<Vec<CertificateDer<'static>>, String>,
    ) -> Result<rustls::ClientConfig, TlsClientError> {
        let mut roots = RootCertStore::empty();
        for cert in self.roots_over(system)? {
            roots
                .add(cert)
                .map_err(|e| TlsClientError::NoRoots(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsClientError::NoRoots(e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certificates(cert)?;
                let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    TlsClientError::Identity {
                        cert: cert.clone(),
                        key: key.clone(),
                        reason: e.to_string(),
                    }
                })?
            }
        };
        config.alpn_protocols = self.alpn.clone();
        Ok(config)
    }

    /// The certificates trusted: those of `system` that can be roots (a
    /// system store may hold one rustls cannot use; the others still count)
    /// and every one of the CA file, which must all be usable.
    fn roots_over(
        &self,
        system: Result<Vec<CertificateDer<'static>>, String>,
    ) -> Result<Vec<CertificateDer<'static>>, TlsClientError> {
        let mut trusted = Vec::new();
        let system_problem = match system {
            Ok(certs) => {
                trusted.extend(certs.into_iter().filter(|cert| usable_root(cert).is_ok()));
                None
            }
            Err(problem) => Some(problem),
        };
        if let Some(path) = &self.ca_file {
            for cert in read_certificates(path)? {
                usable_root(&cert).map_err(|e| file_error(path, e))?;
                trusted.push(cert);
            }
        }
        if trusted.is_empty() {
            return Err(TlsClientError::NoRoots(system_problem.unwrap_or_else(
                || "the system's store is empty and no CA file is set".into(),
            )));
        }
        Ok(trusted)
    }
}

/// A client configuration built once from [`ClientTls`] (its files read
/// then), shared by every connection made with it: cheap to clone. Each
/// one built has an id of its own, by which connections made with one are
/// kept apart from those made with another (a pool's key).
#[derive(Clone)]
pub struct Connector(Arc<Built>);

struct Built {
    config: Arc<rustls::ClientConfig>,
    /// The name SNI sends and the server's certificate must bear, when it
    /// is not the host connected to.
    server_name: Option<ServerName<'static>>,
    id: u64,
}

impl Connector {
    /// A connector trusting and showing what `settings` say, over the
    /// system's roots; `server_name` (a DNS name or an IP address) in place
    /// of the host connected to.
    pub fn new(
        settings: &ClientTls,
        server_name: Option<&str>,
    ) -> Result<Connector, TlsClientError> {
        Connector::over(settings.client_config()?, server_name)
    }

    fn over(
        config: rustls::ClientConfig,
        server_name: Option<&str>,
    ) -> Result<Connector, TlsClientError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let server_name = server_name.map(server_name_of).transpose()?;
        Ok(Connector(Arc::new(Built {
            config: Arc::new(config),
            server_name,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        })))
    }

    /// This connector's own number, never 0 (which a key may use for
    /// "no TLS").
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The name a connection to `host` verifies: the configured server
    /// name, or `host` (a DNS name, or an IP address verified against the
    /// certificate's IP addresses).
    pub fn name_for(&self, host: &str) -> Result<ServerName<'static>, TlsClientError> {
        match &self.0.server_name {
            Some(name) => Ok(name.clone()),
            None => server_name_of(host),
        }
    }

    /// The TLS handshake over `io`, with the server `host` (see
    /// [`Connector::name_for`]).
    pub async fn connect<IO>(
        &self,
        host: &str,
        io: IO,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let name = self
            .name_for(host)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        tokio_rustls::TlsConnector::from(self.0.config.clone())
            .connect(name, io)
            .await
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("id", &self.0.id)
            .field("server_name", &self.0.server_name)
            .field("alpn", &self.0.config.alpn_protocols)
            .finish_non_exhaustive()
    }
}

/// `text` as a server name: an IP address (brackets around an IPv6 one
/// allowed), else a DNS name.
fn server_name_of(text: &str) -> Result<ServerName<'static>, TlsClientError> {
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    ServerName::try_from(bare.to_owned()).map_err(|_| TlsClientError::ServerName(text.to_owned()))
}

/// Checks a CA file alone, as a client will read it: readable, holding PEM
/// certificates that can all be roots. For validating a setting before any
/// connection is tried.
pub fn check_ca_file(path: &Path) -> Result<(), TlsClientError> {
    for cert in read_certificates(path)? {
        usable_root(&cert).map_err(|e| file_error(path, e))?;
    }
    Ok(())
}

/// Whether `cert` can be a trust anchor.
fn usable_root(cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    RootCertStore::empty().add(cert.clone().into_owned())
}

/// Certificates as PEM text.
fn pem_certificates(certs: &[CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine as _;
    let mut pem = String::new();
    for cert in certs {
        let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem.into_bytes()
}

/// A server's certificate refused: it does not chain to a trusted root,
/// names another host, has expired, or none was shown. Other TLS failures
/// (a server that does not speak TLS, a protocol both sides lack) are not.
pub fn is_certificate_error(error: &rustls::Error) -> bool {
    matches!(
        error,
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
    )
}

/// The certificate error behind an I/O error from a TLS handshake
/// (`tokio-rustls` reports them wrapped), if that is what it is.
pub fn certificate_error(error: &std::io::Error) -> Option<&rustls::Error> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .filter(|tls| is_certificate_error(tls))
}

/// A protocol version as people write it: `TLSv1.3`.
pub fn version_name(version: rustls::ProtocolVersion) -> String {
    match version {
        rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".into(),
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".into(),
        other => format!("{other:?}"),
    }
}

/// The system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` when set); why
/// there are none when there are none.
fn system_roots() -> Result<Vec<CertificateDer<'static>>, String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() && !found.errors.is_empty() {
        let reasons: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(reasons.join("; "));
    }
    Ok(found.certs)
}

/// Every PEM certificate in `path`; a file without any is an error.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsClientError> {
    let text = std::fs::read(path).map_err(|e| file_error(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsClientError {
    TlsClientError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests;
