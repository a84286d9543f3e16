//! The config file as written: its raw sections and their defaults, and the
//! shape check against them.

use serde::{Deserialize, Serialize};
use toml::Value;

/// The config file as written. Every field has a default, documented in
/// `config/keygate.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub listen: ListenSection,
    pub tls: TlsSection,
    pub store: StoreSection,
    pub retention: RetentionSection,
    pub jwt: JwtSection,
    pub api_keys: ApiKeySection,
    pub cache: CacheSection,
    pub proxy: ProxySection,
    pub limits: LimitsSection,
    pub login: LoginSection,
    pub redis: RedisSection,
    pub quota: QuotaSection,
    pub api_browser: ApiBrowserSection,
    pub log: LogSection,
    pub websocket: WebSocketSection,
    pub platform: PlatformSection,
    pub assertion: AssertionSection,
    pub two_factor: TwoFactorSection,
    pub mail: MailSection,
    #[serde(rename = "route")]
    pub routes: Vec<RouteSection>,
    /// Single sign-on providers; none by default (and then not written out,
    /// so the shipped file need not list an empty array).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub oidc: Vec<OidcSection>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    pub data_dir: String,
    pub shutdown_grace: String,
    pub public_base_url: String,
    pub workers: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenSection {
    pub https: String,
    pub http: String,
    pub admin: String,
    pub max_connections: i64,
    pub allow_plaintext_credentials: bool,
    pub max_connections_per_address: i64,
    pub max_connections_per_trusted_proxy: i64,
    pub admin_max_connections: i64,
    pub admin_max_connections_per_address: i64,
    pub admin_header_read_timeout: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    pub url: String,
    pub max_connections: i64,
    /// "auto" (`serve` applies pending migrations) or "never" (`serve`
    /// refuses a schema that is behind; `keygate migrate` applies them).
    pub migrate: String,
    /// "none" or "transaction": what `url` reaches (PgBouncer's pool mode).
    pub pooler: String,
    /// A direct PostgreSQL URL for `LISTEN` and migrations; "" uses `url`.
    pub notify_url: String,
}

/// Pruning of dead store rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSection {
    pub interval: String,
    pub sessions: String,
    pub activation_tokens: String,
    pub audit_events: String,
    pub batch_size: i64,
    pub max_rows_per_run: i64,
}

