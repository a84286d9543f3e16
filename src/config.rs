//! Configuration: the TOML file, environment overrides, and validation into the
//! runtime [`Settings`]. Every problem is collected and reported at once.
//!
//! Precedence, lowest first: built-in defaults, the file, the platform's
//! `JWT_*` variables, then `KEYGATE_<SECTION>_<KEY>` variables.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ipnet::IpNet;
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
    pub api_browser: ApiBrowserSection,
    pub log: LogSection,
    #[serde(rename = "route")]
    pub routes: Vec<RouteSection>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    pub data_dir: String,
    pub shutdown_grace: String,
    pub public_base_url: String,
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
}

/// Pruning of dead store rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSection {
    pub interval: String,
    pub sessions: String,
    pub activation_tokens: String,
    pub batch_size: i64,
    pub max_rows_per_run: i64,
}

impl Default for RetentionSection {
    fn default() -> Self {
        RetentionSection {
            interval: "1h".into(),
            sessions: "30d".into(),
            activation_tokens: "7d".into(),
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
    pub password_min_length: i64,
    pub password_max_length: i64,
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

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteSection {
    pub name: String,
    pub prefix: String,
    pub upstreams: Vec<String>,
    pub public: bool,
    pub request_timeout: String,
    pub openapi: String,
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
            api_browser: ApiBrowserSection::default(),
            log: LogSection::default(),
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
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            data_dir: "data".into(),
            shutdown_grace: "30s".into(),
            public_base_url: String::new(),
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
        }
    }
}
impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            url: "sqlite://data/keygate.db".into(),
            max_connections: 8,
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

/// All problems found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "invalid configuration ({}):",
            Count(self.0.len(), "problem", "problems")
        )?;
        for problem in &self.0 {
            writeln!(f, "  - {problem}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    /// The problems on one line, separated by "; ", for a log field.
    pub fn one_line(&self) -> String {
        self.0.join("; ")
    }
}

/// A number with its noun in the right form: "1 route", "2 routes".
#[derive(Debug, Clone, Copy)]
pub struct Count(pub usize, pub &'static str, pub &'static str);

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Count(n, one, many) = *self;
        write!(f, "{n} {}", if n == 1 { one } else { many })
    }
}

impl std::error::Error for ConfigErrors {}

// ---------------------------------------------------------------------------
// Runtime settings
// ---------------------------------------------------------------------------

/// Validated settings, in the types the server uses.
#[derive(Debug, Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub shutdown_grace: Duration,
    /// `scheme://host[:port]` clients use to reach keygate, for links it builds.
    pub public_base_url: Option<String>,
    pub listen: Listen,
    /// Certificate and key files; `None` means a generated development certificate.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub store_url: String,
    pub store_max_connections: u32,
    pub retention: RetentionSettings,
    pub jwt: JwtSettings,
    pub api_key_prefix: String,
    /// Disable a key at once when it arrives over plain HTTP (it is exposed).
    pub disable_key_on_plaintext: bool,
    pub cache: CacheSettings,
    pub proxy: ProxySettings,
    pub limits: Limits,
    pub login: LoginSettings,
    pub password_policy: PasswordPolicy,
    pub api_browser: ApiBrowserSettings,
    pub log: LogSettings,
    /// The routes as loaded. A started server moves them into its route
    /// table ([`crate::proxy::Routes`]), the one copy that reload swaps and
    /// everything reads; its settings then hold none.
    pub routes: Vec<RouteSpec>,
}

/// How dead store rows are pruned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Time between runs; `None` turns pruning off.
    pub interval: Option<Duration>,
    /// How long a session is kept once it is dead (ended, or its refresh
    /// token expired).
    pub sessions: Duration,
    /// How long an activation token is kept once it expired.
    pub activation_tokens: Duration,
    /// Rows deleted by one statement.
    pub batch_size: u32,
    /// Rows of one kind deleted by one run.
    pub max_rows_per_run: u64,
}

/// Largest `retention.batch_size`: one statement stays short.
const MAX_PRUNE_BATCH: i64 = 100_000;

#[derive(Debug, Clone)]
pub struct ApiBrowserSettings {
    pub enabled: bool,
    pub refresh: Duration,
    pub fetch_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct LoginSettings {
    pub limiter: crate::auth::limiter::LimiterSettings,
    /// Consecutive failures that lock an account; 0 turns lockout off.
    pub lockout_after: u32,
    /// Password hashes computed at once.
    pub max_concurrent_hashes: usize,
}

/// Length rules for new passwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PasswordPolicy {
    pub min_length: usize,
    pub max_length: usize,
}

impl Default for PasswordPolicy {
    fn default() -> Self {
        PasswordPolicy {
            min_length: 8,
            max_length: 72,
        }
    }
}

