//! Configuration: the TOML file, environment overrides, and validation into the
//! runtime [`Settings`]. Every problem is collected and reported at once.
//!
//! Precedence, lowest first: built-in defaults, the file, the platform's
//! `JWT_*` variables, then `KEYGATE_<SECTION>_<KEY>` variables.
//!
//! Here: the public API ([`load`], [`Source`], [`Settings`] and the runtime
//! setting types, [`ConfigErrors`]). The stages, in the order [`load`] runs them:
//! - `file`: the raw TOML sections, their defaults and the shape check;
//! - `env`: environment overrides, typed by the defaults;
//! - `validate`: each raw section turning itself into its runtime setting;
//! - `url`: what each URL setting accepts, and [`UpstreamUrl`];
//! - `oidc`: the single sign-on providers (`[[oidc]]`, [`OidcSettings`]).

mod env;
mod file;
mod oidc;
pub mod rate;
mod url;
mod validate;
pub(crate) use validate::platform_key_engine;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use toml::Value;

use crate::tls_client::ClientTls;
use file::FileConfig;
pub use oidc::{
    AuthorityRule, ClientSecret, Creation, OidcSettings, check_issuer, is_loopback_host,
};
pub use url::{UpstreamUrl, redacted_url};

pub use crate::vocab::settings::{Pooler, RetentionSettings};

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

/// `store.migrate`: who applies the store's migrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreMigrate {
    /// `serve` applies pending migrations at start.
    #[default]
    Auto,
    /// `serve` refuses a schema that is behind; `keygate migrate`, run as
    /// its own step, applies the migrations.
    Never,
}

impl StoreMigrate {
    /// The setting's value from its text; `None` when it is neither.
    pub fn parse(text: &str) -> Option<StoreMigrate> {
        match text.trim() {
            "auto" => Some(StoreMigrate::Auto),
            "never" => Some(StoreMigrate::Never),
            _ => None,
        }
    }
}

/// Validated settings, in the types the server uses.
#[derive(Debug, Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub shutdown_grace: Duration,
    /// `scheme://host[:port]` clients use to reach keygate, for links it builds.
    pub public_base_url: Option<String>,
    /// Threads serving HTTPS and HTTP connections; 0: one per core.
    pub workers: usize,
    pub listen: Listen,
    /// Certificate and key files; `None` means a generated development certificate.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub store_url: String,
    pub store_max_connections: u32,
    /// Whether `serve` applies pending migrations (`store.migrate`).
    pub store_migrate: StoreMigrate,
    /// What `store_url` reaches: PostgreSQL or a transaction pooler.
    pub store_pooler: Pooler,
    /// `store.notify_url`: a direct PostgreSQL connection for the revocation
    /// channel and migrations; `None`: `store_url` serves them.
    pub store_notify_url: Option<String>,
    pub retention: RetentionSettings,
    pub jwt: JwtSettings,
    pub api_key_prefix: String,
    /// Disable a key at once when it arrives over plain HTTP (it is exposed).
    pub disable_key_on_plaintext: bool,
    /// API keys one user may hold; `None`: no cap.
    pub max_api_keys_per_user: Option<u64>,
    /// Store lookups of unknown API keys one client address key may cause;
    /// `None`: no budget.
    pub unknown_key_lookups_per_address: Option<rate::Rate>,
    pub cache: CacheSettings,
    pub proxy: ProxySettings,
    pub limits: HttpLimits,
    pub login: LoginSettings,
    /// Where limits are shared between replicas; `None` keeps them local.
    pub redis: Option<RedisSettings>,
    pub quota: QuotaSettings,
    pub password_policy: PasswordPolicy,
    pub api_browser: ApiBrowserSettings,
    pub log: LogSettings,
    pub websocket: WebSocketSettings,
    /// The platform's access tokens, for `identity = "platform"` routes.
    pub platform: PlatformSettings,
    pub assertion: AssertionSettings,
    pub two_factor: TwoFactorSettings,
    /// Outgoing mail; `None` when `[mail] host` is empty.
    pub mail: Option<MailSettings>,
    /// The routes as loaded. A started server moves them into its route
    /// table (the proxy's `Routes`), the one copy that reload swaps and
    /// everything reads; its settings then hold none.
    pub routes: Vec<RouteSpec>,
    /// Single sign-on providers (`[[oidc]]`), in the file's order.
    pub oidc: Vec<OidcSettings>,
}