impl Default for RetentionSection {
    fn default() -> Self {
        RetentionSection {
            interval: "1h".into(),
            sessions: "30d".into(),
            activation_tokens: "7d".into(),
            audit_events: "365d".into(),
            batch_size: 500,
            max_rows_per_run: 10_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSection {
    pub token_expiration_time: i64,
    pub refresh_token_expiration_time: i64,
    pub token_issuer: String,
    pub token_signing_key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKeySection {
    pub prefix: String,
    pub disable_on_plaintext: bool,
    pub max_per_user: i64,
    pub unknown_lookups_per_address: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    pub capacity: i64,
    pub ttl: String,
    pub negative_ttl: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxySection {
    pub trusted_proxies: Vec<String>,
    pub connect_timeout: String,
    pub request_timeout: String,
    pub pool_idle_timeout: String,
    pub pool_max_idle_per_host: i64,
    pub upstream_retry_after: String,
    pub max_connections_per_upstream: i64,
    pub max_upstream_connections: i64,
    pub upstream_queue: i64,
    pub upstream_queue_timeout: String,
    pub pass_server_header: bool,
    pub fast_path: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    pub max_header_bytes: i64,
    pub max_body_bytes: i64,
    pub header_read_timeout: String,
    pub tls_handshake_timeout: String,
    pub idle_timeout: String,
    pub body_read_timeout: String,
    pub http2_keep_alive_interval: String,
    pub http2_keep_alive_timeout: String,
    pub http2_max_concurrent_streams: i64,
    pub max_in_flight_per_connection: i64,
    pub max_in_flight_per_address: i64,
    pub min_body_rate: i64,
    pub buffered_body_bytes: i64,
    pub ipv6_prefix_len: i64,
    pub management_writes_per_user: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoginSection {
    pub account_max_failures: i64,
    pub account_address_max_failures: i64,
    pub account_window: String,
    pub address_max_failures: i64,
    pub address_window: String,
    pub limiter_capacity: i64,
    pub lockout_after: i64,
    pub max_concurrent_hashes: i64,
    pub hash_nice: i64,
    pub hash_wait: String,
    pub max_bcrypt_cost: i64,
    pub password_min_length: i64,
    pub password_max_length: i64,
}

/// Where limits are shared between replicas; an empty URL keeps them local.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSection {
    pub url: String,
    /// A PEM CA trusted besides the system's roots, for a `rediss://` URL.
    pub ca_file: String,
    pub connect_timeout: String,
    pub command_timeout: String,
    pub key_prefix: String,
}

impl Default for RedisSection {
    fn default() -> Self {
        RedisSection {
            url: String::new(),
            ca_file: String::new(),
            connect_timeout: "1s".into(),
            command_timeout: "100ms".into(),
            key_prefix: "keygate:".into(),
        }
    }
}

/// Request quotas: the rates of routes that set none of their own.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaSection {
    pub per_key: String,
    pub per_user: String,
    pub per_tenant: String,
    pub sync_interval: String,
    pub capacity: i64,
}

impl Default for QuotaSection {
    fn default() -> Self {
        QuotaSection {
            per_key: String::new(),
            per_user: String::new(),
            per_tenant: String::new(),
            sync_interval: "100ms".into(),
            capacity: 100_000,
        }
    }
}

/// A route's own quotas: `""` the global rate, `"off"` none, or a rate.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteQuotaSection {
    pub per_key: String,
    pub per_user: String,
    pub per_tenant: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiBrowserSection {
    pub enabled: bool,
    pub refresh: String,
    pub fetch_timeout: String,
}

impl Default for ApiBrowserSection {
    fn default() -> Self {
        ApiBrowserSection {
            enabled: true,
            refresh: "60s".into(),
            fetch_timeout: "5s".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    pub format: String,
    pub access_log: bool,
}

/// The platform's own access tokens, minted for `identity = "platform"`
/// routes.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlatformSection {
    /// The Base64 text of the platform's `tokenSigningKey`.
    pub signing_key: String,
    pub issuer: String,
    pub token_lifetime: String,
    /// The platform's PostgreSQL database, read every `sync_interval`;
    /// empty: no sync.
    pub database_url: String,
    pub sync_interval: String,
    /// The `[[route]]` (with `identity = "platform"`) the user-entity
    /// endpoints go to while the sync is on.
    pub upstream: String,
    /// Customers whose id opens `POST /api/auth/login/public`, besides those
    /// `keygate import platform` found marked public.
    pub public_customers: Vec<PublicCustomerEntry>,
}

/// One `[[platform.public_customers]]` entry: a public customer and its tenant.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublicCustomerEntry {
    pub customer_id: String,
    pub tenant_id: String,
}

impl std::fmt::Debug for PlatformSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlatformSection")
            .field(
                "signing_key",
                &(!self.signing_key.is_empty()).then_some("<redacted>"),
            )
            .field("issuer", &self.issuer)
            .field("token_lifetime", &self.token_lifetime)
            .field("public_customers", &self.public_customers)
            .field(
                "database_url",
                &(!self.database_url.is_empty()).then_some("<redacted>"),
            )
            .field("sync_interval", &self.sync_interval)
            .field("upstream", &self.upstream)
            .finish()
    }
}

impl Default for PlatformSection {
    fn default() -> Self {
        PlatformSection {
            signing_key: String::new(),
            issuer: "thingsboard.io".into(),
            token_lifetime: "5m".into(),
            public_customers: Vec::new(),
            database_url: String::new(),
            sync_interval: "10s".into(),
            upstream: String::new(),
        }
    }
}

/// The platform's WebSocket routes and their limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocketSection {
    pub routes: Vec<String>,
    pub auth_timeout: String,
    pub max_message_bytes: i64,
    pub max_per_user: i64,
    pub max_per_tenant: i64,
    pub ping_interval: String,
    pub idle_timeout: String,
}

impl Default for WebSocketSection {
    fn default() -> Self {
        WebSocketSection {
            routes: vec!["/api/ws".into(), "/api/ws/plugins/".into()],
            auth_timeout: "10s".into(),
            max_message_bytes: 32 * 1024,
            max_per_user: 0,
            max_per_tenant: 0,
            ping_interval: "30s".into(),
            idle_timeout: "30s".into(),
        }
    }
}

/// The signed identity assertion of `identity = "assertion"` routes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AssertionSection {
    /// `iss`; "" means `server.public_base_url`, else "keygate".
    pub issuer: String,
    pub lifetime: String,
    /// "ES256" (P-256) or "EdDSA" (Ed25519).
    pub algorithm: String,
    /// A PKCS#8 PEM private key; "" means generated once and kept in the store.
    pub signing_key_file: String,
    /// `Cache-Control: max-age` of `/.well-known/jwks.json`.
    pub jwks_max_age: String,
    /// Send one assertion per credential and audience until 90% of its
    /// lifetime is spent; `false`: a fresh one (fresh `jti`) per request.
    pub reuse: bool,
}