impl PasswordPolicy {
    /// Checks a new password; the message names the rule that failed.
    pub fn check(&self, password: &str) -> Result<(), String> {
        let len = password.chars().count();
        if len < self.min_length {
            return Err(format!(
                "Password must be at least {} long",
                Count(self.min_length, "character", "characters")
            ));
        }
        if len > self.max_length {
            return Err(format!(
                "Password must be at most {} long",
                Count(self.max_length, "character", "characters")
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct Listen {
    pub https: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub max_connections: usize,
    /// Accept passwords and Bearer tokens over plain HTTP from any peer, not
    /// only from loopback and trusted proxies that report https.
    pub allow_plaintext_credentials: bool,
    /// Connections one client address may hold open at once, over all listeners.
    pub max_connections_per_address: usize,
    /// The same for a configured trusted proxy; `None`: only `max_connections`.
    pub max_connections_per_trusted_proxy: Option<usize>,
    /// Connections open at once on the admin listener (its own budget).
    pub admin_max_connections: usize,
}

#[derive(Clone)]
pub struct JwtSettings {
    pub access_ttl: Duration,
    pub refresh_ttl: Duration,
    pub issuer: String,
    /// Decoded signing key, when configured; otherwise the store keeps one.
    pub signing_key: Option<Vec<u8>>,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("access_ttl", &self.access_ttl)
            .field("refresh_ttl", &self.refresh_ttl)
            .field("issuer", &self.issuer)
            .field(
                "signing_key",
                &self.signing_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct CacheSettings {
    pub capacity: u64,
    pub ttl: Duration,
    pub negative_ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub trusted_proxies: Vec<IpNet>,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    pub upstream_retry_after: Duration,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: u64,
    pub header_read_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Time an owned endpoint waits for the whole request body.
    pub body_read_timeout: Duration,
    pub http2_keep_alive_interval: Duration,
    pub http2_keep_alive_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone)]
pub struct LogSettings {
    pub format: LogFormat,
    pub access_log: bool,
}

#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// Metric label: the configured name, or the prefix.
    pub name: String,
    pub prefix: String,
    pub upstreams: Vec<http::Uri>,
    pub public: bool,
    pub request_timeout: Duration,
    /// Where the upstream publishes its OpenAPI document, if it does.
    pub openapi: Option<http::Uri>,
}

/// Where configuration comes from.
pub struct Source<'a> {
    /// The file, if any; `None` runs on the built-in defaults.
    pub file: Option<&'a Path>,
    /// Environment variables to apply.
    pub env: Vec<(String, String)>,
}

/// `KEYGATE_` variables that are not config keys.
const NON_CONFIG_ENV: &[&str] = &[
    "KEYGATE_CONFIG",
    "KEYGATE_BOOTSTRAP_PASSWORD",
    "KEYGATE_TEST_DATABASE_URL",
];

/// The platform's setting names, mapped onto `[jwt]`.
const PLATFORM_ENV: &[(&str, &str)] = &[
    ("JWT_TOKEN_EXPIRATION_TIME", "token_expiration_time"),
    (
        "JWT_REFRESH_TOKEN_EXPIRATION_TIME",
        "refresh_token_expiration_time",
    ),
    ("JWT_TOKEN_ISSUER", "token_issuer"),
    ("JWT_TOKEN_SIGNING_KEY", "token_signing_key"),
];

/// Loads, overrides and validates, reporting every problem at once.
pub fn load(source: &Source<'_>) -> Result<Settings, ConfigErrors> {
    let mut errors = Vec::new();
    let schema = Value::try_from(FileConfig::default()).expect("defaults serialize");
    let mut value = match source.file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => match text.parse::<toml::Table>() {
                Ok(table) => Value::Table(table),
                Err(e) => {
                    return Err(ConfigErrors(vec![format!(
                        "{}: {}",
                        path.display(),
                        e.to_string().trim_end()
                    )]));
                }
            },
            Err(e) => return Err(ConfigErrors(vec![format!("{}: {e}", path.display())])),
        },
        None => schema.clone(),
    };
    apply_env(&mut value, &schema, &source.env, &mut errors);
    check_shape(&mut value, &schema, "", &mut errors);
    let file: FileConfig = match value.try_into() {
        Ok(file) => file,
        Err(e) => {
            errors.push(e.to_string().trim_end().to_string());
            return Err(ConfigErrors(errors));
        }
    };
    let settings = validate(&file, &mut errors);
    if errors.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Applies `JWT_*` and `KEYGATE_<SECTION>_<KEY>` variables, typed by the schema.
fn apply_env(
    value: &mut Value,
    schema: &Value,
    env: &[(String, String)],
    errors: &mut Vec<String>,
) {
    let mut sections: Vec<&str> = schema
        .as_table()
        .map(|t| {
            t.iter()
                .filter(|(_, v)| v.is_table())
                .map(|(k, _)| k.as_str())
                .collect()
        })
        .unwrap_or_default();
    // Longest first, so `api_keys_prefix` is not read as section `api`.
    sections.sort_by_key(|s| std::cmp::Reverse(s.len()));

    let mut overrides: Vec<(String, String, &str, &str)> = Vec::new();
    for (name, raw) in env {
        if let Some((_, key)) = PLATFORM_ENV.iter().find(|(n, _)| n == name) {
            overrides.push(("jwt".into(), (*key).into(), name, raw));
        }
    }
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("KEYGATE_") else {
            continue;
        };
        if NON_CONFIG_ENV.contains(&name.as_str()) {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        let found = sections.iter().find_map(|section| {
            let key = lower.strip_prefix(section)?.strip_prefix('_')?;
            schema.get(section)?.get(key)?;
            Some((section.to_string(), key.to_string()))
        });
        match found {
            Some((section, key)) => overrides.push((section, key, name, raw)),
            None => errors.push(format!("{name}: not a configuration setting")),
        }
    }
    for (section, key, name, raw) in overrides {
        let Some(expected) = schema.get(&section).and_then(|s| s.get(&key)) else {
            continue;
        };
        let parsed = match expected {
            Value::String(_) => Some(Value::String(raw.to_string())),
            Value::Integer(_) => raw.trim().parse::<i64>().ok().map(Value::Integer),
            Value::Boolean(_) => match raw.trim() {
                "true" | "1" => Some(Value::Boolean(true)),
                "false" | "0" => Some(Value::Boolean(false)),
                _ => None,
            },
            Value::Array(_) => Some(Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            )),
            _ => None,
        };
        let Some(parsed) = parsed else {
            errors.push(format!(
                "{name}: expected {}, got {raw:?}",
                expected.type_str()
            ));
            continue;
        };
        if let Some(table) = value.as_table_mut() {
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| Value::Table(toml::Table::new()));
            if let Some(section_table) = entry.as_table_mut() {
                section_table.insert(key, parsed);
            }
        }
    }
}

/// Reports unknown keys and wrong types against the defaults, removing the
/// offending entries so that validation can go on and report the rest.
fn check_shape(value: &mut Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
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
                    } else {
                        check_shape(child, expected_child, &child_path, errors);
                    }
                }
            }
        }
        (Value::Array(items), Value::Array(expected)) => {
            let element_schema = if path == "route" {
                Some(Value::try_from(RouteSection::default()).expect("route serializes"))
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

fn validate(file: &FileConfig, errors: &mut Vec<String>) -> Settings {
    let mut duration = |name: &str, text: &str| match parse_duration(text) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            errors.push(format!("{name}: must be greater than zero"));
            Duration::from_secs(1)
        }
        Err(e) => {
            errors.push(format!("{name}: {e}"));
            Duration::from_secs(1)
        }
    };
    let shutdown_grace = duration("server.shutdown_grace", &file.server.shutdown_grace);
    let cache = CacheSettings {
        capacity: 0,
        ttl: duration("cache.ttl", &file.cache.ttl),
        negative_ttl: duration("cache.negative_ttl", &file.cache.negative_ttl),
    };
    let connect_timeout = duration("proxy.connect_timeout", &file.proxy.connect_timeout);
    let request_timeout = duration("proxy.request_timeout", &file.proxy.request_timeout);
    let pool_idle_timeout = duration("proxy.pool_idle_timeout", &file.proxy.pool_idle_timeout);
    let upstream_retry_after = duration(
        "proxy.upstream_retry_after",
        &file.proxy.upstream_retry_after,
    );
    let header_read_timeout = duration(
        "limits.header_read_timeout",
        &file.limits.header_read_timeout,
    );
    let tls_handshake_timeout = duration(
        "limits.tls_handshake_timeout",
        &file.limits.tls_handshake_timeout,
    );
    let idle_timeout = duration("limits.idle_timeout", &file.limits.idle_timeout);
    let body_read_timeout = duration("limits.body_read_timeout", &file.limits.body_read_timeout);
    let http2_keep_alive_interval = duration(
        "limits.http2_keep_alive_interval",
        &file.limits.http2_keep_alive_interval,
    );
    let http2_keep_alive_timeout = duration(
        "limits.http2_keep_alive_timeout",
        &file.limits.http2_keep_alive_timeout,
    );
    let browser_refresh = duration("api_browser.refresh", &file.api_browser.refresh);
    let browser_fetch_timeout =
        duration("api_browser.fetch_timeout", &file.api_browser.fetch_timeout);
    let account_window = duration("login.account_window", &file.login.account_window);
    let address_window = duration("login.address_window", &file.login.address_window);

    let mut positive = |name: &str, n: i64| -> u64 {
        if n <= 0 {
            errors.push(format!("{name}: must be a positive integer, got {n}"));
            1
        } else {
            n as u64
        }
    };
    let max_connections = positive("listen.max_connections", file.listen.max_connections) as usize;
    let max_connections_per_address = positive(
        "listen.max_connections_per_address",
        file.listen.max_connections_per_address,
    ) as usize;
    let admin_max_connections = positive(
        "listen.admin_max_connections",
        file.listen.admin_max_connections,
    ) as usize;
    let store_max_connections =
        positive("store.max_connections", file.store.max_connections) as u32;
    let capacity = positive("cache.capacity", file.cache.capacity);
    let pool_max_idle_per_host = positive(
        "proxy.pool_max_idle_per_host",
        file.proxy.pool_max_idle_per_host,
    ) as usize;
    let max_header_bytes =
        positive("limits.max_header_bytes", file.limits.max_header_bytes) as usize;
    let max_body_bytes = positive("limits.max_body_bytes", file.limits.max_body_bytes);
    let account_max_failures = positive(
        "login.account_max_failures",
        file.login.account_max_failures,
    );
    let account_address_max_failures = positive(
        "login.account_address_max_failures",
        file.login.account_address_max_failures,
    );
    let address_max_failures = positive(
        "login.address_max_failures",
        file.login.address_max_failures,
    );
    let limiter_capacity = positive("login.limiter_capacity", file.login.limiter_capacity);
    let password_min_length = positive("login.password_min_length", file.login.password_min_length);
    let password_max_length = positive("login.password_max_length", file.login.password_max_length);
    if password_min_length > password_max_length {
        errors.push("login.password_min_length: must not exceed login.password_max_length".into());
    }
    if file.login.lockout_after < 0 || file.login.max_concurrent_hashes < 0 {
        errors.push(
            "login.lockout_after and login.max_concurrent_hashes: must not be negative".into(),
        );
    }
    let max_concurrent_hashes = match file.login.max_concurrent_hashes {
        n if n > 0 => n as usize,
        // Auto: half the cores, so logins never take every core from proxying.
        _ => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
    };

    let listen = Listen {
        https: optional_addr("listen.https", &file.listen.https, errors),
        http: optional_addr("listen.http", &file.listen.http, errors),
        admin: optional_addr("listen.admin", &file.listen.admin, errors),
        max_connections,
        allow_plaintext_credentials: file.listen.allow_plaintext_credentials,
        max_connections_per_address,
        max_connections_per_trusted_proxy: match file.listen.max_connections_per_trusted_proxy {
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
    };
    if file.listen.https.trim().is_empty() && file.listen.http.trim().is_empty() {
        errors.push("listen: at least one of https and http must be set".into());
    }
    if max_header_bytes < 1024 {
        errors.push("limits.max_header_bytes: must be at least 1024".into());
    }

    let tls_files = match (file.tls.cert.trim(), file.tls.key.trim()) {
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
    };

    let store_url = file.store.url.trim().to_string();
    if !(store_url.starts_with("sqlite:")
        || store_url.starts_with("postgres://")
        || store_url.starts_with("postgresql://"))
    {
        errors.push(format!(
            "store.url: must start with sqlite:, postgres:// or postgresql://, got {store_url:?}"
        ));
    }

    let jwt = validate_jwt(&file.jwt, errors);
    let retention = validate_retention(&file.retention, errors);

    let prefix = &file.api_keys.prefix;
    if prefix.len() > 16
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        errors.push(format!(
            "api_keys.prefix: at most 16 characters of [A-Za-z0-9_-], got {prefix:?}"
        ));
    }

    let mut trusted_proxies = Vec::new();
    for cidr in &file.proxy.trusted_proxies {
        match parse_cidr(cidr) {
            Some(net) => trusted_proxies.push(net),
            None => errors.push(format!(
                "proxy.trusted_proxies: {cidr:?} is not a CIDR or IP address"
            )),
        }
    }

    let format = match file.log.format.as_str() {
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => {
            errors.push(format!(
                "log.format: must be \"human\" or \"json\", got {other:?}"
            ));
            LogFormat::Human
        }
    };

    let routes = validate_routes(&file.routes, request_timeout, errors);
    let public_base_url = public_base_url(&file.server.public_base_url, errors);

    Settings {
        data_dir: PathBuf::from(&file.server.data_dir),
        shutdown_grace,
        public_base_url,
        listen,
        tls_files,
        store_url,
        store_max_connections,
        retention,
        jwt,
        api_key_prefix: prefix.clone(),
        disable_key_on_plaintext: file.api_keys.disable_on_plaintext,
        cache: CacheSettings { capacity, ..cache },
        proxy: ProxySettings {
            trusted_proxies,
            connect_timeout,
            request_timeout,
            pool_idle_timeout,
            pool_max_idle_per_host,
            upstream_retry_after,
        },
        limits: Limits {
            max_header_bytes,
            max_body_bytes,
            header_read_timeout,
            tls_handshake_timeout,
            idle_timeout,
            body_read_timeout,
            http2_keep_alive_interval,
            http2_keep_alive_timeout,
        },
        login: LoginSettings {
            limiter: crate::auth::limiter::LimiterSettings {
                account_max_failures: account_max_failures.min(u64::from(u32::MAX)) as u32,
                account_address_max_failures: account_address_max_failures.min(u64::from(u32::MAX))
                    as u32,
                account_window,
                address_max_failures: address_max_failures.min(u64::from(u32::MAX)) as u32,
                address_window,
                capacity: limiter_capacity,
            },
            lockout_after: file.login.lockout_after.clamp(0, i64::from(u32::MAX)) as u32,
            max_concurrent_hashes,
        },
        api_browser: ApiBrowserSettings {
            enabled: file.api_browser.enabled,
            refresh: browser_refresh,
            fetch_timeout: browser_fetch_timeout,
        },
        password_policy: PasswordPolicy {
            min_length: password_min_length as usize,
            max_length: password_max_length as usize,
        },
        log: LogSettings {
            format,
            access_log: file.log.access_log,
        },
        routes,
    }
}

