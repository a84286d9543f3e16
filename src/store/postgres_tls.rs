//! TLS to PostgreSQL, as `sslmode` and `sslrootcert` in the store's URL say,
//! read as libpq reads them (`prefer` when absent): sqlx makes the
//! connection; this checks the CA file first, so that a missing or broken
//! one is named with its reason, and says which TLS a connection used.

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::StoreError;
use crate::tls_client::ClientTls;

/// `sslmode` as written in a URL.
pub(super) fn mode_name(options: &PgConnectOptions) -> &'static str {
    match options.get_ssl_mode() {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// The CA file `sslrootcert` names, read as the TLS clients read theirs:
/// an unreadable file, or one without a certificate, is refused naming it
/// and the reason before any connection is tried.
pub(super) fn check_root_cert(url: &str) -> Result<(), StoreError> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if matches!(key, "sslrootcert" | "ssl-root-cert" | "ssl-ca") && !value.is_empty() {
            let settings = ClientTls {
                ca_file: Some(value.into()),
                identity: None,
                alpn: Vec::new(),
            };
            settings
                .client_config()
                .map_err(|e| StoreError::Setup(format!("sslrootcert: {e}")))?;
        }
    }
    Ok(())
}

/// What TLS the connection that runs it uses: its protocol version, or
/// `None` without TLS.
pub(super) const TLS_VERSION_QUERY: &str = "SELECT COALESCE((SELECT version FROM pg_stat_ssl \
     WHERE pid = pg_backend_pid() AND ssl), '')";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_root_cert_is_named_with_its_reason() {
        let url = "postgres://kg:secret-pw@db.example/keygate?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem";
        let error = check_root_cert(url).unwrap_err().to_string();
        assert!(
            error.contains("sslrootcert: /nonexistent/ca.pem"),
            "{error}"
        );
        assert!(error.contains("No such file"), "{error}");
        assert!(!error.contains("secret-pw"), "{error}");
        check_root_cert("postgres://kg@db.example/keygate?sslmode=require").unwrap();
    }

    #[test]
    fn the_mode_is_prefer_unless_the_url_says_otherwise() {
        let mode = |url: &str| mode_name(&url.parse::<PgConnectOptions>().unwrap());
        assert_eq!(mode("postgres://kg@db.example/keygate"), "prefer");
        assert_eq!(
            mode("postgres://kg@db.example/keygate?sslmode=verify-full"),
            "verify-full"
        );
        assert_eq!(
            mode("postgres://kg@db.example/keygate?sslmode=disable"),
            "disable"
        );
    }
}
