//! Validation of the raw sections into the runtime settings: each section
//! checks itself and returns what the server uses. A bad value is reported
//! and replaced by a stand-in, so that validation goes on and reports the rest.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ipnet::IpNet;

use super::file::{
    ApiBrowserSection, ApiKeySection, AssertionSection, CacheSection, FileConfig, JwtSection,
    LimitsSection, ListenSection, LogSection, LoginSection, PlatformSection, ProxySection,
    QuotaSection, RedisSection, RetentionSection, RouteQuotaSection, RouteSection, ServerSection,
    StoreSection, TlsSection, UpstreamTlsSection, WebSocketSection,
};
use super::rate::{Rate, RouteRate};
use super::url::{PUBLIC_BASE_URL, UpstreamUrl, check_url, openapi_url};
use super::*;
use super::{QuotaSettings, RouteQuota};

/// Largest `retention.batch_size`: one statement stays short.
const MAX_PRUNE_BATCH: i64 = 100_000;

pub(super) fn validate(file: &FileConfig, errors: &mut Vec<String>) -> Settings {
    // The order of these calls is the order problems are listed in.
    let cache = file.cache.validate(errors);
    let proxy = file.proxy.validate(errors);
    let limits = file.limits.validate(errors);
    let api_browser = file.api_browser.validate(errors);
    let (login, password_policy) = file.login.validate(errors);
    let redis = file.redis.validate(errors);
    let quota = file.quota.validate(errors);
    let listen = file.listen.validate(errors);
    let tls_files = file.tls.validate(errors);
    let store = file.store.validate(errors);
    let jwt = file.jwt.validate(errors);
    let retention = file.retention.validate(errors);
    let api_keys = file.api_keys.validate(errors);
    let log = file.log.validate(errors);
    let websocket = file.websocket.validate(errors);
    let mail = file.mail.validate(errors);
    let two_factor = file.two_factor.validate(mail.is_some(), errors);
    let routes = validate_routes(&file.routes, proxy.request_timeout, errors);
    let mut platform = file.platform.validate(&file.jwt, errors);
    platform.sync = file.platform.validate_sync(&routes, errors);
    if platform.sync.is_some() && store.pooler == Pooler::Transaction && store.notify_url.is_none()
    {
        // One replica at a time holds the sync's lock in a session.
        errors.push(
            "store.notify_url: the platform sync (platform.database_url) behind a transaction \
             pooler needs a direct PostgreSQL URL for its lock"
                .into(),
        );
    }
    let server = file.server.validate(errors);
    let assertion = file
        .assertion
        .validate(server.public_base_url.as_deref(), errors);
    let oidc = super::oidc::validate(
        &file.oidc,
        server.public_base_url.as_deref(),
        &jwt.issuer,
        errors,
    );
    Settings {
        data_dir: server.data_dir,
        shutdown_grace: server.shutdown_grace,
        public_base_url: server.public_base_url,
        workers: server.workers,
        listen,
        tls_files,
        store_url: store.url,
        store_max_connections: store.max_connections,
        store_migrate: store.migrate,
        store_pooler: store.pooler,
        store_notify_url: store.notify_url,
        retention,
        jwt,
        api_key_prefix: api_keys.prefix,
        disable_key_on_plaintext: api_keys.disable_on_plaintext,
        max_api_keys_per_user: api_keys.max_per_user,
        unknown_key_lookups_per_address: api_keys.unknown_lookups_per_address,
        cache,
        proxy,
        limits,
        login,
        redis,
        quota,
        password_policy,
        api_browser,
        log,
        websocket,
        platform,
        assertion,
        two_factor,
        mail,
        routes,
        oidc,
    }
}

/// A duration that must be greater than zero; 1s stands in for a bad one.
fn nonzero_duration(name: &str, text: &str, errors: &mut Vec<String>) -> Duration {
    match parse_duration(text) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            errors.push(format!("{name}: must be greater than zero"));
            Duration::from_secs(1)
        }
        Err(e) => {
            errors.push(format!("{name}: {e}"));
            Duration::from_secs(1)
        }
    }
}

/// A number that must be positive; 1 stands in for a bad one.
fn positive(name: &str, n: i64, errors: &mut Vec<String>) -> u64 {
    if n <= 0 {
        errors.push(format!("{name}: must be a positive integer, got {n}"));
        1
    } else {
        n as u64
    }
}

/// A positive number as a count of things in memory.
fn positive_usize(name: &str, n: i64, errors: &mut Vec<String>) -> usize {
    usize::try_from(positive(name, n, errors)).unwrap_or(usize::MAX)
}

/// A positive number of failures, capped at what a counter holds.
fn positive_u32(name: &str, n: i64, errors: &mut Vec<String>) -> u32 {
    positive(name, n, errors).min(u64::from(u32::MAX)) as u32
}

/// `[server]` as validated.
struct Server {
    data_dir: PathBuf,
    shutdown_grace: Duration,
    public_base_url: Option<String>,
    workers: usize,
}

impl ServerSection {
    fn validate(&self, errors: &mut Vec<String>) -> Server {
        Server {
            data_dir: PathBuf::from(&self.data_dir),
            shutdown_grace: nonzero_duration("server.shutdown_grace", &self.shutdown_grace, errors),
            public_base_url: public_base_url(&self.public_base_url, errors),
            workers: workers(self.workers, errors),
        }
    }
}

/// `server.workers`: 0 (one per core) up to a bound that catches a typo
/// before it starts thousands of threads.
fn workers(n: i64, errors: &mut Vec<String>) -> usize {
    const MAX_WORKERS: i64 = 1024;
    if !(0..=MAX_WORKERS).contains(&n) {
        errors.push(format!(
            "server.workers: must be 0 (one per core) to {MAX_WORKERS}, got {n}"
        ));
        return 0;
    }
    n as usize
}

/// `server.public_base_url`: empty, or an absolute http(s) URL without path,
/// query or fragment; kept without a trailing slash.
fn public_base_url(text: &str, errors: &mut Vec<String>) -> Option<String> {
    let text = text.trim().trim_end_matches('/');
    if text.is_empty() {
        return None;
    }
    match check_url(text, &PUBLIC_BASE_URL) {
        Ok(_) => Some(text.to_string()),
        Err(e) => {
            errors.push(format!("server.public_base_url: {text:?}: {e}"));
            None
        }
    }
}