impl Settings {
    /// How many worker threads serve connections: `server.workers`, where 0
    /// means one per core the process may use (a container's CPU limit
    /// included).
    pub(crate) fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}

#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[:password@]host[:port][/db]`, or `rediss://...` for TLS.
    pub url: String,
    /// Trusted besides the system's roots; only with a `rediss://` URL.
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// Longest a limit decision waits for Redis before deciding locally.
    pub command_timeout: Duration,
    /// Put before every key keygate writes.
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        let url = if self.url.contains('@') {
            "<redacted>"
        } else {
            &self.url
        };
        f.debug_struct("RedisSettings")
            .field("url", &url)
            .field("ca_file", &self.ca_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl RedisSettings {
    /// What TLS to Redis trusts, for a `rediss://` URL; `None` for
    /// `redis://`. Verification is always on.
    pub fn tls(&self) -> Option<ClientTls> {
        self.url.starts_with("rediss://").then(|| ClientTls {
            ca_file: self.ca_file.clone(),
            identity: None,
            alpn: Vec::new(),
        })
    }
}

/// How `identity = "assertion"` routes sign their assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssertionSettings {
    /// `iss` of every assertion.
    pub issuer: String,
    /// From `iat` to `exp`.
    pub lifetime: Duration,
    /// The algorithm of keys generated here (a key file's own decides for it).
    pub algorithm: AssertionAlgorithm,
    /// The private key's PEM file; `None`: a key generated once, in the store.
    pub signing_key_file: Option<PathBuf>,
    /// `Cache-Control: max-age` of the JWKS.
    pub jwks_max_age: Duration,
    /// One assertion per credential and audience, reused until 90% of its
    /// lifetime is spent; `false`: a fresh assertion on every request.
    pub reuse: bool,
}

