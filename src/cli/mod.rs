//! The command line: its arguments, and the commands, one module each.

mod assertion;
mod audit;
mod health;
mod import;
mod keys;
pub mod logging;
mod migrate;
mod prompt;
mod serve;
mod time;
mod users;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use uuid::Uuid;

use keygate::config::{AssertionAlgorithm, Settings};
use keygate::identity::Authority;
use keygate::store::{Audit, OpenOptions, Store, StoreError};

use crate::DEFAULT_CONFIG;

#[derive(Parser)]
#[command(
    name = "keygate",
    version,
    about = "Authentication gateway for a device-platform REST API"
)]
pub struct Cli {
    /// Config file. When the default path does not exist, built-in defaults are used.
    #[arg(long, global = true, env = "KEYGATE_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Log format; overrides `[log] format`.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormatArg>,
    /// Do not print which config file and store the command uses.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Human,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve {
        /// Development mode: the embedded defaults with the reference entity
        /// service behind keygate, in this process, and a console that says
        /// what to try next (a fresh API key included). Not for production.
        #[arg(long)]
        dev: bool,
    },
    /// Validate the configuration and print every problem found: the
    /// settings, and the TLS certificate and key files (each holding what it
    /// should, the key matching the certificate).
    CheckConfig {
        /// Also reach the store and Redis (when configured), as `serve` would.
        #[arg(long)]
        connect: bool,
    },
    /// Ask the running server's admin listener for /healthz (for container health checks).
    Health,
    /// Apply the store's pending schema migrations and exit: the step to
    /// run before a rollout when `store.migrate` is "never".
    Migrate {
        /// Apply nothing: exit non-zero, naming the pending migrations, when
        /// the schema is behind; exit 0 when it is up to date.
        #[arg(long)]
        check: bool,
    },
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Apikey(ApiKeyCommand),
    /// Manage the keys that sign identity assertions to upstreams.
    #[command(subcommand)]
    Assertion(AssertionCommand),
    /// Import users and API keys from another system.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Show the latest audit events (changes to users and API keys), newest
    /// first: a table, or one JSON object per line with --json.
    Audit(AuditArgs),
    /// Run the reference entity service (the upstream `serve --dev` runs in
    /// its process) on its own, for trying keygate in the production shape.
    /// It trusts the X-Auth-* headers it is sent and keeps its data in
    /// memory: never for production. Reads no config; prints
    /// `entity_service listening on ADDR` once bound; stops on SIGTERM or Ctrl-C.
    ReferenceUpstream(keygate::dev::ReferenceUpstreamArgs),
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// How many events, at most.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Only events since then: a duration back from now (24h, 7d) or an
    /// RFC 3339 time (2026-01-31T12:00:00Z).
    #[arg(long)]
    pub since: Option<String>,
    /// Only events made by, or made to, the user with this email address.
    #[arg(long)]
    pub user: Option<String>,
    /// Only events of this action (user.create, api_key.disable, ...).
    #[arg(long)]
    pub action: Option<String>,
    /// One JSON object per line, with times in epoch milliseconds.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a user. The password is asked for when standard input is a
    /// terminal, else read from its first line.
    #[command(after_help = "\
Authorities and the ids they need:
  SYS_ADMIN      administers the platform; no tenant id, no customer id
  TENANT_ADMIN   administers one tenant; needs --tenant-id
  CUSTOMER_USER  a user of one customer of a tenant; needs --tenant-id and --customer-id

The tenant and customer ids are the platform's UUIDs for them (shown in its UI and
REST API). The \"no tenant\" id 13814000-1dd2-11b2-8080-808080808080 is refused.