impl ListenSection {
    fn validate(&self, errors: &mut Vec<String>) -> Listen {
        let max_connections =
            positive_usize("listen.max_connections", self.max_connections, errors);
        let max_connections_per_address = positive_usize(
            "listen.max_connections_per_address",
            self.max_connections_per_address,
            errors,
        );
        let admin_max_connections = positive_usize(
            "listen.admin_max_connections",
            self.admin_max_connections,
            errors,
        );
        let admin_max_connections_per_address = positive_usize(
            "listen.admin_max_connections_per_address",
            self.admin_max_connections_per_address,
            errors,
        );
        let admin_header_read_timeout = nonzero_duration(
            "listen.admin_header_read_timeout",
            &self.admin_header_read_timeout,
            errors,
        );
        let listen = Listen {
            https: optional_addr("listen.https", &self.https, errors),
            http: optional_addr("listen.http", &self.http, errors),
            admin: optional_addr("listen.admin", &self.admin, errors),
            max_connections,
            allow_plaintext_credentials: self.allow_plaintext_credentials,
            max_connections_per_address,
            max_connections_per_trusted_proxy: match self.max_connections_per_trusted_proxy {
                0 => None,
                n if n > 0 => Some(n as usize),
                n => {
                    errors.push(format!(
                        "listen.max_connections_per_trusted_proxy: must not be negative, got {n}"
                    ));
                    None
                }
            },
            admin_max_connections,
            admin_max_connections_per_address,
            admin_header_read_timeout,
        };
        if self.https.trim().is_empty() && self.http.trim().is_empty() {
            errors.push("listen: at least one of https and http must be set".into());
        }
        listen
    }
}

fn optional_addr(name: &str, text: &str, errors: &mut Vec<String>) -> Option<SocketAddr> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(format!(
                "{name}: {text:?} is not an address like 127.0.0.1:8443"
            ));
            None
        }
    }
}

impl TlsSection {
    /// Certificate and key files; `None` for a generated development certificate.
    fn validate(&self, errors: &mut Vec<String>) -> Option<(PathBuf, PathBuf)> {
        match (self.cert.trim(), self.key.trim()) {
            ("", "") => None,
            (cert, key) if !cert.is_empty() && !key.is_empty() => {
                for (name, path) in [("tls.cert", cert), ("tls.key", key)] {
                    if !Path::new(path).is_file() {
                        errors.push(format!("{name}: file {path:?} does not exist"));
                    }
                }
                Some((PathBuf::from(cert), PathBuf::from(key)))
            }
            _ => {
                errors.push("tls: cert and key must both be set, or both left empty".into());
                None
            }
        }
    }
}

/// `[store]` as validated.
struct Store {
    url: String,
    max_connections: u32,
    migrate: StoreMigrate,
    pooler: Pooler,
    notify_url: Option<String>,
}

impl StoreSection {
    fn validate(&self, errors: &mut Vec<String>) -> Store {
        let max_connections = positive("store.max_connections", self.max_connections, errors);
        let url = self.url.trim().to_string();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            // The URL may hold a password: it is shown redacted.
            errors.push(format!(
                "store.url: must start with sqlite:, postgres:// or postgresql://, got {:?}",
                super::url::redacted_url(&url)
            ));
        }
        let migrate = StoreMigrate::parse(&self.migrate).unwrap_or_else(|| {
            errors.push(format!(
                "store.migrate: \"auto\" or \"never\", got {:?}",
                self.migrate
            ));
            StoreMigrate::Auto
        });
        let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let pooler = Pooler::parse(&self.pooler).unwrap_or_else(|| {
            errors.push(format!(
                "store.pooler: \"none\" or \"transaction\", got {:?}",
                self.pooler
            ));
            Pooler::None
        });
        if pooler == Pooler::Transaction && !postgres {
            errors.push("store.pooler: \"transaction\" needs a postgres:// store.url".into());
        }
        Store {
            url,
            max_connections: max_connections as u32,
            migrate,
            pooler,
            notify_url: self.notify_url(postgres, errors),
        }
    }

    /// `store.notify_url`, never printed: it may carry a password.
    fn notify_url(&self, postgres: bool, errors: &mut Vec<String>) -> Option<String> {
        let text = self.notify_url.trim();
        if text.is_empty() {
            return None;
        }
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            errors.push("store.notify_url: must start with postgres:// or postgresql://".into());
        } else if !postgres {
            errors.push("store.notify_url: only with a postgres:// store.url".into());
        }
        Some(text.to_owned())
    }
}

impl RetentionSection {
    fn validate(&self, errors: &mut Vec<String>) -> RetentionSettings {
        let mut duration = |name: &str, text: &str| match parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                errors.push(format!("retention.{name}: {e}"));
                Duration::ZERO
            }
        };
        let interval = match self.interval.trim() {
            "" => None,
            text => Some(duration("interval", text)).filter(|d| !d.is_zero()),
        };
        let sessions = duration("sessions", &self.sessions);
        let activation_tokens = duration("activation_tokens", &self.activation_tokens);
        let audit_events = duration("audit_events", &self.audit_events);
        let (batch, per_run) = (self.batch_size, self.max_rows_per_run);
        if !(1..=MAX_PRUNE_BATCH).contains(&batch) {
            errors.push(format!(
                "retention.batch_size: from 1 to {MAX_PRUNE_BATCH}, got {batch}"
            ));
        }
        if per_run < batch {
            errors.push(format!(
                "retention.max_rows_per_run: at least retention.batch_size ({batch}), got {per_run}"
            ));
        }
        RetentionSettings {
            interval,
            sessions,
            activation_tokens,
            audit_events,
            batch_size: batch.clamp(1, MAX_PRUNE_BATCH) as u32,
            max_rows_per_run: per_run.max(1) as u64,
        }
    }
}

impl JwtSection {
    fn validate(&self, errors: &mut Vec<String>) -> JwtSettings {
        let access = self.token_expiration_time;
        let refresh = self.refresh_token_expiration_time;
        if access < 60 {
            errors.push(format!(
                "jwt.token_expiration_time (JWT_TOKEN_EXPIRATION_TIME): at least 60 seconds, got {access}"
            ));
        }
        if refresh < 900 {
            errors.push(format!(
                "jwt.refresh_token_expiration_time (JWT_REFRESH_TOKEN_EXPIRATION_TIME): at least 900 seconds, got {refresh}"
            ));
        }
        if access >= refresh {
            errors.push(format!(
                "jwt: the access token lifetime ({access} s) must be shorter than the refresh token lifetime ({refresh} s)"
            ));
        }
        if self.token_issuer.trim().is_empty() {
            errors.push("jwt.token_issuer (JWT_TOKEN_ISSUER): must not be empty".into());
        }
        JwtSettings {
            access_ttl: Duration::from_secs(access.max(0) as u64),
            refresh_ttl: Duration::from_secs(refresh.max(0) as u64),
            issuer: self.token_issuer.clone(),
            signing_key: signing_key(&self.token_signing_key, errors),
        }
    }
}

/// `jwt.token_signing_key`: empty (the store keeps one), or Base64 of at
/// least 512 bits.
fn signing_key(text: &str, errors: &mut Vec<String>) -> Option<Vec<u8>> {
    match text.trim() {
        "" => None,
        text => match base64::engine::general_purpose::STANDARD.decode(text) {
            Ok(bytes) if bytes.len() >= 64 => Some(bytes),
            Ok(bytes) => {
                errors.push(format!(
                    "jwt.token_signing_key (JWT_TOKEN_SIGNING_KEY): must decode to at least 512 bits, got {} bits",
                    bytes.len() * 8
                ));
                None
            }
            Err(_) => {
                errors
                    .push("jwt.token_signing_key (JWT_TOKEN_SIGNING_KEY): not valid Base64".into());
                None
            }
        },
    }
}

