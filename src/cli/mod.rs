//! The command line: its arguments, and the commands, one module each.

mod assertion;
mod audit;
mod health;
mod import;
mod keys;
pub mod logging;
mod prompt;
mod serve;
mod users;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use uuid::Uuid;

use keygate::config::{AssertionAlgorithm, Settings};
use keygate::identity::Authority;
use keygate::store::{Audit, Store};

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
    /// Validate the configuration and print every problem found.
    CheckConfig,
    /// Ask the running server's admin listener for /healthz (for container health checks).
    Health,
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
    /// first, one JSON object per line.
    Audit {
        /// How many events.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
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
    /// List users: id, authority, state, tenant and email.
    List,
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
        /// The platform's PostgreSQL database, e.g. postgres://user:pass@host:5432/thingsboard.
        #[arg(long, env = "KEYGATE_PLATFORM_DATABASE_URL")]
        database_url: String,
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
    },
    /// Disable a key: requests with it are refused until it is enabled again.
    Disable {
        /// The key's id, as shown by `apikey list`.
        id: Uuid,
    },
    /// Enable a disabled key.
    Enable {
        /// The key's id, as shown by `apikey list`.
        id: Uuid,
    },
    /// Delete a key for good.
    Delete {
        /// The key's id, as shown by `apikey list`.
        id: Uuid,
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
    Authority::parse(text).ok_or_else(|| "one of SYS_ADMIN, TENANT_ADMIN, CUSTOMER_USER".into())
}

pub async fn run(
    command: Command,
    settings: Settings,
    config_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    match command {
        Command::Serve { dev } => serve::serve(settings, config_file, dev).await,
        Command::CheckConfig => Ok(()),
        Command::Health => health::health(&settings).await,
        Command::User(cmd) => users::user(cmd, &settings).await,
        Command::Apikey(cmd) => keys::apikey(cmd, &settings).await,
        Command::Assertion(cmd) => assertion::assertion(cmd, &settings).await,
        Command::Audit { limit } => audit::audit(limit, &settings).await,
        Command::Import(cmd) => import::import(cmd, &settings).await,
    }
}

pub(super) async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    Store::connect(&settings.store_url, settings.store_max_connections)
        .await
        .with_context(|| "opening the store")
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
