//! The `keygate` command: serve, check the config, manage users and API keys.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use uuid::Uuid;

use keygate::accounts::{self, NewUser};
use keygate::config::{self, LogFormat, Settings, Source};
use keygate::identity::Authority;
use keygate::server::{self, StartOptions};
use keygate::store::Store;

const DEFAULT_CONFIG: &str = "config/keygate.toml";
/// sysexits.h EX_USAGE / EX_CONFIG-style status for a bad configuration.
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "keygate",
    version,
    about = "Authentication gateway for a device-platform REST API"
)]
struct Cli {
    /// Config file. When the default path does not exist, built-in defaults are used.
    #[arg(long, global = true, env = "KEYGATE_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Log format; overrides `[log] format`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormatArg>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
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
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a user; the password is read from the first line of standard input.
    Add {
        #[arg(long)]
        email: String,
        #[arg(long, value_parser = parse_authority)]
        authority: Authority,
        #[arg(long)]
        tenant_id: Option<Uuid>,
        #[arg(long)]
        customer_id: Option<Uuid>,
        #[arg(long, default_value = "")]
        first_name: String,
        #[arg(long, default_value = "")]
        last_name: String,
    },
    /// List users.
    List,
    /// Disable a user: their keys and tokens stop working.
    Disable { email: String },
    /// Enable a user.
    Enable { email: String },
    /// Delete a user with their keys and sessions.
    Delete { email: String },
    /// Set a user's password (read from the first line of standard input); every
    /// earlier session and token of the user stops working.
    SetPassword { email: String },
}