/// The shortest `platform.token_lifetime`: tokens carry whole seconds.
const MIN_PLATFORM_TOKEN_LIFETIME: Duration = Duration::from_secs(1);

impl PlatformSection {
    /// `[platform]`, checked against keygate's own signing key, which it
    /// must never be. Whether a `platform` route has a key is decided at
    /// start: an imported one is kept in the store.
    fn validate(&self, jwt: &JwtSection, errors: &mut Vec<String>) -> PlatformSettings {
        const NAME: &str = "platform.signing_key (KEYGATE_PLATFORM_SIGNING_KEY)";
        let text = self.signing_key.trim();
        let signing_key = match text {
            "" => None,
            text => match platform_key_engine().decode(text) {
                // The platform's own check (JwtTokenFactory.KEY_LENGTH, the
                // key length of HS512): at least 512 bits.
                Ok(bytes) if bytes.len() >= 64 => Some(bytes),
                Ok(bytes) => {
                    errors.push(format!(
                        "{NAME}: must decode to at least 512 bits, got {} bits",
                        bytes.len() * 8
                    ));
                    None
                }
                Err(_) => {
                    errors.push(format!("{NAME}: not valid Base64"));
                    None
                }
            },
        };
        let own = jwt.token_signing_key.trim();
        let same_bytes = signing_key.is_some()
            && signing_key == base64::engine::general_purpose::STANDARD.decode(own).ok();
        if !text.is_empty() && (text == own || same_bytes) {
            errors.push(format!(
                "{NAME}: must differ from jwt.token_signing_key: a token signed with the platform's key must never be a credential keygate accepts"
            ));
        }
        if self.issuer.trim().is_empty() {
            errors.push("platform.issuer: must not be empty".into());
        }
        let token_lifetime =
            nonzero_duration("platform.token_lifetime", &self.token_lifetime, errors);
        if token_lifetime < MIN_PLATFORM_TOKEN_LIFETIME {
            errors.push(format!(
                "platform.token_lifetime: at least 1s, got {:?}",
                self.token_lifetime
            ));
        }
        let mut public_customers = Vec::new();
        for (index, entry) in self.public_customers.iter().enumerate() {
            let here = format!("platform.public_customers[{index}]");
            let id = |name: &str, text: &str, errors: &mut Vec<String>| match uuid::Uuid::parse_str(
                text.trim(),
            ) {
                Ok(id) if id != crate::vocab::identity::NULL_UUID => Some(id),
                _ => {
                    errors.push(format!(
                        "{here}.{name}: must be a UUID other than the null id, got {text:?}"
                    ));
                    None
                }
            };
            let customer_id = id("customer_id", &entry.customer_id, errors);
            let tenant_id = id("tenant_id", &entry.tenant_id, errors);
            if let (Some(customer_id), Some(tenant_id)) = (customer_id, tenant_id) {
                if public_customers
                    .iter()
                    .any(|c: &crate::vocab::settings::PublicCustomer| c.customer_id == customer_id)
                {
                    errors.push(format!("{here}.customer_id: {customer_id} is listed twice"));
                }
                public_customers.push(crate::vocab::settings::PublicCustomer {
                    customer_id,
                    tenant_id,
                });
            }
        }
        PlatformSettings {
            signing_key,
            issuer: self.issuer.trim().to_owned(),
            token_lifetime: token_lifetime.max(MIN_PLATFORM_TOKEN_LIFETIME),
            public_customers,
            sync: None,
            signing_key_imported: false,
        }
    }

    /// The sync: on with a `database_url`, which must be PostgreSQL's. Its
    /// `upstream`, when named, must be a route with `identity = "platform"`
    /// (the user-entity endpoints reach the platform with its own token);
    /// `keygate serve` refuses to sync without one.
    fn validate_sync(
        &self,
        routes: &[RouteSpec],
        errors: &mut Vec<String>,
    ) -> Option<SyncSettings> {
        let url = self.database_url.trim();
        let interval = nonzero_duration("platform.sync_interval", &self.sync_interval, errors);
        let upstream = self.upstream.trim();
        if !upstream.is_empty() {
            match routes.iter().find(|route| route.name == upstream) {
                None => errors.push(format!(
                    "platform.upstream: no [[route]] is named {upstream:?}"
                )),
                Some(route) if route.identity != crate::vocab::identity::IdentityMode::Platform => {
                    errors.push(format!(
                        "platform.upstream: the route {upstream:?} must have identity = \"platform\": the platform accepts only its own tokens"
                    ))
                }
                Some(_) => {}
            }
        }
        if url.is_empty() {
            return None;
        }
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            errors.push(
                "platform.database_url (KEYGATE_PLATFORM_DATABASE_URL): must be a postgres:// URL: the platform keeps its users in PostgreSQL".into(),
            );
        }
        Some(SyncSettings {
            database_url: url.to_owned(),
            interval,
            upstream: upstream.to_owned(),
        })
    }
}

/// Base64 as the platform decodes its key (`java.util.Base64.getDecoder()`):
/// the standard alphabet, padding accepted but not required.
pub(crate) fn platform_key_engine() -> base64::engine::GeneralPurpose {
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    )
}

/// `[api_keys]` as validated.
struct ApiKeys {
    prefix: String,
    disable_on_plaintext: bool,
    max_per_user: Option<u64>,
    unknown_lookups_per_address: Option<Rate>,
}

impl ApiKeySection {
    fn validate(&self, errors: &mut Vec<String>) -> ApiKeys {
        let prefix = &self.prefix;
        if prefix.len() > 16
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            errors.push(format!(
                "api_keys.prefix: at most 16 characters of [A-Za-z0-9_-], got {prefix:?}"
            ));
        }
        ApiKeys {
            prefix: prefix.clone(),
            disable_on_plaintext: self.disable_on_plaintext,
            max_per_user: limit("api_keys.max_per_user", self.max_per_user, errors)
                .map(|n| n as u64),
            unknown_lookups_per_address: optional_rate(
                "api_keys.unknown_lookups_per_address",
                &self.unknown_lookups_per_address,
                errors,
            ),
        }
    }
}

impl CacheSection {
    fn validate(&self, errors: &mut Vec<String>) -> CacheSettings {
        CacheSettings {
            ttl: nonzero_duration("cache.ttl", &self.ttl, errors),
            negative_ttl: nonzero_duration("cache.negative_ttl", &self.negative_ttl, errors),
            capacity: positive("cache.capacity", self.capacity, errors),
        }
    }
}