/// The asymmetric algorithm of an assertion signing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssertionAlgorithm {
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl AssertionAlgorithm {
    /// The JWS `alg` name, also how the store names it.
    pub fn as_str(self) -> &'static str {
        match self {
            AssertionAlgorithm::Es256 => "ES256",
            AssertionAlgorithm::EdDsa => "EdDSA",
        }
    }

    pub fn parse(text: &str) -> Option<AssertionAlgorithm> {
        match text {
            "ES256" => Some(AssertionAlgorithm::Es256),
            "EdDSA" => Some(AssertionAlgorithm::EdDsa),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiBrowserSettings {
    pub enabled: bool,
    pub refresh: Duration,
    pub fetch_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct LoginSettings {
    pub limiter: LimiterSettings,
    /// Consecutive failures that lock an account; 0 turns lockout off.
    pub lockout_after: u32,
    /// Password hashes computed at once.
    pub max_concurrent_hashes: usize,
    /// How many steps of CPU priority (nice) hashing runs below proxying.
    pub hash_nice: i32,
    /// Longest a request waits for its turn to hash before a 503.
    pub hash_wait: Duration,
    /// The highest bcrypt cost an imported hash may have: a higher one is
    /// not imported, and one stored is refused at login without being run.
    pub max_bcrypt_cost: u32,
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
    /// Of those, connections one address may hold (counted apart from the
    /// other listeners).
    pub admin_max_connections_per_address: usize,
    /// Time an admin connection has to send its request head.
    pub admin_header_read_timeout: std::time::Duration,
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

/// How keygate mints the platform's own access tokens
/// (`identity::platform`).
#[derive(Clone)]
pub struct PlatformSettings {
    /// The decoded `tokenSigningKey` of the platform; `None` when not set
    /// (then no route may have `identity = "platform"`).
    pub signing_key: Option<Vec<u8>>,
    /// The `iss` of the tokens.
    pub issuer: String,
    /// How long a minted token is valid.
    pub token_lifetime: Duration,
    /// `platform.public_customers`: customers whose id opens a public
    /// login, besides those the import stored.
    pub public_customers: Vec<crate::vocab::settings::PublicCustomer>,
    /// Keeping keygate in sync with the platform's database; `None`: off.
    pub sync: Option<SyncSettings>,
    /// Whether `signing_key` came from the store (the import), not from the
    /// configuration: the sync then follows the platform's key when it
    /// rotates. A configured key stays until the configuration changes it.
    pub signing_key_imported: bool,
}

/// The sync with the platform's database (`[platform] database_url`,
/// `import::sync`).
#[derive(Clone)]
pub struct SyncSettings {
    /// The platform's PostgreSQL database (only read).
    pub database_url: String,
    /// How often it is read.
    pub interval: Duration,
    /// The name of the route (`identity = "platform"`) the user-entity
    /// endpoints are forwarded to.
    pub upstream: String,
}

impl std::fmt::Debug for SyncSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncSettings")
            .field("database_url", &"<redacted>")
            .field("interval", &self.interval)
            .field("upstream", &self.upstream)
            .finish()
    }
}

impl std::fmt::Debug for PlatformSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlatformSettings")
            .field(
                "signing_key",
                &self.signing_key.as_ref().map(|_| "<redacted>"),
            )
            .field("issuer", &self.issuer)
            .field("token_lifetime", &self.token_lifetime)
            .field("public_customers", &self.public_customers)
            .field("sync", &self.sync)
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
    /// Connections open (idle or busy) to one upstream at once.
    pub max_connections_per_upstream: usize,
    /// Connections open to all upstreams together; 0 until the server
    /// starts: what the descriptor limit leaves after client connections
    /// (`listener::descriptors`).
    pub max_upstream_connections: usize,
    /// Requests waiting at once for a connection to an upstream at its ceiling.
    pub upstream_queue: usize,
    /// Longest such a wait, then 503.
    pub upstream_queue_timeout: Duration,
    /// Let the upstream's `Server` header reach clients; off, it is removed
    /// (it names the upstream's software and version).
    pub pass_server_header: bool,
    /// Serve proxied HTTP/1.1 requests on the lean path
    /// (`listener::h1fast`); off, hyper serves every request.
    pub fast_path: bool,
}

#[derive(Debug, Clone)]
pub struct HttpLimits {
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
    /// Streams one HTTP/2 connection may have open at once.
    pub http2_max_concurrent_streams: u32,
    /// Proxied requests in flight on one client connection.
    pub max_in_flight_per_connection: usize,
    /// Proxied requests in flight from one client address, over its connections.
    pub max_in_flight_per_address: usize,
    /// Slowest a proxied request body may arrive once `body_read_timeout`
    /// has passed, in bytes per second of waiting; 0: no such floor.
    pub min_body_rate: u64,
    /// A proxied request body up to this size is read whole, at the pace
    /// above, before an upstream connection or an in-flight slot is taken
    /// (a larger one streams); 0: every body streams.
    pub buffered_body_bytes: u64,
    /// Leading bits of an IPv6 address that make its address key
    /// ([`crate::address::AddressKey`]), 1 to 128.
    pub ipv6_prefix_len: u8,
    /// Users and API keys one user may create; `None`: no limit.
    pub management_writes_per_user: Option<rate::Rate>,
}

/// Second factors at login (`[two_factor]`); the platform's
/// `/api/2fa/settings` may narrow the providers and change the numbers.
#[derive(Clone, PartialEq, Eq)]
pub struct TwoFactorSettings {
    /// `TOTP` and/or `BACKUP_CODE`, in the order offered.
    pub providers: Vec<String>,
    /// Named in authenticator apps next to the account.
    pub issuer_name: String,
    /// Backup codes generated at once.
    pub backup_codes: usize,
    /// Lifetime of a pre-verification token.
    pub verification_time: Duration,
    /// Wrong codes that end a pre-verification token.
    pub max_verification_failures: u32,
    /// Seals second-factor secrets at rest; `None`: derived from the token
    /// signing key.
    pub encryption_secret: Option<Vec<u8>>,
    /// Earlier secrets, still accepted for reading (rotation).
    pub old_encryption_secrets: Vec<Vec<u8>>,
    /// Users who must configure a second factor before they get a token
    /// pair (the platform's `enforceTwoFa` and `enforcedUsersFilter`);
    /// `None`: nobody is made to.
    pub enforced: Option<EnforcedUsers>,
}

/// Whom a second factor is enforced for: the platform's system-level users
/// filters, in its wire shape (`{"type": "ALL_USERS"}`, ...).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EnforcedUsers {
    /// Every user.
    AllUsers,
    /// Every SYS_ADMIN.
    SystemAdministrators,
    /// TENANT_ADMINs: of the tenants listed, or of every tenant when the
    /// list is missing or empty.
    TenantAdministrators {
        #[serde(
            default,
            rename = "tenantsIds",
            skip_serializing_if = "Option::is_none"
        )]
        tenants_ids: Option<Vec<uuid::Uuid>>,
        /// The platform's tenant profiles, which keygate does not know:
        /// refused when not empty.
        #[serde(
            default,
            rename = "tenantProfilesIds",
            skip_serializing_if = "Option::is_none"
        )]
        tenant_profiles_ids: Option<Vec<uuid::Uuid>>,
    },
}