Example:
  keygate user add --email ops@example.com --authority TENANT_ADMIN \\
      --tenant-id 5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f")]
    Add {
        /// Email address; the user logs in with it (case does not matter).
        #[arg(long)]
        email: String,
        /// SYS_ADMIN, TENANT_ADMIN or CUSTOMER_USER.
        #[arg(long, value_parser = parse_authority)]
        authority: Authority,
        /// The platform's UUID of the user's tenant (TENANT_ADMIN and CUSTOMER_USER).
        #[arg(long)]
        tenant_id: Option<Uuid>,
        /// The platform's UUID of the user's customer (CUSTOMER_USER only).
        #[arg(long)]
        customer_id: Option<Uuid>,
        /// First name, as shown in the platform.
        #[arg(long, default_value = "")]
        first_name: String,
        /// Last name, as shown in the platform.
        #[arg(long, default_value = "")]
        last_name: String,
    },
    /// List users: id, authority, state, tenant, creation time and email.
    List {
        /// A JSON array, with times in epoch milliseconds.
        #[arg(long)]
        json: bool,
    },
    /// Disable a user: their keys and tokens stop working.
    Disable {
        /// The user's email address.
        email: String,
    },
    /// Enable a disabled user.
    Enable {
        /// The user's email address.
        email: String,
    },
    /// Delete a user with their keys and sessions.
    Delete {
        /// The user's email address.
        email: String,
    },
    /// Set a user's password; every earlier session and token of the user stops
    /// working. The password is asked for when standard input is a terminal,
    /// else read from its first line.
    SetPassword {
        /// The user's email address.
        email: String,
    },
}