impl ProxySection {
    fn validate(&self, errors: &mut Vec<String>) -> ProxySettings {
        let mut duration = |name: &str, text: &str| nonzero_duration(name, text, errors);
        let connect_timeout = duration("proxy.connect_timeout", &self.connect_timeout);
        let request_timeout = duration("proxy.request_timeout", &self.request_timeout);
        let pool_idle_timeout = duration("proxy.pool_idle_timeout", &self.pool_idle_timeout);
        let upstream_retry_after =
            duration("proxy.upstream_retry_after", &self.upstream_retry_after);
        let upstream_queue_timeout =
            duration("proxy.upstream_queue_timeout", &self.upstream_queue_timeout);
        let pool_max_idle_per_host = positive_usize(
            "proxy.pool_max_idle_per_host",
            self.pool_max_idle_per_host,
            errors,
        );
        let max_connections_per_upstream = positive_usize(
            "proxy.max_connections_per_upstream",
            self.max_connections_per_upstream,
            errors,
        );
        let max_upstream_connections = usize::try_from(self.max_upstream_connections)
            .unwrap_or_else(|_| {
                errors.push("proxy.max_upstream_connections: must be 0 or more".into());
                0
            });
        let upstream_queue = usize::try_from(self.upstream_queue).unwrap_or_else(|_| {
            errors.push("proxy.upstream_queue: must be 0 or more".into());
            0
        });
        let mut trusted_proxies = Vec::new();
        for cidr in &self.trusted_proxies {
            match parse_cidr(cidr) {
                Some(net) => trusted_proxies.push(net),
                None => errors.push(format!(
                    "proxy.trusted_proxies: {cidr:?} is not a CIDR or IP address"
                )),
            }
        }
        ProxySettings {
            trusted_proxies,
            connect_timeout,
            request_timeout,
            pool_idle_timeout,
            pool_max_idle_per_host,
            upstream_retry_after,
            max_connections_per_upstream,
            max_upstream_connections,
            upstream_queue,
            upstream_queue_timeout,
            pass_server_header: self.pass_server_header,
            fast_path: self.fast_path,
        }
    }
}

fn parse_cidr(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

impl LimitsSection {
    fn validate(&self, errors: &mut Vec<String>) -> HttpLimits {
        let mut duration = |name: &str, text: &str| nonzero_duration(name, text, errors);
        let header_read_timeout = duration("limits.header_read_timeout", &self.header_read_timeout);
        let tls_handshake_timeout =
            duration("limits.tls_handshake_timeout", &self.tls_handshake_timeout);
        let idle_timeout = duration("limits.idle_timeout", &self.idle_timeout);
        let body_read_timeout = duration("limits.body_read_timeout", &self.body_read_timeout);
        let http2_keep_alive_interval = duration(
            "limits.http2_keep_alive_interval",
            &self.http2_keep_alive_interval,
        );
        let http2_keep_alive_timeout = duration(
            "limits.http2_keep_alive_timeout",
            &self.http2_keep_alive_timeout,
        );
        let max_header_bytes =
            positive_usize("limits.max_header_bytes", self.max_header_bytes, errors);
        let max_body_bytes = positive("limits.max_body_bytes", self.max_body_bytes, errors);
        let http2_max_concurrent_streams = positive_usize(
            "limits.http2_max_concurrent_streams",
            self.http2_max_concurrent_streams,
            errors,
        );
        let max_in_flight_per_connection = positive_usize(
            "limits.max_in_flight_per_connection",
            self.max_in_flight_per_connection,
            errors,
        );
        let max_in_flight_per_address = positive_usize(
            "limits.max_in_flight_per_address",
            self.max_in_flight_per_address,
            errors,
        );
        let min_body_rate = u64::try_from(self.min_body_rate).unwrap_or_else(|_| {
            errors.push("limits.min_body_rate: must be 0 or more".into());
            0
        });
        let buffered_body_bytes = u64::try_from(self.buffered_body_bytes).unwrap_or_else(|_| {
            errors.push("limits.buffered_body_bytes: must be 0 or more".into());
            0
        });
        if max_header_bytes < 1024 {
            errors.push("limits.max_header_bytes: must be at least 1024".into());
        }
        let ipv6_prefix_len = u8::try_from(self.ipv6_prefix_len)
            .ok()
            .filter(|len| (1..=128).contains(len))
            .unwrap_or_else(|| {
                errors.push(format!(
                    "limits.ipv6_prefix_len: must be from 1 to 128, got {}",
                    self.ipv6_prefix_len
                ));
                crate::address::DEFAULT_IPV6_PREFIX_LEN
            });
        HttpLimits {
            max_header_bytes,
            max_body_bytes,
            header_read_timeout,
            tls_handshake_timeout,
            idle_timeout,
            body_read_timeout,
            http2_keep_alive_interval,
            http2_keep_alive_timeout,
            http2_max_concurrent_streams: u32::try_from(http2_max_concurrent_streams)
                .unwrap_or(u32::MAX),
            max_in_flight_per_connection,
            max_in_flight_per_address,
            min_body_rate,
            buffered_body_bytes,
            ipv6_prefix_len,
            management_writes_per_user: optional_rate(
                "limits.management_writes_per_user",
                &self.management_writes_per_user,
                errors,
            ),
        }
    }
}

impl LoginSection {
    fn validate(&self, errors: &mut Vec<String>) -> (LoginSettings, PasswordPolicy) {
        let limiter = self.limiter(errors);
        let password_policy = self.password_policy(errors);
        if self.lockout_after < 0 || self.max_concurrent_hashes < 0 {
            errors.push(
                "login.lockout_after and login.max_concurrent_hashes: must not be negative".into(),
            );
        }
        let max_concurrent_hashes = match self.max_concurrent_hashes {
            n if n > 0 => n as usize,
            // Auto: half the cores, so logins never take every core from proxying.
            _ => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
        };
        if !(0..=19).contains(&self.hash_nice) {
            errors.push(format!(
                "login.hash_nice: must be 0 (the priority of proxying) to 19, got {}",
                self.hash_nice
            ));
        }
        // bcrypt's own range; the platform writes cost 10.
        if !(4..=31).contains(&self.max_bcrypt_cost) {
            errors.push(format!(
                "login.max_bcrypt_cost: must be 4 to 31 (the platform writes 10), got {}",
                self.max_bcrypt_cost
            ));
        }
        let login = LoginSettings {
            limiter,
            max_bcrypt_cost: self.max_bcrypt_cost.clamp(4, 31) as u32,
            lockout_after: self.lockout_after.clamp(0, i64::from(u32::MAX)) as u32,
            max_concurrent_hashes,
            hash_nice: self.hash_nice.clamp(0, 19) as i32,
            hash_wait: nonzero_duration("login.hash_wait", &self.hash_wait, errors),
        };
        (login, password_policy)
    }

    fn limiter(&self, errors: &mut Vec<String>) -> super::LimiterSettings {
        let account_window = nonzero_duration("login.account_window", &self.account_window, errors);
        let address_window = nonzero_duration("login.address_window", &self.address_window, errors);
        super::LimiterSettings {
            account_max_failures: positive_u32(
                "login.account_max_failures",
                self.account_max_failures,
                errors,
            ),
            account_address_max_failures: positive_u32(
                "login.account_address_max_failures",
                self.account_address_max_failures,
                errors,
            ),
            account_window,
            address_max_failures: positive_u32(
                "login.address_max_failures",
                self.address_max_failures,
                errors,
            ),
            address_window,
            capacity: positive("login.limiter_capacity", self.limiter_capacity, errors),
        }
    }

    fn password_policy(&self, errors: &mut Vec<String>) -> PasswordPolicy {
        let min_length = positive_usize(
            "login.password_min_length",
            self.password_min_length,
            errors,
        );
        let max_length = positive_usize(
            "login.password_max_length",
            self.password_max_length,
            errors,
        );
        if min_length > max_length {
            errors.push(
                "login.password_min_length: must not exceed login.password_max_length".into(),
            );
        }
        PasswordPolicy {
            min_length,
            max_length,
        }
    }
}

/// Longest `redis.key_prefix`.
const MAX_KEY_PREFIX: usize = 64;

impl RedisSection {
    fn validate(&self, errors: &mut Vec<String>) -> Option<RedisSettings> {
        let connect_timeout =
            nonzero_duration("redis.connect_timeout", &self.connect_timeout, errors);
        let command_timeout =
            nonzero_duration("redis.command_timeout", &self.command_timeout, errors);
        let prefix = &self.key_prefix;
        if prefix.len() > MAX_KEY_PREFIX
            || prefix.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            errors.push(format!(
                "redis.key_prefix: at most {MAX_KEY_PREFIX} characters without spaces, got {prefix:?}"
            ));
        }
        let url = self.url.trim();
        let ca_file = redis_ca_file(self.ca_file.trim(), url, errors);
        if url.is_empty() {
            return None;
        }
        if let Err(problem) = check_redis_url(url) {
            errors.push(format!("redis.url: {problem}"));
        }
        Some(RedisSettings {
            url: url.to_string(),
            ca_file,
            connect_timeout,
            command_timeout,
            key_prefix: prefix.clone(),
        })
    }
}

