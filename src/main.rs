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
use keygate::store::{Audit, Store};

/// mimalloc rather than the system allocator, measured with `benches/run`
/// (BENCHMARKS.md). glibc kept the 19 MiB blocks of Argon2 hashes in its
/// per-thread arenas: under a stream of logins keygate's resident memory grew
/// to 374-563 MiB and stayed there; with mimalloc it stays near 120-140 MiB.
/// malloc and free also fell from about 6% to under 5% of keygate's CPU under
/// the API-key load. It kept the start-up hash's memory for reuse (49 MiB
/// resident idle against glibc's 37 MiB) until [`give_back_start_up_memory`]:
/// 29 MiB idle since.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    /// mimalloc's own (linked with the allocator): frees the memory it keeps
    /// for reuse and gives freed pages back to the system now.
    fn mi_collect(force: bool);
}

/// Gives back what start-up freed. mimalloc purges freed pages lazily, on a
/// later allocation, and an idle server allocates nothing: the 19 MiB of the
/// Argon2 hash made at start (the dummy hash for unknown users) stayed
/// resident (49 MiB idle in `benches/run`, 29 MiB with this call). Called
/// once, after start, it costs nothing under load and leaves mimalloc's
/// behaviour under a login storm as it was.
fn give_back_start_up_memory() {
    // SAFETY: a plain call into the allocator, which is mimalloc here.
    unsafe { mi_collect(true) }
}

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
    /// Show the latest audit events (changes to users and API keys), newest
    /// first, one JSON object per line.
    Audit {
        /// How many events.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Subcommand)]
enum UserCommand {
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
enum ApiKeyCommand {
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
        println!(
            "configuration is valid ({})",
            config::Count(settings.routes.len(), "route", "routes")
        );
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
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    // A log line that cannot be written (stderr closed: a log collector gone)
    // is dropped. By default the subscriber reports that with `eprintln!`,
    // which panics on the same closed stderr, killing whatever task logged:
    // the log must never take the gateway down with it.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

/// Colour escape codes only for a person at a terminal: never into a file or
/// pipe, and not when `NO_COLOR` is set to a non-empty value (no-color.org).
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
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
        Command::Audit { limit } => audit(limit, &settings).await,
    }
}

async fn audit(limit: u32, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    for event in store.audit_events(limit).await? {
        let line = serde_json::json!({
            "id": event.id,
            "createdTime": event.created_time,
            "actorId": event.actor_id,
            "actor": event.actor,
            "tenantId": event.tenant_id,
            "action": event.action,
            "targetType": event.target_type,
            "targetId": event.target_id,
        });
        println!("{line}");
    }
    Ok(())
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
    give_back_start_up_memory();
    if let Some(settings) = shown {
        // Written once, whole; a closed stderr must not end the server (a
        // panicking eprintln! would).
        let text = keygate::dev::quick_start(&running, &settings).await?;
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{text}\n").as_bytes());
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
                        tracing::error!(
                            problems = %errors.one_line(),
                            "reload refused: the configuration is invalid; nothing changed"
                        );
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
    let mut addr = settings
        .listen
        .admin
        .context("the admin listener is turned off ([listen] admin); there is nothing to ask")?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let url = format!("http://{addr}/healthz");
    match tokio::time::timeout(HEALTH_TIMEOUT, ask_healthz(addr)).await {
        Ok(Ok(status)) if status.is_success() => {
            println!("healthy");
            Ok(())
        }
        Ok(Ok(status)) => bail!("unhealthy: {url} answered {status}"),
        Ok(Err(reason)) => bail!("cannot reach {url}: {reason}"),
        Err(_) => bail!(
            "cannot reach {url}: no answer within {} s",
            HEALTH_TIMEOUT.as_secs()
        ),
    }
}

const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// One GET /healthz on a fresh connection; the error is one short reason
/// ("connection refused"), not a chain of wrapped messages.
async fn ask_healthz(addr: std::net::SocketAddr) -> Result<http::StatusCode, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| io_reason(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = http::Request::get("/healthz")
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.status())
}

/// "connection refused" rather than "Connection refused (os error 111)".
fn io_reason(error: &std::io::Error) -> String {
    let text = error.to_string();
    let reason = text
        .rfind(" (os error ")
        .map_or(text.as_str(), |end| &text[..end]);
    let mut chars = reason.chars();
    chars
        .next()
        .map(|first| first.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
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
            check_ids(authority, tenant_id, customer_id)?;
            let password = read_password(true).await?;
            let new = NewUser {
                email,
                authority,
                tenant_id,
                customer_id,
                first_name,
                last_name,
            };
            let user = accounts::create_user(
                &cli(&store, "user.create"),
                new,
                password,
                &settings.password_policy,
            )
            .await?;
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
            cli(&store, "user.disable")
                .set_user_enabled(u.id, false, now)
                .await?;
            println!("disabled user {email}");
        }
        UserCommand::Enable { email } => {
            let u = find_user(&store, &email).await?;
            cli(&store, "user.enable")
                .set_user_enabled(u.id, true, now)
                .await?;
            println!("enabled user {email}");
        }
        UserCommand::Delete { email } => {
            let u = find_user(&store, &email).await?;
            cli(&store, "user.delete").delete_user(u.id).await?;
            println!("deleted user {email}");
        }
        UserCommand::SetPassword { email } => {
            let u = find_user(&store, &email).await?;
            let password = read_password(true).await?;
            let store = cli(&store, "user.set_password");
            accounts::set_password(&store, u.id, password, &settings.password_policy).await?;
            println!("set the password of {email}; their earlier sessions and tokens ended");
        }
    }
    Ok(())
}