#[derive(Subcommand)]
enum ApiKeyCommand {
    /// Create a key; the key is printed once, as the last line of standard output.
    Create {
        #[arg(long)]
        email: String,
        #[arg(long, default_value = "API key")]
        description: String,
        /// Lifetime such as 30d or 12h; the key never expires when omitted.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List a user's keys (never their values).
    List {
        #[arg(long)]
        email: String,
    },
    Disable {
        id: Uuid,
    },
    Enable {
        id: Uuid,
    },
    Delete {
        id: Uuid,
    },
}

fn parse_authority(text: &str) -> Result<Authority, String> {
    Authority::parse(text).ok_or_else(|| "one of SYS_ADMIN, TENANT_ADMIN, CUSTOMER_USER".into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let explicit = cli.config.as_path() != Path::new(DEFAULT_CONFIG);
    let file = if explicit || cli.config.exists() {
        Some(cli.config.as_path())
    } else {
        None
    };
    let source = Source {
        file,
        env: std::env::vars().collect(),
    };
    let settings = match config::load(&source) {
        Ok(settings) => settings,
        Err(errors) => {
            eprint!("keygate: {errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Human) => LogFormat::Human,
        None => settings.log.format,
    };
    init_logging(format);
    if file.is_none() {
        tracing::info!("{DEFAULT_CONFIG} not found; running on built-in defaults");
    }
    if let Command::CheckConfig = cli.command {
        println!("configuration is valid ({} routes)", settings.routes.len());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keygate: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if matches!(cli.command, Command::Serve { dev: true }) && explicit {
        eprintln!(
            "keygate: serve --dev runs on the embedded defaults with the reference upstream; \
             drop --config (or KEYGATE_CONFIG) to use it, or drop --dev to serve that configuration"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let config_file = file.map(Path::to_path_buf);
    match runtime.block_on(run(cli.command, settings, config_file)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keygate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

async fn run(
    command: Command,
    settings: Settings,
    config_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    match command {
        Command::Serve { dev } => serve(settings, config_file, dev).await,
        Command::CheckConfig => Ok(()),
        Command::Health => health(&settings).await,
        Command::User(cmd) => user(cmd, &settings).await,
        Command::Apikey(cmd) => apikey(cmd, &settings).await,
    }
}

async fn serve(
    mut settings: Settings,
    config_file: Option<PathBuf>,
    dev: bool,
) -> anyhow::Result<()> {
    let options = StartOptions {
        bootstrap_password: std::env::var("KEYGATE_BOOTSTRAP_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty()),
    };
    if dev {
        keygate::dev::start_reference(&mut settings).await?;
    }
    let shown = dev.then(|| settings.clone());
    let running = server::start(settings, options).await?;
    if let Some(settings) = shown {
        eprintln!("{}", keygate::dev::quick_start(&running, &settings).await?);
    }
    // In development mode the routes point at the in-process upstream: a
    // reload from the (default) configuration would point them elsewhere, so
    // SIGHUP is ignored there.
    wait_for_signals(&running, config_file.as_deref(), dev).await;
    tracing::info!("shutting down: draining open connections");
    running.shutdown();
    running.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// Runs until SIGTERM or SIGINT. SIGHUP reloads the routes and the TLS
/// certificate from the same config file and environment; an invalid config
/// changes nothing and is reported.
#[cfg(unix)]
async fn wait_for_signals(running: &server::Running, config_file: Option<&Path>, dev: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hup.recv(), if !dev => {
                let source = Source { file: config_file, env: std::env::vars().collect() };
                match config::load(&source) {
                    Ok(settings) => running.reload(&settings),
                    Err(errors) => {
                        running.reload_failed();
                        tracing::error!(problems = ?errors.0, "reload refused: the configuration is invalid; nothing changed");
                    }
                }
            }
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signals(_running: &server::Running, _config_file: Option<&Path>, _dev: bool) {
    let _ = tokio::signal::ctrl_c().await;
}

async fn health(settings: &Settings) -> anyhow::Result<()> {
    use http_body_util::Empty;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let mut addr = settings
        .listen
        .admin
        .context("the admin listener is turned off")?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let client: Client<_, Empty<bytes::Bytes>> = Client::builder(TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let uri: http::Uri = format!("http://{addr}/healthz").parse()?;
    let response = tokio::time::timeout(std::time::Duration::from_secs(3), client.get(uri))
        .await
        .context("no answer within 3 s")??;
    if !response.status().is_success() {
        bail!("healthz answered {}", response.status());
    }
    println!("healthy");
    Ok(())
}

async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    Store::connect(&settings.store_url, settings.store_max_connections)
        .await
        .with_context(|| "opening the store")
}

async fn find_user(store: &Store, email: &str) -> anyhow::Result<keygate::store::UserRecord> {
    store
        .user_by_email(email)
        .await?
        .with_context(|| format!("no user with email {email}"))
}

async fn user(cmd: UserCommand, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    let now = keygate::clock::now_secs();
    match cmd {
        UserCommand::Add {
            email,
            authority,
            tenant_id,
            customer_id,
            first_name,
            last_name,
        } => {
            let password = read_password()?;
            let new = NewUser {
                email,
                authority,
                tenant_id,
                customer_id,
                first_name,
                last_name,
            };
            let user =
                accounts::create_user(&store, new, password, &settings.password_policy).await?;
            audit("user.create", "USER", user.id);
            println!(
                "created user {} ({}, {})",
                user.email, user.authority, user.id
            );
        }
        UserCommand::List => {
            for u in store.list_users().await? {
                let state = if u.enabled { "enabled" } else { "disabled" };
                println!(
                    "{}  {:<13}  {:<8}  tenant {}  {}",
                    u.id,
                    u.authority.as_str(),
                    state,
                    u.tenant_id,
                    u.email
                );
            }
        }
        UserCommand::Disable { email } => {
            let u = find_user(&store, &email).await?;
            store.set_user_enabled(u.id, false, now).await?;
            audit("user.disable", "USER", u.id);
            println!("disabled user {email}");
        }
        UserCommand::Enable { email } => {
            let u = find_user(&store, &email).await?;
            store.set_user_enabled(u.id, true, now).await?;
            audit("user.enable", "USER", u.id);
            println!("enabled user {email}");
        }
        UserCommand::Delete { email } => {
            let u = find_user(&store, &email).await?;
            store.delete_user(u.id).await?;
            audit("user.delete", "USER", u.id);
            println!("deleted user {email}");
        }
        UserCommand::SetPassword { email } => {
            let u = find_user(&store, &email).await?;
            let password = read_password()?;
            accounts::set_password(&store, u.id, password, &settings.password_policy).await?;
            audit("user.set_password", "USER", u.id);
            println!("set the password of {email}; their earlier sessions and tokens ended");
        }
    }
    Ok(())
}

/// The first line of standard input, without its line ending.
fn read_password() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

async fn apikey(cmd: ApiKeyCommand, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    match cmd {
        ApiKeyCommand::Create {
            email,
            description,
            expires_in,
        } => {
            let u = find_user(&store, &email).await?;
            let expiration_time = match expires_in {
                Some(text) => {
                    let d = config::parse_duration(&text).map_err(anyhow::Error::msg)?;
                    keygate::clock::now_ms() + d.as_millis() as i64
                }
                None => 0,
            };
            let created = accounts::create_api_key(
                &store,
                &u,
                &settings.api_key_prefix,
                &description,
                expiration_time,
                true,
            )
            .await?;
            audit("api_key.create", "API_KEY", created.record.id);
            eprintln!(
                "created API key {} for {} (shown once; store it now)",
                created.record.id, u.email
            );
            println!("{}", created.value.expose());
        }
        ApiKeyCommand::List { email } => {
            let u = find_user(&store, &email).await?;
            for k in store.list_api_keys(u.id).await? {
                let state = if k.enabled { "enabled" } else { "disabled" };
                let expires = if k.expiration_time == 0 {
                    "never".to_string()
                } else {
                    format!("{}", k.expiration_time)
                };
                println!(
                    "{}  {:<8}  expires {}  {}",
                    k.id, state, expires, k.description
                );
            }
        }
        ApiKeyCommand::Disable { id } => {
            ensure(store.set_api_key_enabled(id, false).await?, id)?;
            audit("api_key.disable", "API_KEY", id);
            println!("disabled API key {id}");
        }
        ApiKeyCommand::Enable { id } => {
            ensure(store.set_api_key_enabled(id, true).await?, id)?;
            audit("api_key.enable", "API_KEY", id);
            println!("enabled API key {id}");
        }
        ApiKeyCommand::Delete { id } => {
            ensure(store.delete_api_key(id).await?, id)?;
            audit("api_key.delete", "API_KEY", id);
            println!("deleted API key {id}");
        }
    }
    Ok(())
}

fn ensure(found: bool, id: Uuid) -> anyhow::Result<()> {
    if found {
        Ok(())
    } else {
        bail!("no API key with id {id}")
    }
}

/// One structured audit event per change made from the command line.
fn audit(action: &'static str, target_type: &'static str, target: Uuid) {
    tracing::info!(
        target: "keygate::audit",
        actor = "cli",
        action,
        target_type,
        target = %target,
        at_ms = keygate::clock::now_ms(),
        "audit"
    );
}