#[derive(Subcommand)]
pub enum ImportCommand {
    /// Import the platform's users (ids, bcrypt passwords, invitations), API
    /// keys and signing settings from its PostgreSQL database, which is only
    /// read. Safe to re-run: only what changed on the platform since the last
    /// import is applied, and a password or key changed in keygate is kept.
    #[command(after_help = "\
Example:
  keygate import platform --dry-run \\
      --database-url postgres://reader@platform-db:5432/thingsboard
  keygate import platform --database-url postgres://reader@platform-db:5432/thingsboard")]
    Platform {
        /// The platform's PostgreSQL database, e.g. postgres://user:pass@host:5432/thingsboard;
        /// without it, the config's platform.database_url (the sync's).
        #[arg(long, env = "KEYGATE_PLATFORM_DATABASE_URL")]
        database_url: Option<String>,
        /// Read and validate everything and print what would be done; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Remove from keygate the users and keys imported before and deleted on the platform since.
        #[arg(long)]
        prune: bool,
        /// Print the outcome as JSON, for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ApiKeyCommand {
    /// Create a key; the key is printed once, as the last line of standard output.
    Create {
        /// Email address of the user the key acts as.
        #[arg(long)]
        email: String,
        /// What the key is for, shown in listings.
        #[arg(long, default_value = "API key")]
        description: String,
        /// Lifetime such as 30d or 12h; the key never expires when omitted.
        #[arg(long)]
        expires_in: Option<String>,
        /// Limit the key to a grant, 'METHOD[,METHOD...] /path' (a path
        /// prefix at a segment boundary; HEAD comes with GET). Repeat for
        /// more grants. Without any, the key has its user's full rights.
        #[arg(long = "scope", value_name = "GRANT", conflicts_with = "read_only")]
        scopes: Vec<String>,
        /// Limit the key to reading: GET (and HEAD) on every path.
        #[arg(long)]
        read_only: bool,
    },
    /// List a user's keys (never their values).
    List {
        /// The user's email address.
        #[arg(long)]
        email: String,
        /// A JSON array, with times in epoch milliseconds.
        #[arg(long)]
        json: bool,
    },
    /// Disable a key: requests with it are refused until it is enabled again.
    Disable {
        /// The key's id, as shown by `apikey list`.
        id: String,
    },
    /// Enable a disabled key.
    Enable {
        /// The key's id, as shown by `apikey list`.
        id: String,
    },
    /// Delete a key for good.
    Delete {
        /// The key's id, as shown by `apikey list`.
        id: String,
    },
}

#[derive(Subcommand)]
pub enum AssertionCommand {
    /// Make a new signing key current; the previous one stays in the JWKS
    /// until every assertion it signed has expired. Prints the new kid.
    Rotate {
        /// ES256 or EdDSA; `assertion.algorithm` when omitted.
        #[arg(long, value_parser = parse_algorithm)]
        algorithm: Option<AssertionAlgorithm>,
    },
    /// List the signing keys: kid, algorithm, created and retired (epoch ms).
    /// Never a private key.
    Keys,
}

fn parse_algorithm(text: &str) -> Result<AssertionAlgorithm, String> {
    AssertionAlgorithm::parse(text).ok_or_else(|| "ES256 or EdDSA".into())
}

fn parse_authority(text: &str) -> Result<Authority, String> {
    Authority::parse(&text.trim().to_ascii_uppercase())
        .ok_or_else(|| "one of SYS_ADMIN, TENANT_ADMIN, CUSTOMER_USER".into())
}

/// A key's id. A key's value given instead is refused without being
/// repeated: an error message may end up in a shell history or a log (so
/// the argument is read as text and checked here, not by the parser, which
/// would quote it).
pub(super) fn parse_key_id(text: &str) -> anyhow::Result<Uuid> {
    Uuid::parse_str(text.trim()).map_err(|_| {
        if text.len() > 40 || text.contains('_') {
            anyhow::anyhow!(
                "this looks like an API key's value, not its id: give the key's id, \
                 the first column of `keygate apikey list --email <user>`"
            )
        } else {
            anyhow::anyhow!(
                "not a key id: give the UUID in the first column of `keygate apikey list --email <user>`"
            )
        }
    })
}

pub async fn run(
    command: Command,
    settings: Settings,
    config_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    match command {
        Command::Serve { dev } => serve::serve(settings, config_file, dev).await,
        Command::CheckConfig { .. } => Ok(()),
        Command::Health => health::health(&settings).await,
        Command::Migrate { check } => migrate::migrate(&settings, check).await,
        Command::User(cmd) => users::user(cmd, &settings).await,
        Command::Apikey(cmd) => keys::apikey(cmd, &settings).await,
        Command::Assertion(cmd) => assertion::assertion(cmd, &settings).await,
        Command::Audit(args) => audit::audit(args, &settings).await,
        Command::Import(cmd) => import::import(cmd, &settings).await,
        // Run before any config is read (main).
        Command::ReferenceUpstream(args) => {
            Ok(keygate::dev::run_reference_upstream(args, keygate::dev::terminated()).await?)
        }
    }
}

/// How long a management command waits for PostgreSQL.
pub(super) const CLI_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens the configured store, never creating one: a command run from the
/// wrong directory or with the wrong config must not work on a new, empty
/// store. A missing store is refused naming the config and the URL looked for.
pub(super) async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    let options = OpenOptions {
        max_connections: settings.store_max_connections.min(2),
        create: false,
        connect_timeout: CLI_CONNECT_TIMEOUT,
        pooler: settings.store_pooler,
        direct_url: settings.store_notify_url.clone(),
    };
    match Store::open(&settings.store_url, options).await {
        Ok(store) => Ok(store),
        Err(StoreError::Missing(file)) => anyhow::bail!(
            "no store at {file}: store.url is {}, from {}; commands that only change a store never \
             create one: `keygate import platform` or the first `keygate serve` does; or give the \
             right --config or KEYGATE_STORE_URL",
            keygate::config::redacted_url(&settings.store_url),
            config_origin()
        ),
        Err(error @ StoreError::Unreachable(_)) => Err(error.into()),
        Err(error) => Err(anyhow::Error::new(error).context("opening the store")),
    }
}

/// What `check-config --connect` found: what it reached and what it left
/// alone because it is not configured (`reached`), and one problem per
/// dependency out of reach or not fit for use (`problems`).
#[derive(Debug, Default)]
pub struct Reached {
    pub reached: Vec<String>,
    pub problems: Vec<String>,
}