impl std::fmt::Debug for TwoFactorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwoFactorSettings")
            .field("providers", &self.providers)
            .field("issuer_name", &self.issuer_name)
            .field("backup_codes", &self.backup_codes)
            .field("verification_time", &self.verification_time)
            .field("max_verification_failures", &self.max_verification_failures)
            .field("enforced", &self.enforced)
            .finish_non_exhaustive()
    }
}

/// How keygate talks to its SMTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailTls {
    /// Plain connection upgraded with STARTTLS, which must succeed.
    StartTls,
    /// TLS from the first byte.
    Tls,
    /// No TLS: loopback servers only.
    None,
}

/// A message as an operator wrote it: the subject and the body, with
/// `${name}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailTemplate {
    pub subject: String,
    pub body: String,
}

/// Outgoing mail (`[mail]`), for invitations, password resets and e-mail
/// codes.
#[derive(Clone, PartialEq, Eq)]
pub struct MailSettings {
    pub host: String,
    pub port: u16,
    pub tls: MailTls,
    /// Username and password; `None`: no authentication.
    pub credentials: Option<(String, String)>,
    pub from: String,
    /// One SMTP exchange, connect to the server's last answer.
    pub timeout: Duration,
    /// Messages waiting to be sent; past this a message is dropped, counted
    /// and logged, never waited for.
    pub queue_size: usize,
    /// Further attempts after a failed send.
    pub retries: u32,
    /// Wait before the first retry; doubled for each next one.
    pub retry_backoff: Duration,
    /// Lifetime of a password reset link.
    pub reset_link_lifetime: Duration,
    /// Lifetime of an e-mail verification code.
    pub code_lifetime: Duration,
    /// Operator templates; `None`: the platform's wording.
    pub activation_template: Option<MailTemplate>,
    pub reset_template: Option<MailTemplate>,
    pub password_reset_template: Option<MailTemplate>,
    pub code_template: Option<MailTemplate>,
}

impl std::fmt::Debug for MailSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailSettings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("username", &self.credentials.as_ref().map(|(user, _)| user))
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .field("queue_size", &self.queue_size)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// The platform's WebSocket routes (`websocket`) and their limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSocketSettings {
    /// Paths where keygate answers the upgrade and authenticates the socket
    /// the platform's way; one ending in `/` is a prefix, any other exact.
    pub routes: Vec<String>,
    /// Time a client has to authenticate (its first frame's `authCmd`).
    pub auth_timeout: Duration,
    /// Longest message (and frame) a client may send.
    pub max_message_bytes: usize,
    /// Open sockets one user may hold; `None`: no limit.
    pub max_per_user: Option<usize>,
    /// Open sockets one tenant's users may hold; `None`: no limit.
    pub max_per_tenant: Option<usize>,
    /// A client silent this long is pinged.
    pub ping_interval: Duration,
    /// A pinged client silent this long after the ping is closed.
    pub idle_timeout: Duration,
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
    pub upstreams: Vec<UpstreamUrl>,
    pub public: bool,
    pub request_timeout: Duration,
    /// Where the upstream publishes its OpenAPI document, if it does.
    pub openapi: Option<http::Uri>,
    /// The route's own quotas, per dimension.
    pub quota: RouteQuota,
    /// How the verified identity travels to the upstream.
    pub identity: crate::vocab::identity::IdentityMode,
    /// The `aud` of the route's assertions: its `audience`, or its name.
    pub audience: String,
    /// The TLS of its `https://` upstreams (and `https://` document), built
    /// from `upstream_tls` when the configuration was loaded; `None` when
    /// every one is `http://`.
    pub upstream_tls: Option<crate::tls_client::Connector>,
}