/// `redis://` or `rediss://` (TLS, verified: no `#insecure`), in a form the
/// `redis` crate reads. The URL is never repeated in a message: it may
/// carry a password.
fn check_redis_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if scheme != "redis" && scheme != "rediss" {
        return Err(format!(
            "must start with redis:// or rediss:// (TLS), got scheme {scheme:?}"
        ));
    }
    if url.contains('#') {
        return Err(
            "must not have a fragment (#...): a rediss:// server's certificate is always verified"
                .into(),
        );
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|_| format!("not a valid {scheme}://[:password@]host[:port][/db] URL"))
}

/// `redis.ca_file`: a readable PEM CA, and only beside a `rediss://` URL
/// (`url` is the trimmed `redis.url`, empty when Redis is off: a CA file
/// then trusts nothing, which is as likely a mistake).
fn redis_ca_file(file: &str, url: &str, errors: &mut Vec<String>) -> Option<PathBuf> {
    if file.is_empty() {
        return None;
    }
    if !url.starts_with("rediss://") {
        errors.push(
            "redis.ca_file: trusted for TLS to Redis only, and redis.url is not a rediss:// URL; \
             write rediss:// in redis.url, or leave redis.ca_file empty"
                .into(),
        );
    }
    let path = PathBuf::from(file);
    if let Err(problem) = crate::tls_client::check_ca_file(&path) {
        errors.push(format!("redis.ca_file: {problem}"));
    }
    Some(path)
}

/// A quota rate; `""` for none.
fn optional_rate(name: &str, text: &str, errors: &mut Vec<String>) -> Option<Rate> {
    if text.trim().is_empty() {
        return None;
    }
    Rate::parse(text)
        .map_err(|e| errors.push(format!("{name}: {e}")))
        .ok()
}

impl QuotaSection {
    fn validate(&self, errors: &mut Vec<String>) -> QuotaSettings {
        let sync_interval = nonzero_duration("quota.sync_interval", &self.sync_interval, errors);
        if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&sync_interval) {
            errors.push(format!(
                "quota.sync_interval: from 10ms to 10s, got {:?}",
                self.sync_interval
            ));
        }
        QuotaSettings {
            rates: [
                optional_rate("quota.per_key", &self.per_key, errors),
                optional_rate("quota.per_user", &self.per_user, errors),
                optional_rate("quota.per_tenant", &self.per_tenant, errors),
            ],
            sync_interval,
            capacity: positive("quota.capacity", self.capacity, errors),
        }
    }
}

impl RouteQuotaSection {
    fn validate(&self, here: &str, errors: &mut Vec<String>) -> RouteQuota {
        let mut rate = |name: &str, text: &str| {
            RouteRate::parse(text).unwrap_or_else(|e| {
                errors.push(format!(
                    "{here}.quota.{name}: {e} (or \"\" for the global rate, \"off\" for none)"
                ));
                RouteRate::Inherit
            })
        };
        RouteQuota([
            rate("per_key", &self.per_key),
            rate("per_user", &self.per_user),
            rate("per_tenant", &self.per_tenant),
        ])
    }
}

/// Shortest and longest `assertion.lifetime`: long enough to be reused,
/// short enough that a leaked assertion soon dies.
const ASSERTION_LIFETIME: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(3600));
/// Longest `assertion.jwks_max_age`: a retired key stays published for it.
const MAX_JWKS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

impl AssertionSection {
    fn validate(
        &self,
        public_base_url: Option<&str>,
        errors: &mut Vec<String>,
    ) -> AssertionSettings {
        let (shortest, longest) = ASSERTION_LIFETIME;
        let mut lifetime = nonzero_duration("assertion.lifetime", &self.lifetime, errors);
        if !(shortest..=longest).contains(&lifetime) {
            errors.push(format!(
                "assertion.lifetime: must be from 10s to 1h, got {:?}",
                self.lifetime
            ));
            lifetime = shortest.max(lifetime.min(longest));
        }
        let mut jwks_max_age =
            nonzero_duration("assertion.jwks_max_age", &self.jwks_max_age, errors);
        if jwks_max_age > MAX_JWKS_MAX_AGE {
            errors.push(format!(
                "assertion.jwks_max_age: must be at most 1d, got {:?}",
                self.jwks_max_age
            ));
            jwks_max_age = MAX_JWKS_MAX_AGE;
        }
        let algorithm = AssertionAlgorithm::parse(self.algorithm.trim()).unwrap_or_else(|| {
            errors.push(format!(
                "assertion.algorithm: must be \"ES256\" or \"EdDSA\", got {:?}",
                self.algorithm
            ));
            AssertionAlgorithm::Es256
        });
        let file = self.signing_key_file.trim();
        let signing_key_file = (!file.is_empty()).then(|| {
            if !Path::new(file).is_file() {
                errors.push(format!(
                    "assertion.signing_key_file: file {file:?} does not exist"
                ));
            }
            PathBuf::from(file)
        });
        let issuer = match self.issuer.trim() {
            "" => public_base_url.unwrap_or("keygate").to_string(),
            issuer => issuer.to_string(),
        };
        AssertionSettings {
            issuer,
            lifetime,
            algorithm,
            signing_key_file,
            jwks_max_age,
            reuse: self.reuse,
        }
    }
}

impl ApiBrowserSection {
    fn validate(&self, errors: &mut Vec<String>) -> ApiBrowserSettings {
        ApiBrowserSettings {
            enabled: self.enabled,
            refresh: nonzero_duration("api_browser.refresh", &self.refresh, errors),
            fetch_timeout: nonzero_duration(
                "api_browser.fetch_timeout",
                &self.fetch_timeout,
                errors,
            ),
        }
    }
}