/// Refuses, before a password is asked for, ids the authority does not take
/// or lacks; the store's rules (such as refusing the "no tenant" id) follow.
fn check_ids(
    authority: Authority,
    tenant_id: Option<Uuid>,
    customer_id: Option<Uuid>,
) -> anyhow::Result<()> {
    match authority {
        Authority::SysAdmin if tenant_id.is_some() || customer_id.is_some() => {
            bail!(
                "a SYS_ADMIN belongs to no tenant or customer: leave out --tenant-id and --customer-id"
            )
        }
        Authority::TenantAdmin if customer_id.is_some() => {
            bail!("--customer-id is for a CUSTOMER_USER only; a TENANT_ADMIN has none")
        }
        Authority::TenantAdmin | Authority::CustomerUser if tenant_id.is_none() => {
            bail!("a {authority} needs --tenant-id: the platform's UUID of their tenant")
        }
        Authority::CustomerUser if customer_id.is_none() => {
            bail!("a CUSTOMER_USER needs --customer-id: the platform's UUID of their customer")
        }
        _ => Ok(()),
    }
}

/// Reads a new password: at a terminal it is asked for on standard error and
/// typed without echo (twice when `confirm`); otherwise it is the first line
/// of standard input.
async fn read_password(confirm: bool) -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return first_line(std::io::stdin().lock());
    }
    let password = prompt::hidden("Password: ").await?;
    if confirm && prompt::hidden("Repeat the password: ").await? != password {
        bail!("the passwords do not match; nothing was changed");
    }
    // Asking took over Ctrl-C; it still ends the command from here on.
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
    Ok(password)
}