fn validate_jwt(jwt: &JwtSection, errors: &mut Vec<String>) -> JwtSettings {
    let access = jwt.token_expiration_time;
    let refresh = jwt.refresh_token_expiration_time;
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
    if jwt.token_issuer.trim().is_empty() {
        errors.push("jwt.token_issuer (JWT_TOKEN_ISSUER): must not be empty".into());
    }
    let signing_key = match jwt.token_signing_key.trim() {
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
    };
    JwtSettings {
        access_ttl: Duration::from_secs(access.max(0) as u64),
        refresh_ttl: Duration::from_secs(refresh.max(0) as u64),
        issuer: jwt.token_issuer.clone(),
        signing_key,
    }
}

fn validate_retention(section: &RetentionSection, errors: &mut Vec<String>) -> RetentionSettings {
    let mut duration = |name: &str, text: &str| match parse_duration(text) {
        Ok(d) => d,
        Err(e) => {
            errors.push(format!("retention.{name}: {e}"));
            Duration::ZERO
        }
    };
    let interval = match section.interval.trim() {
        "" => None,
        text => Some(duration("interval", text)).filter(|d| !d.is_zero()),
    };
    let sessions = duration("sessions", &section.sessions);
    let activation_tokens = duration("activation_tokens", &section.activation_tokens);
    let (batch, per_run) = (section.batch_size, section.max_rows_per_run);
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
        batch_size: batch.clamp(1, MAX_PRUNE_BATCH) as u32,
        max_rows_per_run: per_run.max(1) as u64,
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
    let mut specs = Vec::with_capacity(routes.len());
    for (i, route) in routes.iter().enumerate() {
        let here = format!("route[{i}]");
        if !route.prefix.starts_with('/') {
            errors.push(format!(
                "{here}.prefix: must start with '/', got {:?}",
                route.prefix
            ));
        }
        if route.prefix.contains(['?', '#', '%'])
            || route.prefix.contains("/../")
            || route.prefix.contains("/./")
        {
            errors.push(format!(
                "{here}.prefix: must be a plain, normalised path, got {:?}",
                route.prefix
            ));
        }
        if specs.iter().any(|s: &RouteSpec| s.prefix == route.prefix) {
            errors.push(format!(
                "{here}.prefix: {:?} is configured twice",
                route.prefix
            ));
        }
        if route.upstreams.is_empty() {
            errors.push(format!(
                "{here}.upstreams: at least one upstream is required"
            ));
        }
        let mut upstreams = Vec::new();
        for upstream in &route.upstreams {
            match parse_upstream(upstream) {
                Ok(uri) => upstreams.push(uri),
                Err(e) => errors.push(format!("{here}.upstreams: {upstream:?}: {e}")),
            }
        }
        let request_timeout = if route.request_timeout.trim().is_empty() {
            default_timeout
        } else {
            match parse_duration(&route.request_timeout) {
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
        };
        let name = if route.name.trim().is_empty() {
            route.prefix.clone()
        } else {
            route.name.clone()
        };
        // A path is resolved against the first upstream; when that one is
        // invalid it was reported above, and is not reported again here.
        let first_upstream = route
            .upstreams
            .first()
            .and_then(|text| parse_upstream(text).ok());
        let openapi = match route.openapi.trim() {
            "" => None,
            text if text.starts_with('/')
                && first_upstream.is_none()
                && !route.upstreams.is_empty() =>
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
        };
        specs.push(RouteSpec {
            openapi,
            name,
            prefix: route.prefix.clone(),
            upstreams,
            public: route.public,
            request_timeout,
        });
    }
    specs
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

fn parse_cidr(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

/// What one URL setting accepts, beyond what every URL must be (see [`check_url`]).
struct UrlRule {
    schemes: &'static [&'static str],
    /// A path other than `/` is allowed.
    path: bool,
    /// A query is allowed.
    query: bool,
    /// How the setting is written, for messages.
    example: &'static str,
}

/// A route's upstream: the base that request paths are appended to.
const UPSTREAM_URL: UrlRule = UrlRule {
    schemes: &["http"],
    path: true,
    query: false,
    example: "http://host:port[/base-path]",
};

/// A route's `openapi` document, when written as a full URL.
const OPENAPI_URL: UrlRule = UrlRule {
    schemes: &["http"],
    path: true,
    query: true,
    example: "http://host:port/path",
};

const PUBLIC_BASE_URL: UrlRule = UrlRule {
    schemes: &["http", "https"],
    path: false,
    query: false,
    example: "https://host[:port]",
};

/// Checks an absolute URL part by part: a scheme the setting takes, a host,
/// a port (when one is written) that is a number from 1 to 65535, no user
/// name or password, no fragment, and a path or query only where the setting
/// takes one. The message names the first problem found, one per URL.
fn check_url(text: &str, rule: &UrlRule) -> Result<http::Uri, String> {
    let schemes = rule.schemes.join(" or ");
    let example = rule.example;
    if text.contains(char::is_whitespace) {
        return Err(format!("must not contain spaces; write {example}"));
    }
    if text.contains('#') {
        return Err("must not have a fragment (#...)".into());
    }
    if !text.contains("://") {
        return Err(format!("missing scheme; write {example}"));
    }
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("not a URL ({e}); write {example}"))?;
    match uri.scheme_str() {
        Some(scheme) if rule.schemes.contains(&scheme) => {}
        Some(other) => return Err(format!("scheme {other:?} is not supported; use {schemes}")),
        None => return Err(format!("missing scheme; write {example}")),
    }
    let authority = uri
        .authority()
        .map(http::uri::Authority::as_str)
        .unwrap_or("");
    if authority.contains('@') {
        return Err("must not contain a user name or password".into());
    }
    // The host is a bracketed IPv6 address or a name; the port follows the
    // last ':' after it.
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => {
                if v6.parse::<std::net::Ipv6Addr>().is_err() {
                    return Err(format!("[{v6}] is not an IPv6 address"));
                }
                match after {
                    "" => (v6, None),
                    _ => match after.strip_prefix(':') {
                        Some(port) => (v6, Some(port)),
                        None => return Err(format!("unexpected {after:?} after the host")),
                    },
                }
            }
            None => return Err("unclosed '[' in the host".into()),
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(format!("missing host; write {example}"));
    }
    if !authority.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("{host:?} is not a host name or address"));
    }
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65_535).contains(&p));
        if !valid {
            return Err(format!("port {port:?} is not a number from 1 to 65535"));
        }
    }
    if !rule.path && uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("must not have a path; write {example}"));
    }
    if uri.query().is_some() && !rule.query {
        return Err(format!("must not have a query; write {example}"));
    }
    Ok(uri)
}