impl LogSection {
    fn validate(&self, errors: &mut Vec<String>) -> LogSettings {
        let format = match self.format.as_str() {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            other => {
                errors.push(format!(
                    "log.format: must be \"human\" or \"json\", got {other:?}"
                ));
                LogFormat::Human
            }
        };
        LogSettings {
            format,
            access_log: self.access_log,
        }
    }
}

/// Every `[[route]]`; routes without a `request_timeout` take
/// `proxy.request_timeout`.
/// Largest `websocket.max_message_bytes`: 64 MiB.
const MAX_WEBSOCKET_MESSAGE: i64 = 64 * 1024 * 1024;

impl WebSocketSection {
    fn validate(&self, errors: &mut Vec<String>) -> WebSocketSettings {
        for route in &self.routes {
            let normal = crate::path::normalize(route).is_ok_and(|p| p == route.as_str());
            if !route.starts_with('/') || !normal {
                errors.push(format!(
                    "websocket.routes: {route:?} is not a normalised absolute path like /api/ws"
                ));
            }
        }
        let max_message_bytes = positive_usize(
            "websocket.max_message_bytes",
            self.max_message_bytes,
            errors,
        );
        if self.max_message_bytes > MAX_WEBSOCKET_MESSAGE {
            errors.push(format!(
                "websocket.max_message_bytes: at most {MAX_WEBSOCKET_MESSAGE}, got {}",
                self.max_message_bytes
            ));
        }
        WebSocketSettings {
            routes: self.routes.clone(),
            auth_timeout: nonzero_duration("websocket.auth_timeout", &self.auth_timeout, errors),
            max_message_bytes,
            max_per_user: limit("websocket.max_per_user", self.max_per_user, errors),
            max_per_tenant: limit("websocket.max_per_tenant", self.max_per_tenant, errors),
            ping_interval: nonzero_duration("websocket.ping_interval", &self.ping_interval, errors),
            idle_timeout: nonzero_duration("websocket.idle_timeout", &self.idle_timeout, errors),
        }
    }
}

/// Providers keygate can offer; EMAIL needs `[mail]`.
pub(crate) const TWO_FACTOR_PROVIDERS: [&str; 3] = ["TOTP", "BACKUP_CODE", "EMAIL"];

/// Shortest at-rest encryption secret, in bytes.
const MIN_ENCRYPTION_SECRET: usize = 32;

impl super::file::TwoFactorSection {
    fn validate(&self, mail: bool, errors: &mut Vec<String>) -> super::TwoFactorSettings {
        let mut providers: Vec<String> = Vec::new();
        for provider in &self.providers {
            if provider == "EMAIL" && !mail {
                errors.push(
                    "two_factor.providers: EMAIL needs mail: set [mail] host (or leave EMAIL out)"
                        .into(),
                );
            } else if !TWO_FACTOR_PROVIDERS.contains(&provider.as_str()) {
                errors.push(format!(
                    "two_factor.providers: {provider:?} is not one of {}",
                    TWO_FACTOR_PROVIDERS.join(", ")
                ));
            } else if !providers.contains(provider) {
                providers.push(provider.clone());
            }
        }
        // The default list gains EMAIL once mail is configured.
        if mail
            && self.providers == super::file::TwoFactorSection::default().providers
            && !providers.iter().any(|p| p == "EMAIL")
        {
            providers.push("EMAIL".into());
        }
        if self.issuer_name.trim().is_empty() {
            errors.push("two_factor.issuer_name: must not be empty".into());
        }
        if !(1..=100).contains(&self.backup_codes) {
            errors.push(format!(
                "two_factor.backup_codes: from 1 to 100, got {}",
                self.backup_codes
            ));
        }
        let verification_time = nonzero_duration(
            "two_factor.verification_time",
            &self.verification_time,
            errors,
        );
        if verification_time < Duration::from_secs(60) {
            errors.push("two_factor.verification_time: at least 1m".into());
        }
        let secret = |name: &str, text: &str, errors: &mut Vec<String>| {
            let text = text.trim();
            if text.len() < MIN_ENCRYPTION_SECRET {
                errors.push(format!(
                    "{name}: at least {MIN_ENCRYPTION_SECRET} characters, got {}",
                    text.len()
                ));
            }
            text.as_bytes().to_vec()
        };
        let encryption_secret = match self.encryption_secret.trim() {
            "" => None,
            text => Some(secret("two_factor.encryption_secret", text, errors)),
        };
        let old_encryption_secrets = self
            .old_encryption_secrets
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|text| secret("two_factor.old_encryption_secrets", text, errors))
            .collect();
        let enforced = self.enforcement(&providers, errors);
        super::TwoFactorSettings {
            enforced,
            providers,
            issuer_name: self.issuer_name.trim().to_string(),
            backup_codes: self.backup_codes.clamp(1, 100) as usize,
            verification_time,
            max_verification_failures: positive_u32(
                "two_factor.max_verification_failures",
                self.max_verification_failures,
                errors,
            ),
            encryption_secret,
            old_encryption_secrets,
        }
    }
}

impl super::file::TwoFactorSection {
    /// `enforce`, `enforced_users` and `enforced_tenants` as the platform's
    /// users filter; `None` when not enforced.
    fn enforcement(
        &self,
        providers: &[String],
        errors: &mut Vec<String>,
    ) -> Option<super::EnforcedUsers> {
        use super::EnforcedUsers;
        let mut tenants = Vec::new();
        for text in &self.enforced_tenants {
            match uuid::Uuid::parse_str(text.trim()) {
                Ok(id) => tenants.push(id),
                Err(_) => errors.push(format!(
                    "two_factor.enforced_tenants: {text:?} is not a tenant id (UUID)"
                )),
            }
        }
        let filter = match self.enforced_users.trim() {
            "ALL_USERS" => EnforcedUsers::AllUsers,
            "SYSTEM_ADMINISTRATORS" => EnforcedUsers::SystemAdministrators,
            "TENANT_ADMINISTRATORS" => EnforcedUsers::TenantAdministrators {
                tenants_ids: (!tenants.is_empty()).then(|| tenants.clone()),
                tenant_profiles_ids: None,
            },
            other => {
                errors.push(format!(
                    "two_factor.enforced_users: {other:?} is not one of ALL_USERS, SYSTEM_ADMINISTRATORS, TENANT_ADMINISTRATORS"
                ));
                EnforcedUsers::AllUsers
            }
        };
        if !tenants.is_empty() && !matches!(filter, EnforcedUsers::TenantAdministrators { .. }) {
            errors.push(
                "two_factor.enforced_tenants: only with enforced_users = \"TENANT_ADMINISTRATORS\""
                    .into(),
            );
        }
        if !self.enforce {
            return None;
        }
        // Backup codes count only beside another provider.
        if !providers.iter().any(|p| p != "BACKUP_CODE") {
            errors.push("two_factor.enforce: needs a provider other than BACKUP_CODE".into());
        }
        Some(filter)
    }
}

