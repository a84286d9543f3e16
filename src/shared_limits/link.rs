//! The connection to Redis through which replicas share their limits.
//!
//! One multiplexed connection per replica (the `redis` crate's connection
//! manager), opened lazily and reconnected by itself with backoff. Every
//! command is bounded by `redis.command_timeout`; a failure marks the link
//! down, and callers then decide from local state at once, without asking
//! Redis again, until the background sync finds it answering. The state is
//! exported as `keygate_redis_up`.
//!
//! A `rediss://` URL speaks TLS, trusting the system's roots and
//! `redis.ca_file` (built by `tls_client`, the one place for TLS client
//! settings). [`check_tls`] opens one TLS connection at start: a certificate
//! that does not verify is a configuration error, a Redis out of reach is
//! not (the link then falls back as for any outage).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation};

use crate::config::{RedisSettings, redacted_url};
use crate::telemetry::Metrics;
use crate::tls_client::{self, TlsClientError};

/// How often a fallback warning is logged at most, per kind of limit.
const WARN_EVERY_MS: i64 = 10_000;

/// Why Redis did not answer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis is down; deciding locally until it answers again")]
    Down,
    /// The roots for `rediss://` could not be gathered.
    #[error("redis.ca_file: {0}")]
    Roots(#[from] TlsClientError),
    /// The server's certificate does not verify: a configuration error.
    #[error(
        "redis.url {url}: the TLS certificate of {at} does not verify: {reason} \
         (checked against the system's roots and redis.ca_file)"
    )]
    Certificate {
        /// The URL without its password.
        url: String,
        at: String,
        reason: rustls::Error,
    },
    /// No TCP connection or no TLS handshake: Redis out of reach for now.
    #[error("redis.url {url}: cannot reach {at}: {reason}")]
    Unreachable {
        url: String,
        at: String,
        reason: String,
    },
}

/// A client for the configured Redis: `rediss://` over TLS trusting what
/// `tls_client` gathers (the system's roots and `redis.ca_file`).
pub fn client(settings: &RedisSettings) -> Result<redis::Client, LinkError> {
    let url = settings.url.as_str();
    match settings.tls() {
        None => Ok(redis::Client::open(url)?),
        Some(tls) => {
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(tls.root_pem()?),
            };
            Ok(redis::Client::build_with_tls(url, certificates)?)
        }
    }
}

/// For a `rediss://` URL, one TCP connection and TLS handshake within
/// `redis.connect_timeout`, with the same roots the link trusts: the
/// protocol version agreed (`TLSv1.3`). `None` for `redis://`.
pub async fn check_tls(settings: &RedisSettings) -> Result<Option<String>, LinkError> {
    let Some(tls) = settings.tls() else {
        return Ok(None);
    };
    let config = tls.client_config()?;
    let info = redis::IntoConnectionInfo::into_connection_info(settings.url.as_str())?;
    let redis::ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
        return Ok(None);
    };
    let at = format!("{host}:{port}");
    let url = redacted_url(&settings.url);
    let unreachable = |reason: String| LinkError::Unreachable {
        url: url.clone(),
        at: at.clone(),
        reason,
    };
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| unreachable(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        connector.connect(name, tcp).await
    };
    let stream = match tokio::time::timeout(settings.connect_timeout, attempt).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            return Err(match tls_client::certificate_error(&error) {
                Some(reason) => LinkError::Certificate {
                    url: url.clone(),
                    at: at.clone(),
                    reason: reason.clone(),
                },
                None => unreachable(error.to_string()),
            });
        }
        Err(_) => {
            let waited = settings.connect_timeout;
            return Err(unreachable(format!("no answer within {waited:?}")));
        }
    };
    let version = stream.get_ref().1.protocol_version();
    let mut stream = stream;
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
    Ok(Some(
        version.map_or_else(|| "TLS".into(), tls_client::version_name),
    ))
}

pub struct RedisLink {
    manager: ConnectionManager,
    prefix: String,
    command_timeout: Duration,
    /// Set when a command failed, cleared when one succeeds. A link not yet
    /// used is not down: the first command tries.
    down: AtomicBool,
    metrics: Arc<Metrics>,
    /// When each kind of fallback was last logged (epoch ms), by kind.
    warned: [AtomicI64; 3],
}

/// What fell back to local state, for the metric and the warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    Login = 0,
    Quota = 1,
    WebSocket = 2,
}

impl Fallback {
    pub const ALL: [Fallback; 3] = [Fallback::Login, Fallback::Quota, Fallback::WebSocket];

    pub fn label(self) -> &'static str {
        match self {
            Fallback::Login => "login",
            Fallback::Quota => "quota",
            Fallback::WebSocket => "websocket",
        }
    }
}