/// `check-config --connect`: reaches the store (never creating it), Redis
/// and the platform's database when each is configured, and says "not
/// configured" of each that is not: a check never claims to have reached
/// what it did not try.
pub async fn reach_dependencies(settings: &Settings) -> Reached {
    let mut found = Reached::default();
    match open_store(settings).await {
        Ok(store) => {
            let transport = store.transport().await;
            store.close().await;
            match transport {
                Ok(how) => found.reached.push(format!("store reached {how}")),
                Err(error) => found.problems.push(format!("store.url: {error}")),
            }
        }
        Err(error) => found
            .problems
            .push(format!("store.url: {}", one_line(&error))),
    }
    match &settings.redis {
        None => found.reached.push("Redis not configured".into()),
        Some(redis) => match reach_redis(redis).await {
            Ok(how) => found.reached.push(format!("Redis reached {how}")),
            Err(cause) => found.problems.push(cause),
        },
    }
    match &settings.platform.sync {
        None => found
            .reached
            .push("platform database not configured".into()),
        Some(sync) => match keygate::import::check_platform_database(&sync.database_url).await {
            Ok(()) => found
                .reached
                .push("platform database reached, its tables and signing key found".into()),
            Err(cause) => found
                .problems
                .push(format!("platform.database_url: {cause}")),
        },
    }
    reach_providers(settings, &mut found).await;
    found
}

/// Each single sign-on provider's discovery document and keys, fetched now.
async fn reach_providers(settings: &Settings, found: &mut Reached) {
    if settings.oidc.is_empty() {
        found
            .reached
            .push("single sign-on providers not configured".into());
    }
    for (i, oidc) in settings.oidc.iter().enumerate() {
        let checked = match keygate::sso::Provider::new(oidc.clone()) {
            Ok(provider) => provider.check().await,
            Err(cause) => Err(cause),
        };
        match checked {
            Ok(keys) => found.reached.push(format!(
                "single sign-on provider {:?} reached: discovery document and {keys} signing key{}",
                oidc.name,
                if keys == 1 { "" } else { "s" }
            )),
            Err(cause) => found
                .problems
                .push(format!("oidc[{i}] ({}): {cause}", oidc.name)),
        }
    }
}

/// One PING within the configured connect timeout, after, for a
/// `rediss://` URL, a TLS handshake that says which TLS it agreed: "over
/// TLS (TLSv1.3)" or "without TLS". A problem names the setting and never
/// the password.
async fn reach_redis(settings: &keygate::config::RedisSettings) -> Result<String, String> {
    use keygate::shared_limits::link::{self, LinkError};
    let unreachable = |cause: String| {
        format!(
            "redis.url: cannot reach {}: {cause}",
            keygate::config::redacted_url(&settings.url)
        )
    };
    let how = match link::check_tls(settings).await {
        Ok(Some(version)) => format!("over TLS ({version})"),
        Ok(None) => "without TLS".to_string(),
        Err(LinkError::Unreachable { reason, .. }) => return Err(unreachable(reason)),
        Err(error) => return Err(error.to_string()),
    };
    let client = link::client(settings).map_err(|e| e.to_string())?;
    let attempt = async {
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(settings.connect_timeout, attempt).await {
        Ok(Ok(_)) => Ok(how),
        Ok(Err(cause)) => Err(unreachable(cause)),
        Err(_) => Err(unreachable(format!(
            "no answer within {} s",
            settings.connect_timeout.as_secs_f32()
        ))),
    }
}

/// An error and its causes in one line, each cause once: a wrapped error
/// often repeats its source's text in its own.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Where the settings came from, for messages: the config file or the
/// built-in defaults (set once by `main`).
pub static CONFIG_ORIGIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(super) fn config_origin() -> &'static str {
    CONFIG_ORIGIN
        .get()
        .map_or("built-in defaults", String::as_str)
}

pub(super) async fn find_user(
    store: &Store,
    email: &str,
) -> anyhow::Result<keygate::store::UserRecord> {
    store
        .user_by_email(email)
        .await?
        .with_context(|| format!("no user with email {email}"))
}

/// The store, recording `action` by the command line with the change made
/// through it.
pub(super) fn cli(store: &Store, action: &'static str) -> Store {
    store.audited(Audit::command_line(action))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_and_flag_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if command.get_about().is_none() && !path.is_empty() {
                missing.push(format!("`{path}` has no description"));
            }
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("`{path} {}` has no help", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        command.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&command, "", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
    }
}