/// A count limit where 0 means none.
fn limit(name: &str, n: i64, errors: &mut Vec<String>) -> Option<usize> {
    match n {
        0 => None,
        n if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        n => {
            errors.push(format!(
                "{name}: must not be negative (0: no limit), got {n}"
            ));
            None
        }
    }
}

fn validate_routes(
    routes: &[RouteSection],
    default_timeout: Duration,
    errors: &mut Vec<String>,
) -> Vec<RouteSpec> {
    if routes.is_empty() {
        errors.push("route: at least one [[route]] is required".into());
    }
    let mut specs: Vec<RouteSpec> = Vec::with_capacity(routes.len());
    for (i, route) in routes.iter().enumerate() {
        let here = format!("route[{i}]");
        route.check_prefix(&here, errors);
        if specs.iter().any(|s| s.prefix == route.prefix) {
            errors.push(format!(
                "{here}.prefix: {:?} is configured twice",
                route.prefix
            ));
        }
        specs.push(route.validate(&here, default_timeout, errors));
    }
    refuse_shared_assertion_audiences(&specs, errors);
    specs
}

/// Two `assertion` routes with one name, or with one audience and other
/// upstreams: an assertion issued for either carries the same `aud`, so each
/// upstream would accept the assertions meant for the other. One audience on
/// routes to the same upstreams (one service behind two prefixes, its REST
/// API and its sockets) is one recipient, and allowed. Both routes are named.
fn refuse_shared_assertion_audiences(specs: &[RouteSpec], errors: &mut Vec<String>) {
    let assertion =
        |spec: &RouteSpec| spec.identity == crate::vocab::identity::IdentityMode::Assertion;
    let upstreams = |spec: &RouteSpec| {
        let mut urls: Vec<String> = spec.upstreams.iter().map(|u| u.to_string()).collect();
        urls.sort_unstable();
        urls.dedup();
        urls
    };
    for (j, later) in specs.iter().enumerate().filter(|(_, s)| assertion(s)) {
        let clash = specs[..j].iter().enumerate().find_map(|(i, earlier)| {
            if !assertion(earlier) {
                None
            } else if earlier.name == later.name {
                Some((i, earlier, "name", &later.name))
            } else if earlier.audience == later.audience && upstreams(earlier) != upstreams(later) {
                Some((i, earlier, "audience", &later.audience))
            } else {
                None
            }
        });
        let Some((i, earlier, field, value)) = clash else {
            continue;
        };
        errors.push(format!(
            "route[{j}].{field}: {value:?} is also the {field} of route[{i}]; two \"assertion\" \
             routes need their own name, and their own audience unless they send to the same \
             upstreams, or each upstream accepts the other's assertions (route[{i}] {:?}, \
             route[{j}] {:?})",
            earlier.prefix, later.prefix
        ));
    }
}

impl RouteSection {
    fn check_prefix(&self, here: &str, errors: &mut Vec<String>) {
        if !self.prefix.starts_with('/') {
            errors.push(format!(
                "{here}.prefix: must start with '/', got {:?}",
                self.prefix
            ));
        }
        if self.prefix.contains(['?', '#', '%'])
            || self.prefix.contains("/../")
            || self.prefix.contains("/./")
        {
            errors.push(format!(
                "{here}.prefix: must be a plain, normalised path, got {:?}",
                self.prefix
            ));
        }
    }

    /// The route's own settings; `here` names it in messages.
    fn validate(
        &self,
        here: &str,
        default_timeout: Duration,
        errors: &mut Vec<String>,
    ) -> RouteSpec {
        if self.upstreams.is_empty() {
            errors.push(format!(
                "{here}.upstreams: at least one upstream is required"
            ));
        }
        let mut upstreams = Vec::new();
        for upstream in &self.upstreams {
            match upstream.parse::<UpstreamUrl>() {
                Ok(url) => upstreams.push(url),
                Err(e) => errors.push(format!("{here}.upstreams: {upstream:?}: {e}")),
            }
        }
        let request_timeout = self.request_timeout(here, default_timeout, errors);
        let name = if self.name.trim().is_empty() {
            self.prefix.clone()
        } else {
            self.name.clone()
        };
        let identity = match crate::vocab::identity::IdentityMode::parse(&self.identity) {
            Some(mode) => mode,
            None => {
                errors.push(format!(
                    "{here}.identity: must be \"headers\", \"assertion\" or \"platform\", got {:?}",
                    self.identity
                ));
                crate::vocab::identity::IdentityMode::Headers
            }
        };
        let audience = if self.audience.trim().is_empty() {
            name.clone()
        } else {
            self.audience.clone()
        };
        let openapi = self.openapi(here, errors);
        let upstream_tls = self
            .upstream_tls
            .validate(here, &upstreams, openapi.as_ref(), errors);
        RouteSpec {
            openapi,
            upstream_tls,
            identity,
            audience,
            name,
            prefix: self.prefix.clone(),
            upstreams,
            public: self.public,
            request_timeout,
            quota: self.quota.validate(here, errors),
        }
    }

    fn request_timeout(
        &self,
        here: &str,
        default_timeout: Duration,
        errors: &mut Vec<String>,
    ) -> Duration {
        if self.request_timeout.trim().is_empty() {
            return default_timeout;
        }
        match parse_duration(&self.request_timeout) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                errors.push(format!("{here}.request_timeout: must be greater than zero"));
                default_timeout
            }
            Err(e) => {
                errors.push(format!("{here}.request_timeout: {e}"));
                default_timeout
            }
        }
    }

    /// Where the upstream publishes its OpenAPI document, if it does.
    fn openapi(&self, here: &str, errors: &mut Vec<String>) -> Option<http::Uri> {
        // A path is resolved against the first upstream; when that one is
        // invalid it was reported already, and is not reported again here.
        let first_upstream = self
            .upstreams
            .first()
            .and_then(|text| text.parse::<UpstreamUrl>().ok());
        match self.openapi.trim() {
            "" => None,
            text if text.starts_with('/')
                && first_upstream.is_none()
                && !self.upstreams.is_empty() =>
            {
                None
            }
            text => match openapi_url(text, first_upstream.as_ref()) {
                Ok(uri) => Some(uri),
                Err(e) => {
                    errors.push(format!("{here}.openapi: {text:?}: {e}"));
                    None
                }
            },
        }
    }
}