/// The first line of `input` without its line ending; an input that ends
/// before any line is an error that says where the password is expected.
fn first_line(mut input: impl BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    let read = input
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    if read == 0 {
        bail!(
            "no password given: it is read from the first line of standard input \
             (or asked for when standard input is a terminal)"
        );
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Asking for a secret at a terminal.
mod prompt {
    use anyhow::{Context, bail};
    use std::io::{BufRead, Write};

    /// Shows `prompt` on standard error and reads one line from the terminal
    /// on standard input with echo turned off; echo comes back afterwards,
    /// also when the read is interrupted with Ctrl-C.
    #[cfg(unix)]
    pub async fn hidden(prompt: &str) -> anyhow::Result<String> {
        use tokio::signal::unix::{SignalKind, signal};
        // Listening before echo goes off: Ctrl-C never leaves it off.
        let mut interrupt = signal(SignalKind::interrupt()).context("listening for Ctrl-C")?;
        let echo = EchoOff::new()?;
        show(prompt);
        tokio::select! {
            line = tokio::task::spawn_blocking(read_line) => {
                drop(echo);
                line.context("reading the password")?
            }
            _ = interrupt.recv() => {
                drop(echo);
                eprintln!();
                std::process::exit(130);
            }
        }
    }

    /// Elsewhere the password is read as typed.
    #[cfg(not(unix))]
    pub async fn hidden(prompt: &str) -> anyhow::Result<String> {
        show(prompt);
        read_line()
    }

    fn show(prompt: &str) {
        let mut stderr = std::io::stderr();
        let _ = stderr.write_all(prompt.as_bytes());
        let _ = stderr.flush();
    }

    fn read_line() -> anyhow::Result<String> {
        let mut line = String::new();
        let read = std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password")?;
        if read == 0 {
            eprintln!();
            bail!("no password entered");
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }

    /// Terminal echo turned off (the line break still shows) until dropped.
    #[cfg(unix)]
    struct EchoOff(rustix::termios::Termios);

    #[cfg(unix)]
    impl EchoOff {
        fn new() -> anyhow::Result<EchoOff> {
            use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
            let stdin = std::io::stdin();
            let saved = tcgetattr(&stdin).context("reading the terminal settings")?;
            let mut quiet = saved.clone();
            quiet.local_modes.remove(LocalModes::ECHO);
            quiet.local_modes.insert(LocalModes::ECHONL);
            tcsetattr(&stdin, OptionalActions::Now, &quiet)
                .context("turning the terminal echo off")?;
            Ok(EchoOff(saved))
        }
    }

    #[cfg(unix)]
    impl Drop for EchoOff {
        fn drop(&mut self) {
            use rustix::termios::{OptionalActions, tcsetattr};
            let _ = tcsetattr(std::io::stdin(), OptionalActions::Now, &self.0);
        }
    }
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
                &cli(&store, "api_key.create"),
                &u,
                &settings.api_key_prefix,
                &description,
                expiration_time,
                true,
            )
            .await?;
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
            let store = cli(&store, "api_key.disable");
            ensure(store.set_api_key_enabled(id, false).await?.outcome, id)?;
            println!("disabled API key {id}");
        }
        ApiKeyCommand::Enable { id } => {
            let store = cli(&store, "api_key.enable");
            ensure(store.set_api_key_enabled(id, true).await?.outcome, id)?;
            println!("enabled API key {id}");
        }
        ApiKeyCommand::Delete { id } => {
            ensure(
                cli(&store, "api_key.delete")
                    .delete_api_key(id)
                    .await?
                    .outcome,
                id,
            )?;
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

/// The store, recording `action` by the command line with the change made
/// through it.
fn cli(store: &Store, action: &'static str) -> Store {
    store.audited(Audit::command_line(action))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn colour_only_at_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None), "never into a file or pipe");
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(true, Some(OsStr::new("false"))), "any value");
        assert!(
            use_colour(true, Some(OsStr::new(""))),
            "empty counts as unset"
        );
    }

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

    #[test]
    fn a_password_is_the_first_line_of_standard_input() {
        assert_eq!(
            first_line(&b"s3cret-pass\r\nmore\n"[..]).unwrap(),
            "s3cret-pass"
        );
        assert_eq!(first_line(&b"no-newline"[..]).unwrap(), "no-newline");
        assert_eq!(first_line(&b"\n"[..]).unwrap(), "", "the policy refuses it");
        let empty = first_line(&b""[..]).unwrap_err().to_string();
        assert!(empty.contains("first line of standard input"), "{empty}");
    }

    #[test]
    fn user_add_refuses_ids_the_authority_does_not_take_before_asking() {
        let id = Some(Uuid::new_v4());
        assert!(check_ids(Authority::SysAdmin, None, None).is_ok());
        assert!(check_ids(Authority::SysAdmin, id, None).is_err());
        assert!(check_ids(Authority::TenantAdmin, id, None).is_ok());
        assert!(check_ids(Authority::TenantAdmin, None, None).is_err());
        assert!(check_ids(Authority::TenantAdmin, id, id).is_err());
        assert!(check_ids(Authority::CustomerUser, id, id).is_ok());
        assert!(check_ids(Authority::CustomerUser, id, None).is_err());
        assert!(check_ids(Authority::CustomerUser, None, id).is_err());
    }

    #[test]
    fn io_reasons_are_short_and_lower_case() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(io_reason(&refused), "connection refused");
        let os = std::io::Error::from_raw_os_error(111);
        assert!(!io_reason(&os).contains("os error"), "{}", io_reason(&os));
    }
}