impl Default for AssertionSection {
    fn default() -> Self {
        AssertionSection {
            issuer: String::new(),
            lifetime: "5m".into(),
            algorithm: "ES256".into(),
            signing_key_file: String::new(),
            jwks_max_age: "5m".into(),
            reuse: true,
        }
    }
}

/// Second factors at login.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TwoFactorSection {
    pub providers: Vec<String>,
    pub issuer_name: String,
    pub backup_codes: i64,
    pub verification_time: String,
    pub max_verification_failures: i64,
    pub encryption_secret: String,
    pub old_encryption_secrets: String,
    pub enforce: bool,
    pub enforced_users: String,
    pub enforced_tenants: Vec<String>,
}

impl Default for TwoFactorSection {
    fn default() -> Self {
        TwoFactorSection {
            providers: vec!["TOTP".into(), "BACKUP_CODE".into()],
            issuer_name: "keygate".into(),
            backup_codes: 10,
            verification_time: "5m".into(),
            max_verification_failures: 5,
            encryption_secret: String::new(),
            old_encryption_secrets: String::new(),
            enforce: false,
            enforced_users: "ALL_USERS".into(),
            enforced_tenants: Vec::new(),
        }
    }
}

/// Outgoing mail: invitations, password resets and e-mail codes.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MailSection {
    /// The SMTP server; "" sends no mail.
    pub host: String,
    /// 0: the TLS mode's port (587, 465 or 25).
    pub port: i64,
    /// "starttls", "tls" or "none" (loopback only).
    pub tls: String,
    pub username: String,
    /// Best given as `KEYGATE_MAIL_PASSWORD`.
    pub password: String,
    pub from: String,
    pub timeout: String,
    pub queue_size: i64,
    pub retries: i64,
    pub retry_backoff: String,
    pub reset_link_lifetime: String,
    pub code_lifetime: String,
    pub activation_template: String,
    pub reset_template: String,
    pub password_reset_template: String,
    pub code_template: String,
}

impl std::fmt::Debug for MailSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailSection")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl Default for MailSection {
    fn default() -> Self {
        MailSection {
            host: String::new(),
            port: 0,
            tls: "starttls".into(),
            username: String::new(),
            password: String::new(),
            from: String::new(),
            timeout: "10s".into(),
            queue_size: 1000,
            retries: 3,
            retry_backoff: "5s".into(),
            reset_link_lifetime: "1h".into(),
            code_lifetime: "2m".into(),
            activation_template: String::new(),
            reset_template: String::new(),
            password_reset_template: String::new(),
            code_template: String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteSection {
    pub name: String,
    pub prefix: String,
    pub upstreams: Vec<String>,
    pub public: bool,
    pub request_timeout: String,
    pub openapi: String,
    pub quota: RouteQuotaSection,
    /// How the verified identity reaches the upstream: "headers",
    /// "assertion" or "platform" ("" reads as "headers").
    pub identity: String,
    /// The assertion's `aud`; "" means the route's name.
    pub audience: String,
    /// How the route's `https://` upstreams are trusted and what they are
    /// shown; every field "" (the default) reads as unset.
    pub upstream_tls: UpstreamTlsSection,
}

/// A route's `upstream_tls`: PEM files and the name to verify, "" for each
/// that is not set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamTlsSection {
    /// CA certificates trusted besides the system's roots.
    pub ca_file: String,
    /// The client certificate chain shown to the upstream, with its key.
    pub cert_file: String,
    pub key_file: String,
    /// The name the upstream's certificate must bear, in place of the
    /// URL's host.
    pub server_name: String,
}

impl UpstreamTlsSection {
    /// Whether any field is set.
    pub fn is_set(&self) -> bool {
        [
            &self.ca_file,
            &self.cert_file,
            &self.key_file,
            &self.server_name,
        ]
        .iter()
        .any(|field| !field.trim().is_empty())
    }
}

/// One `[[oidc]]`: an OpenID Connect provider for single sign-on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OidcSection {
    pub name: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    pub client_secret_file: String,
    pub scopes: Vec<String>,
    pub button_label: String,
    pub icon: String,
    pub email_claim: String,
    pub first_name_claim: String,
    pub last_name_claim: String,
    pub require_verified_email: bool,
    pub allow_user_creation: bool,
    pub authority: String,
    pub tenant_id: String,
    pub customer_id: String,
    pub authority_claim: String,
    pub authority_map: std::collections::BTreeMap<String, String>,
    pub trust_provider_mfa: bool,
    pub accept_access_tokens: bool,
    pub audience: String,
    pub ca_file: String,
}

