//! TLS client settings, in one place for every connection keygate opens to a
//! service (the store's PostgreSQL, Redis): the roots it trusts and the
//! certificate it may show. Verification is always on; there is no setting
//! that turns it off.
//!
//! The roots are the system's (honouring `SSL_CERT_FILE` and `SSL_CERT_DIR`,
//! as the mail client does) plus an optional CA file, for a managed service
//! whose certificates a private CA signs. Errors name the file and the
//! reason. Imports nothing of keygate's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// What a TLS client trusts and shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM certificates trusted besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM certificate chain and its PEM private key, for a server that
    /// asks for a client certificate.
    pub identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsClientError {
    /// A file could not be read or does not hold what it should.
    #[error("{}: {reason}", .path.display())]
    File { path: PathBuf, reason: String },
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

    /// A rustls client configuration trusting `system` (what the system's
    /// store gave, or why it gave nothing) and the CA file.
    fn client_config_over(
        &self,
        system: Result<Vec<CertificateDer<'static>>, String>,
    ) -> Result<rustls::ClientConfig, TlsClientError> {
        let mut roots = RootCertStore::empty();
        let system_problem = match system {
            Ok(certs) => {
                // A system store may hold a certificate rustls cannot use;
                // the others still count.
                roots.add_parsable_certificates(certs);
                None
            }
            Err(problem) => Some(problem),
        };
        if let Some(path) = &self.ca_file {
            for cert in read_certificates(path)? {
                roots.add(cert).map_err(|e| file_error(path, e))?;
            }
        }
        if roots.is_empty() {
            return Err(TlsClientError::NoRoots(system_problem.unwrap_or_else(
                || "the system's store is empty and no CA file is set".into(),
            )));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsClientError::NoRoots(e.to_string()))?
            .with_root_certificates(roots);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = read_certificates(cert)?;
                let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    TlsClientError::Identity {
                        cert: cert.clone(),
                        key: key.clone(),
                        reason: e.to_string(),
                    }
                })
            }
        }
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