impl RedisLink {
    /// A link to the configured Redis; nothing is connected until first use.
    pub fn new(settings: &RedisSettings, metrics: Arc<Metrics>) -> Result<RedisLink, LinkError> {
        let client = client(settings)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.command_timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(2);
        let manager = ConnectionManager::new_lazy_with_config(client, config)?;
        metrics.limits.init_redis();
        Ok(RedisLink {
            manager,
            prefix: settings.key_prefix.clone(),
            command_timeout: settings.command_timeout,
            down: AtomicBool::new(false),
            metrics,
            warned: [AtomicI64::new(0), AtomicI64::new(0), AtomicI64::new(0)],
        })
    }

    /// `parts` after the configured key prefix.
    pub fn key(&self, parts: std::fmt::Arguments<'_>) -> String {
        format!("{}{parts}", self.prefix)
    }

    /// Whether the last command failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Runs a script unless the link is down; see [`RedisLink::probe`].
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LinkError> {
        if self.is_down() {
            return Err(LinkError::Down);
        }
        self.probe(invocation).await
    }

    /// Runs a script whatever the link's state, within the command timeout,
    /// and records whether Redis answered.
    pub async fn probe<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LinkError> {
        let mut connection = self.manager.clone();
        let answer = tokio::time::timeout(
            self.command_timeout,
            invocation.invoke_async(&mut connection),
        )
        .await;
        let result = match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(LinkError::Redis(error)),
            Err(_) => Err(LinkError::Timeout(self.command_timeout)),
        };
        self.record(result.is_ok());
        result
    }

    fn record(&self, ok: bool) {
        self.metrics.limits.redis_up(ok);
        let was_down = self.down.swap(!ok, Ordering::Relaxed);
        if was_down && ok {
            tracing::info!("redis answers again: limits are shared between replicas");
        }
    }

    /// Counts a decision taken locally because Redis did not answer, and
    /// warns about it at most every ten seconds per kind.
    pub fn fell_back(&self, kind: Fallback, error: &LinkError) {
        self.metrics.limits.fallback(kind.label());
        let now = crate::clock::now_ms();
        let last = &self.warned[kind as usize];
        let previous = last.load(Ordering::Relaxed);
        if now - previous >= WARN_EVERY_MS
            && last
                .compare_exchange(previous, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                limits = kind.label(),
                %error,
                "redis unreachable: limits decided from this replica's own counters"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn settings(url: String, ca_file: Option<PathBuf>) -> RedisSettings {
        RedisSettings {
            url,
            ca_file,
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_millis(100),
            key_prefix: "keygate:".into(),
        }
    }

    /// A TLS listener on loopback that completes handshakes with a
    /// certificate for `127.0.0.1` signed by a CA made in `dir`: its port
    /// and that CA.
    async fn tls_listener(dir: &Path) -> (u16, PathBuf) {
        use rustls::pki_types::pem::PemObject;
        crate::tls::load_or_generate_dev(dir).unwrap();
        let (ca, cert, key) = crate::tls::dev_paths(dir);
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move { acceptor.accept(tcp).await });
            }
        });
        (port, ca)
    }

    #[tokio::test]
    async fn a_redis_url_is_not_handshaken() {
        let plain = settings("redis://:pw@127.0.0.1:1/".into(), None);
        assert!(check_tls(&plain).await.unwrap().is_none());
        assert!(plain.tls().is_none());
    }

    #[tokio::test]
    async fn rediss_says_its_version_and_refuses_a_certificate_of_another_ca() {
        let dir = tempfile::tempdir().unwrap();
        let (port, ca) = tls_listener(&dir.path().join("server")).await;
        let url = format!("rediss://:secret-pw@127.0.0.1:{port}/0");
        let trusted = settings(url.clone(), Some(ca));
        assert_eq!(
            check_tls(&trusted).await.unwrap().as_deref(),
            Some("TLSv1.3")
        );

        let other = dir.path().join("other");
        crate::tls::load_or_generate_dev(&other).unwrap();
        let wrong = settings(url, Some(crate::tls::dev_paths(&other).0));
        let error = check_tls(&wrong).await.unwrap_err();
        assert!(
            matches!(&error, LinkError::Certificate { at, .. } if *at == format!("127.0.0.1:{port}")),
            "{error}"
        );
        let text = error.to_string();
        assert!(text.contains("invalid peer certificate"), "{text}");
        assert!(text.contains("rediss://:***@127.0.0.1"), "{text}");
        assert!(!text.contains("secret-pw"), "{text}");
    }

    #[tokio::test]
    async fn a_closed_port_is_out_of_reach_not_a_certificate_problem() {
        let dir = tempfile::tempdir().unwrap();
        crate::tls::load_or_generate_dev(dir.path()).unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let url = format!("rediss://:secret-pw@127.0.0.1:{port}/");
        let error = check_tls(&settings(url, Some(crate::tls::dev_paths(dir.path()).0)))
            .await
            .unwrap_err();
        assert!(matches!(error, LinkError::Unreachable { .. }), "{error}");
        assert!(!error.to_string().contains("secret-pw"), "{error}");
    }
}