impl Default for OidcSection {
    fn default() -> Self {
        OidcSection {
            name: String::new(),
            issuer: String::new(),
            client_id: String::new(),
            client_secret: String::new(),
            client_secret_file: String::new(),
            scopes: vec!["openid".into(), "email".into(), "profile".into()],
            button_label: String::new(),
            icon: String::new(),
            email_claim: "email".into(),
            first_name_claim: "given_name".into(),
            last_name_claim: "family_name".into(),
            require_verified_email: true,
            allow_user_creation: false,
            authority: "CUSTOMER_USER".into(),
            tenant_id: String::new(),
            customer_id: String::new(),
            authority_claim: String::new(),
            authority_map: Default::default(),
            trust_provider_mfa: false,
            accept_access_tokens: false,
            audience: String::new(),
            ca_file: String::new(),
        }
    }
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            server: ServerSection::default(),
            listen: ListenSection::default(),
            tls: TlsSection::default(),
            store: StoreSection::default(),
            retention: RetentionSection::default(),
            jwt: JwtSection::default(),
            api_keys: ApiKeySection::default(),
            cache: CacheSection::default(),
            proxy: ProxySection::default(),
            limits: LimitsSection::default(),
            login: LoginSection::default(),
            redis: RedisSection::default(),
            quota: QuotaSection::default(),
            api_browser: ApiBrowserSection::default(),
            log: LogSection::default(),
            websocket: WebSocketSection::default(),
            platform: PlatformSection::default(),
            assertion: AssertionSection::default(),
            two_factor: TwoFactorSection::default(),
            mail: MailSection::default(),
            routes: vec![
                RouteSection {
                    name: "api".into(),
                    prefix: "/api/".into(),
                    upstreams: vec!["http://127.0.0.1:9000".into()],
                    ..RouteSection::default()
                },
                RouteSection {
                    name: "noauth".into(),
                    prefix: "/api/noauth/".into(),
                    upstreams: vec!["http://127.0.0.1:9000".into()],
                    public: true,
                    ..RouteSection::default()
                },
            ],
            oidc: Vec::new(),
        }
    }
}

impl Default for RouteSection {
    fn default() -> Self {
        RouteSection {
            name: String::new(),
            prefix: String::new(),
            upstreams: Vec::new(),
            public: false,
            request_timeout: String::new(),
            openapi: String::new(),
            quota: RouteQuotaSection::default(),
            identity: "headers".into(),
            audience: String::new(),
            upstream_tls: UpstreamTlsSection::default(),
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            data_dir: "data".into(),
            shutdown_grace: "30s".into(),
            public_base_url: String::new(),
            workers: 0,
        }
    }
}
impl Default for ListenSection {
    fn default() -> Self {
        ListenSection {
            https: "127.0.0.1:8443".into(),
            http: "127.0.0.1:8080".into(),
            admin: "127.0.0.1:9090".into(),
            max_connections: 10_000,
            allow_plaintext_credentials: false,
            max_connections_per_address: 256,
            max_connections_per_trusted_proxy: 0,
            admin_max_connections: 64,
            admin_max_connections_per_address: 8,
            admin_header_read_timeout: "2s".into(),
        }
    }
}
impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            url: "sqlite://data/keygate.db".into(),
            max_connections: 8,
            migrate: "auto".into(),
            pooler: "none".into(),
            notify_url: String::new(),
        }
    }
}
impl Default for JwtSection {
    fn default() -> Self {
        JwtSection {
            token_expiration_time: 9000,
            refresh_token_expiration_time: 604_800,
            token_issuer: "thingsboard.io".into(),
            token_signing_key: String::new(),
        }
    }
}
impl Default for ApiKeySection {
    fn default() -> Self {
        ApiKeySection {
            prefix: "tb_".into(),
            disable_on_plaintext: false,
            max_per_user: 100,
            unknown_lookups_per_address: "100/m".into(),
        }
    }
}
impl Default for CacheSection {
    fn default() -> Self {
        CacheSection {
            capacity: 100_000,
            ttl: "30s".into(),
            negative_ttl: "5s".into(),
        }
    }
}
impl Default for ProxySection {
    fn default() -> Self {
        ProxySection {
            trusted_proxies: Vec::new(),
            connect_timeout: "2s".into(),
            request_timeout: "60s".into(),
            pool_idle_timeout: "90s".into(),
            pool_max_idle_per_host: 256,
            upstream_retry_after: "5s".into(),
            max_connections_per_upstream: 1024,
            max_upstream_connections: 0,
            upstream_queue: 256,
            upstream_queue_timeout: "1s".into(),
            pass_server_header: false,
            fast_path: true,
        }
    }
}
impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_header_bytes: 16 * 1024,
            max_body_bytes: 10 * 1024 * 1024,
            header_read_timeout: "10s".into(),
            tls_handshake_timeout: "10s".into(),
            idle_timeout: "60s".into(),
            body_read_timeout: "10s".into(),
            http2_keep_alive_interval: "20s".into(),
            http2_keep_alive_timeout: "20s".into(),
            http2_max_concurrent_streams: 128,
            max_in_flight_per_connection: 32,
            max_in_flight_per_address: 128,
            min_body_rate: 1024,
            buffered_body_bytes: 64 * 1024,
            ipv6_prefix_len: i64::from(crate::address::DEFAULT_IPV6_PREFIX_LEN),
            management_writes_per_user: "60/m".into(),
        }
    }
}
impl Default for LoginSection {
    fn default() -> Self {
        LoginSection {
            account_max_failures: 100,
            account_address_max_failures: 10,
            account_window: "15m".into(),
            address_max_failures: 100,
            address_window: "15m".into(),
            limiter_capacity: 100_000,
            lockout_after: 0,
            max_concurrent_hashes: 0,
            hash_nice: 10,
            hash_wait: "10s".into(),
            max_bcrypt_cost: 12,
            password_min_length: 8,
            password_max_length: 72,
        }
    }
}
impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            format: "human".into(),
            access_log: true,
        }
    }
}