/// An upstream base URL: `http://host:port[/base-path]`.
fn parse_upstream(text: &str) -> Result<http::Uri, String> {
    check_url(text.trim(), &UPSTREAM_URL)
}

/// An upstream's OpenAPI document: a path relative to the route's first
/// upstream (`/v3/api-docs`), or a full `http://` URL.
fn openapi_url(text: &str, upstream: Option<&http::Uri>) -> Result<http::Uri, String> {
    if text.starts_with('/') {
        let base = upstream.ok_or("a path needs an upstream to resolve it against")?;
        let joined = format!("{}{text}", base.to_string().trim_end_matches('/'));
        return check_url(&joined, &OPENAPI_URL)
            .map_err(|e| format!("{e} (resolved as {joined:?})"));
    }
    check_url(text, &OPENAPI_URL)
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `7d` (one number, one unit).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit (ms, s, m, h, d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s"))?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn load_text(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigErrors> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        load(&Source {
            file: Some(file.path()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    #[test]
    fn counts_use_the_singular_for_one_only() {
        assert_eq!(Count(0, "route", "routes").to_string(), "0 routes");
        assert_eq!(Count(1, "route", "routes").to_string(), "1 route");
        assert_eq!(Count(2, "route", "routes").to_string(), "2 routes");
        let one = ConfigErrors(vec!["listen.https: bad".into()]);
        assert!(
            one.to_string()
                .starts_with("invalid configuration (1 problem):\n"),
            "{one}"
        );
        let two = ConfigErrors(vec!["a: bad".into(), "b: bad".into()]);
        assert!(two.to_string().contains("(2 problems)"), "{two}");
        assert_eq!(two.one_line(), "a: bad; b: bad");
        let policy = PasswordPolicy {
            min_length: 1,
            max_length: 1,
        };
        assert_eq!(
            policy.check("").unwrap_err(),
            "Password must be at least 1 character long"
        );
        assert_eq!(
            policy.check("ab").unwrap_err(),
            "Password must be at most 1 character long"
        );
    }

    #[test]
    fn built_in_defaults_are_valid() {
        let settings = load(&Source {
            file: None,
            env: vec![],
        })
        .unwrap();
        assert_eq!(
            settings.listen.https,
            Some("127.0.0.1:8443".parse().unwrap())
        );
        assert_eq!(settings.jwt.access_ttl, Duration::from_secs(9000));
        assert_eq!(settings.jwt.issuer, "thingsboard.io");
        assert_eq!(settings.routes.len(), 2);
    }

    #[test]
    fn shipped_config_file_is_valid_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/keygate.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let defaults = Value::try_from(FileConfig::default()).unwrap();
        assert_eq!(
            Value::Table(table),
            defaults,
            "config/keygate.toml drifted from the defaults"
        );
        load(&Source {
            file: Some(&path),
            env: vec![],
        })
        .unwrap();
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let errors = load_text(
            r#"
            bogus = 1
            [listen]
            https = "not-an-address"
            colour = "blue"
            [jwt]
            token_expiration_time = 30
            refresh_token_expiration_time = "long"
            [[route]]
            prefix = "api"
            upstreams = ["ftp://x"]
            "#,
            &[],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        for needle in [
            "bogus: unknown key",
            "listen.colour: unknown key",
            "listen.https",
            "jwt.refresh_token_expiration_time: expected integer",
            "at least 60 seconds",
            "route[0].prefix",
            "scheme \"ftp\"",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn environment_overrides_file_and_platform_names_apply() {
        let settings = load_text(
            "[listen]\nhttp = \"\"\n",
            &[
                ("KEYGATE_LISTEN_HTTPS", "0.0.0.0:443"),
                ("KEYGATE_PROXY_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.1"),
                ("KEYGATE_API_KEYS_PREFIX", "kg_"),
                ("JWT_TOKEN_EXPIRATION_TIME", "120"),
                ("JWT_TOKEN_ISSUER", "example.org"),
                ("KEYGATE_JWT_TOKEN_ISSUER", "wins.example"),
                ("KEYGATE_CONFIG", "ignored"),
                ("PATH", "/usr/bin"),
            ],
        )
        .unwrap();
        assert_eq!(settings.listen.https, Some("0.0.0.0:443".parse().unwrap()));
        assert_eq!(settings.listen.http, None);
        assert_eq!(settings.proxy.trusted_proxies.len(), 2);
        assert_eq!(settings.api_key_prefix, "kg_");
        assert_eq!(settings.jwt.access_ttl, Duration::from_secs(120));
        assert_eq!(settings.jwt.issuer, "wins.example");
    }

    #[test]
    fn unknown_environment_setting_is_an_error() {
        let errors = load_text(
            "",
            &[("KEYGATE_LISTEN_HTTPZ", "x"), ("KEYGATE_CACHE_TTL", "soon")],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        assert!(
            text.contains("KEYGATE_LISTEN_HTTPZ: not a configuration setting"),
            "{text}"
        );
        assert!(text.contains("cache.ttl"), "{text}");
    }

    #[test]
    fn jwt_lifetime_rules_are_checked() {
        let errors = load_text(
            "",
            &[
                ("JWT_TOKEN_EXPIRATION_TIME", "1000"),
                ("JWT_REFRESH_TOKEN_EXPIRATION_TIME", "900"),
            ],
        )
        .unwrap_err();
        assert!(
            errors.0.iter().any(|e| e.contains("must be shorter")),
            "{errors}"
        );
    }

    #[test]
    fn short_signing_key_is_refused_with_a_clear_message() {
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let errors = load_text("", &[("JWT_TOKEN_SIGNING_KEY", &short)]).unwrap_err();
        assert!(
            errors.0[0].contains("at least 512 bits, got 256 bits"),
            "{errors}"
        );
        let long = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
        let settings = load_text("", &[("JWT_TOKEN_SIGNING_KEY", &long)]).unwrap();
        assert_eq!(settings.jwt.signing_key.as_deref(), Some(&[7u8; 64][..]));
        assert!(!format!("{:?}", settings.jwt).contains("7, 7"));
    }

    #[test]
    fn password_policy_names_the_rule() {
        let policy = PasswordPolicy::default();
        assert!(policy.check("short").unwrap_err().contains("at least 8"));
        assert!(
            policy
                .check(&"x".repeat(73))
                .unwrap_err()
                .contains("at most 72")
        );
        policy.check("eightchr").unwrap();
        let errors = load_text(
            "[login]\npassword_min_length = 20\npassword_max_length = 10\n",
            &[],
        )
        .unwrap_err();
        assert!(
            errors.0.iter().any(|e| e.contains("must not exceed")),
            "{errors}"
        );
    }

    #[test]
    fn connection_limits_have_documented_defaults_and_are_checked() {
        let settings = load_text("", &[]).unwrap();
        assert_eq!(settings.listen.max_connections_per_address, 256);
        assert_eq!(settings.listen.max_connections_per_trusted_proxy, None);
        assert_eq!(settings.listen.admin_max_connections, 64);
        assert_eq!(settings.limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(settings.limits.body_read_timeout, Duration::from_secs(10));
        assert_eq!(
            settings.limits.http2_keep_alive_interval,
            Duration::from_secs(20)
        );
        assert_eq!(
            settings.limits.http2_keep_alive_timeout,
            Duration::from_secs(20)
        );
        let settings = load_text(
            "[listen]\nmax_connections_per_trusted_proxy = 2000\n",
            &[("KEYGATE_LIMITS_IDLE_TIMEOUT", "5s")],
        )
        .unwrap();
        assert_eq!(
            settings.listen.max_connections_per_trusted_proxy,
            Some(2000)
        );
        assert_eq!(settings.limits.idle_timeout, Duration::from_secs(5));
        let errors = load_text(
            "[listen]\nmax_connections_per_address = 0\nmax_connections_per_trusted_proxy = -1\n\
             [limits]\nidle_timeout = \"0s\"\nbody_read_timeout = \"soon\"\n",
            &[],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        for needle in [
            "listen.max_connections_per_address: must be a positive integer",
            "listen.max_connections_per_trusted_proxy: must not be negative",
            "limits.idle_timeout: must be greater than zero",
            "limits.body_read_timeout",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn retention_defaults_zero_interval_and_bounds() {
        let defaults = load_text("", &[]).unwrap().retention;
        assert_eq!(
            defaults,
            RetentionSettings {
                interval: Some(Duration::from_secs(3600)),
                sessions: Duration::from_secs(30 * 86_400),
                activation_tokens: Duration::from_secs(7 * 86_400),
                batch_size: 500,
                max_rows_per_run: 10_000,
            }
        );
        for off in ["0s", ""] {
            let settings = load_text("", &[("KEYGATE_RETENTION_INTERVAL", off)]).unwrap();
            assert_eq!(settings.retention.interval, None, "{off:?}");
        }
        let settings = load_text("[retention]\nsessions = \"0s\"\n", &[]).unwrap();
        assert_eq!(settings.retention.sessions, Duration::ZERO);
        let errors = load_text(
            "[retention]\nbatch_size = 0\nmax_rows_per_run = -1\nactivation_tokens = \"soon\"\n",
            &[],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        for needle in [
            "retention.batch_size: from 1 to 100000, got 0",
            "retention.max_rows_per_run: at least",
            "retention.activation_tokens",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn every_url_setting_is_checked_ports_included() {
        let errors = load_text(
            r#"
            [server]
            public_base_url = "https://keygate.example:0"
            [[route]]
            prefix = "/a/"
            upstreams = ["http://127.0.0.1:notaport", "http://127.0.0.1:99999", "http://127.0.0.1:"]
            openapi = "http://docs.example:65536/v3/api-docs"
            [[route]]
            prefix = "/b/"
            upstreams = ["http://user:secret@127.0.0.1:80", "http://:80", "http://bad host:80"]
            openapi = "/v3/api-docs"
            [[route]]
            prefix = "/c/"
            upstreams = ["http://[::1:80", "http://[::1]x", "http://127.0.0.1:80/base?x=1", "http://127.0.0.1:80/#top"]
            openapi = "docs.example/v3/api-docs"
            "#,
            &[],
        )
        .unwrap_err();
        let expected = [
            r#"server.public_base_url: "https://keygate.example:0": port "0" is not a number from 1 to 65535"#,
            r#"route[0].upstreams: "http://127.0.0.1:notaport": port "notaport" is not a number from 1 to 65535"#,
            r#"route[0].upstreams: "http://127.0.0.1:99999": port "99999" is not a number from 1 to 65535"#,
            r#"route[0].upstreams: "http://127.0.0.1:": port "" is not a number from 1 to 65535"#,
            r#"route[0].openapi: "http://docs.example:65536/v3/api-docs": port "65536" is not a number from 1 to 65535"#,
            r#"route[1].upstreams: "http://user:secret@127.0.0.1:80": must not contain a user name or password"#,
            r#"route[1].upstreams: "http://:80": missing host"#,
            r#"route[1].upstreams: "http://bad host:80": must not contain spaces"#,
            r#"route[2].upstreams: "http://[::1:80": "#,
            r#"route[2].upstreams: "http://[::1]x": "#,
            r#"route[2].upstreams: "http://127.0.0.1:80/base?x=1": must not have a query"#,
            r#"route[2].upstreams: "http://127.0.0.1:80/#top": must not have a fragment"#,
            r#"route[2].openapi: "docs.example/v3/api-docs": missing scheme"#,
        ];
        for wanted in expected {
            let found = errors.0.iter().filter(|p| p.starts_with(wanted)).count();
            assert_eq!(found, 1, "{wanted:?} once in:\n{errors}");
        }
        assert_eq!(
            errors.0.len(),
            expected.len(),
            "one message per problem, none for route[1].openapi (its upstream is already reported):\n{errors}"
        );

        let settings = load_text(
            r#"
            [server]
            public_base_url = "https://keygate.example:8443/"
            [[route]]
            prefix = "/a/"
            upstreams = ["http://127.0.0.1:65535", "http://[::1]:8080/base", "http://entity_service:80", "http://upstream.example"]
            openapi = "/v3/api-docs?group=public"
            "#,
            &[],
        )
        .unwrap();
        assert_eq!(
            settings.public_base_url.as_deref(),
            Some("https://keygate.example:8443")
        );
        assert_eq!(settings.routes[0].upstreams.len(), 4);
        assert_eq!(
            settings.routes[0].openapi.as_ref().map(ToString::to_string),
            Some("http://127.0.0.1:65535/v3/api-docs?group=public".into())
        );
    }

    #[test]
    fn routes_without_a_name_are_labelled_by_prefix() {
        let settings = load_text(
            "[[route]]\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2/base\"]\nrequest_timeout = \"5s\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(settings.routes[0].name, "/api/");
        assert_eq!(settings.routes[0].upstreams.len(), 2);
        assert_eq!(settings.routes[0].request_timeout, Duration::from_secs(5));
    }
}