/// Where configuration comes from.
pub struct Source<'a> {
    /// The file, if any; `None` runs on the built-in defaults.
    pub file: Option<&'a Path>,
    /// Environment variables to apply.
    pub env: Vec<(String, String)>,
}

/// Loads, overrides and validates, reporting every problem at once.
pub fn load(source: &Source<'_>) -> Result<Settings, ConfigErrors> {
    load_written(source).map(|(settings, _)| settings)
}

/// The settings as [`load`] returns them, with every setting as written
/// (defaults filled in), for [`needs_restart`] to compare.
pub fn load_written(source: &Source<'_>) -> Result<(Settings, Written), ConfigErrors> {
    let mut errors = Vec::new();
    let schema = file::schema();
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
    env::apply(&mut value, &schema, &source.env, &mut errors);
    file::check_shape(&mut value, &schema, "", &mut errors);
    let file: FileConfig = match value.try_into() {
        Ok(file) => file,
        Err(e) => {
            errors.push(e.to_string().trim_end().to_string());
            return Err(ConfigErrors(errors));
        }
    };
    let settings = validate::validate(&file, &mut errors);
    if errors.is_empty() {
        let written = Written(Value::try_from(&file).expect("a loaded config serializes"));
        Ok((settings, written))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Every setting as written in the file and environment, defaults filled in.
#[derive(Clone)]
pub struct Written(Value);

/// What a reload applies: the routes and the TLS certificate files.
const RELOADED: [&str; 2] = ["route", "tls"];

/// The settings (`quota.per_key`, ...) that differ between `running` and
/// `reloaded` and that a reload does not apply: they take effect at the
/// next start. Names only, never values (some are secrets).
pub fn needs_restart(running: &Written, reloaded: &Written) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, changed: &mut Vec<String>) {
        match (a, b) {
            (Value::Table(a), Value::Table(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for key in keys {
                    if path.is_empty() && RELOADED.contains(&key.as_str()) {
                        continue;
                    }
                    let name = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    match (a.get(key), b.get(key)) {
                        (Some(a), Some(b)) => walk(&name, a, b, changed),
                        _ => changed.push(name),
                    }
                }
            }
            (a, b) if a != b => changed.push(path.to_owned()),
            _ => {}
        }
    }
    let mut changed = Vec::new();
    walk("", &running.0, &reloaded.0, &mut changed);
    changed
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

/// The brute-force limits of password checks (`auth::limiter`).
#[derive(Debug, Clone)]
pub struct LimiterSettings {
    /// Failed attempts per account over every address (the ceiling).
    pub account_max_failures: u32,
    /// Failed attempts per account from one address.
    pub account_address_max_failures: u32,
    pub account_window: Duration,
    /// Failed attempts per client address over every account.
    pub address_max_failures: u32,
    pub address_window: Duration,
    pub capacity: u64,
}

/// `[quota]`: the rates of routes that do not set their own, and the sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSettings {
    /// Per dimension, in key, user, tenant order; `None`: no quota.
    pub rates: [Option<rate::Rate>; 3],
    pub sync_interval: Duration,
    /// Budgets (subject and route) tracked at once.
    pub capacity: u64,
}

/// A route's own quota settings, per dimension in key, user, tenant order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteQuota(pub [rate::RouteRate; 3]);