/// The shape every file is checked against: the defaults, with the arrays
/// of tables that are empty by default (`[[oidc]]`) named too.
pub(super) fn schema() -> Value {
    let mut schema = Value::try_from(FileConfig::default()).expect("defaults serialize");
    if let Some(table) = schema.as_table_mut() {
        table
            .entry("oidc")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    schema
}

/// Tables whose keys are the operator's own (`[[oidc]] authority_map`):
/// their values' types are checked when the section is read.
const FREE_FORM_TABLES: &[&str] = &["authority_map"];

/// Reports unknown keys and wrong types against the defaults, removing the
/// offending entries so that validation can go on and report the rest.
pub(super) fn check_shape(value: &mut Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    match (value, schema) {
        (Value::Table(table), Value::Table(expected)) => {
            let keys: Vec<String> = table.keys().cloned().collect();
            for key in keys {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                let Some(expected_child) = expected.get(&key) else {
                    errors.push(format!("{child_path}: unknown key"));
                    table.remove(&key);
                    continue;
                };
                if let Some(child) = table.get_mut(&key) {
                    if child.type_str() != expected_child.type_str() {
                        errors.push(format!(
                            "{child_path}: expected {}, got {}",
                            expected_child.type_str(),
                            child.type_str()
                        ));
                        table.remove(&key);
                    } else if !FREE_FORM_TABLES.contains(&key.as_str()) {
                        check_shape(child, expected_child, &child_path, errors);
                    }
                }
            }
        }
        (Value::Array(items), Value::Array(expected)) => {
            let element_schema = if path == "route" {
                Some(Value::try_from(RouteSection::default()).expect("route serializes"))
            } else if path == "oidc" {
                Some(Value::try_from(OidcSection::default()).expect("oidc serializes"))
            } else if path == "platform.public_customers" {
                Some(Value::try_from(PublicCustomerEntry::default()).expect("entry serializes"))
            } else {
                expected
                    .first()
                    .cloned()
                    .or(Some(Value::String(String::new())))
            };
            if let Some(element_schema) = element_schema {
                for (i, item) in items.iter_mut().enumerate() {
                    let item_path = format!("{path}[{i}]");
                    if item.type_str() != element_schema.type_str() {
                        errors.push(format!(
                            "{item_path}: expected {}, got {}",
                            element_schema.type_str(),
                            item.type_str()
                        ));
                        *item = element_schema.clone();
                    } else {
                        check_shape(item, &element_schema, &item_path, errors);
                    }
                }
            }
        }
        _ => {}
    }
}