impl UpstreamTlsSection {
    /// The TLS of a route's `https://` upstreams and document, its files
    /// read now: `None` when there are none. Set on a route with none, it
    /// is refused; problems name the route and the setting.
    fn validate(
        &self,
        here: &str,
        upstreams: &[UpstreamUrl],
        openapi: Option<&http::Uri>,
        errors: &mut Vec<String>,
    ) -> Option<crate::tls_client::Connector> {
        let https = upstreams.iter().any(UpstreamUrl::is_https)
            || openapi.is_some_and(|uri| uri.scheme() == Some(&http::uri::Scheme::HTTPS));
        if !https {
            // Upstreams that did not parse were reported already.
            if self.is_set() && !upstreams.is_empty() {
                errors.push(format!(
                    "{here}.upstream_tls: the route's upstreams are all http://;                      upstream_tls applies to https:// upstreams only"
                ));
            }
            return None;
        }
        let identity = match (field(&self.cert_file), field(&self.key_file)) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            _ => {
                errors.push(format!(
                    "{here}.upstream_tls: cert_file and key_file must both be set, or both left empty"
                ));
                return None;
            }
        };
        let settings = crate::tls_client::ClientTls {
            ca_file: field(&self.ca_file).map(PathBuf::from),
            identity,
            alpn: vec![b"http/1.1".to_vec()],
        };
        let server_name = field(&self.server_name);
        let connector = crate::tls_client::Connector::new(&settings, server_name)
            .map_err(|e| errors.push(format!("{here}.upstream_tls.{}: {e}", self.setting_of(&e))))
            .ok()?;
        for url in upstreams.iter().filter(|url| url.is_https()) {
            if connector.name_for(url.host()).is_err() {
                errors.push(format!(
                    "{here}.upstreams: \"{url}\": the host is not a name a certificate can be \
                     checked against; set upstream_tls.server_name"
                ));
            }
        }
        Some(connector)
    }

    /// The setting a problem of the TLS settings comes from.
    fn setting_of(&self, error: &crate::tls_client::TlsClientError) -> &'static str {
        use crate::tls_client::TlsClientError;
        match error {
            TlsClientError::File { path, .. } if path == Path::new(self.key_file.trim()) => {
                "key_file"
            }
            TlsClientError::File { path, .. } if path == Path::new(self.cert_file.trim()) => {
                "cert_file"
            }
            TlsClientError::Identity { .. } => "cert_file",
            TlsClientError::ServerName(_) => "server_name",
            TlsClientError::File { .. } | TlsClientError::NoRoots(_) => "ca_file",
        }
    }
}

/// A file or name setting: `None` when empty.
fn field(text: &str) -> Option<&str> {
    Some(text.trim()).filter(|t| !t.is_empty())
}

/// Hosts on which `[mail] tls = "none"` is allowed: nothing leaves the machine.
fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Reads an operator's mail template: the first line `Subject: ...`, a blank
/// line, then the body.
fn mail_template(name: &str, path: &str, errors: &mut Vec<String>) -> Option<MailTemplate> {
    if path.trim().is_empty() {
        return None;
    }
    let text = match std::fs::read_to_string(path.trim()) {
        Ok(text) => text,
        Err(error) => {
            errors.push(format!("{name}: cannot read {path:?}: {error}"));
            return None;
        }
    };
    let (first, rest) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    let Some(subject) = first.trim_end_matches('\r').strip_prefix("Subject:") else {
        errors.push(format!(
            "{name}: {path:?} must start with a \"Subject: ...\" line, then a blank line and the body"
        ));
        return None;
    };
    let body = rest.trim_start_matches(['\r', '\n']);
    if body.trim().is_empty() {
        errors.push(format!("{name}: {path:?} has no body after the subject"));
        return None;
    }
    Some(MailTemplate {
        subject: subject.trim().to_string(),
        body: body.to_string(),
    })
}

impl super::file::MailSection {
    fn validate(&self, errors: &mut Vec<String>) -> Option<MailSettings> {
        let host = self.host.trim();
        if host.is_empty() {
            return None;
        }
        let tls = self.tls_mode(host, errors);
        let port = self.port_for(tls, errors);
        let from = self.from.trim();
        if from.parse::<lettre::message::Mailbox>().is_err() {
            errors.push(format!(
                "mail.from: an address such as \"keygate <noreply@example.com>\", got {from:?}"
            ));
        }
        let credentials = self.credentials(errors);
        if credentials.is_some() && tls == MailTls::None {
            errors.push("mail.username: a password is never sent without TLS".into());
        }
        let queue_size = positive_usize("mail.queue_size", self.queue_size, errors);
        let retries = if self.retries < 0 {
            errors.push(format!(
                "mail.retries: must not be negative, got {}",
                self.retries
            ));
            0
        } else {
            self.retries.min(20) as u32
        };
        let reset_link_lifetime = nonzero_duration(
            "mail.reset_link_lifetime",
            &self.reset_link_lifetime,
            errors,
        );
        if reset_link_lifetime > Duration::from_secs(24 * 3600) {
            errors.push("mail.reset_link_lifetime: at most 24h".into());
        }
        let code_lifetime = nonzero_duration("mail.code_lifetime", &self.code_lifetime, errors);
        if !(Duration::from_secs(30)..=Duration::from_secs(3600)).contains(&code_lifetime) {
            errors.push("mail.code_lifetime: from 30s to 1h".into());
        }
        Some(MailSettings {
            host: host.to_string(),
            port,
            tls,
            credentials,
            from: from.to_string(),
            timeout: nonzero_duration("mail.timeout", &self.timeout, errors),
            queue_size,
            retries,
            retry_backoff: nonzero_duration("mail.retry_backoff", &self.retry_backoff, errors),
            reset_link_lifetime,
            code_lifetime,
            activation_template: mail_template(
                "mail.activation_template",
                &self.activation_template,
                errors,
            ),
            reset_template: mail_template("mail.reset_template", &self.reset_template, errors),
            password_reset_template: mail_template(
                "mail.password_reset_template",
                &self.password_reset_template,
                errors,
            ),
            code_template: mail_template("mail.code_template", &self.code_template, errors),
        })
    }

    /// The TLS mode `mail.tls` names; none only to a loopback `host`.
    fn tls_mode(&self, host: &str, errors: &mut Vec<String>) -> MailTls {
        match self.tls.trim().to_ascii_lowercase().as_str() {
            "starttls" => MailTls::StartTls,
            "tls" => MailTls::Tls,
            "none" => {
                if !is_loopback_host(host) {
                    errors.push(format!(
                        "mail.tls: \"none\" sends passwords and links in clear: only for a loopback host, not {host:?}"
                    ));
                }
                MailTls::None
            }
            other => {
                errors.push(format!(
                    "mail.tls: \"starttls\", \"tls\" or \"none\", got {other:?}"
                ));
                MailTls::StartTls
            }
        }
    }

    /// `mail.port`, or the TLS mode's when it is 0.
    fn port_for(&self, tls: MailTls, errors: &mut Vec<String>) -> u16 {
        match self.port {
            0 => match tls {
                MailTls::StartTls => 587,
                MailTls::Tls => 465,
                MailTls::None => 25,
            },
            n => u16::try_from(n).ok().filter(|p| *p > 0).unwrap_or_else(|| {
                errors.push(format!(
                    "mail.port: from 1 to 65535 (0: the TLS mode's), got {n}"
                ));
                25
            }),
        }
    }

    /// The user name and password to log in with, both or neither.
    fn credentials(&self, errors: &mut Vec<String>) -> Option<(String, String)> {
        match (self.username.trim(), self.password.as_str()) {
            ("", "") => None,
            ("", _) => {
                errors.push("mail.username: required when a mail password is set".into());
                None
            }
            (_, "") => {
                errors.push(
                    "mail.password: required with mail.username (set KEYGATE_MAIL_PASSWORD)".into(),
                );
                None
            }
            (user, password) => Some((user.to_string(), password.to_string())),
        }
    }
}
