//! `keygate import platform`: the platform's users, passwords, API keys,
//! invitations, second factors and signing settings into keygate's store.

use keygate::config::Settings;
use keygate::import::{self, Options};
use keygate::store::{OpenOptions, Store};

use super::{CLI_CONNECT_TIMEOUT, ImportCommand, open_store};

pub(super) async fn import(cmd: ImportCommand, settings: &Settings) -> anyhow::Result<()> {
    let ImportCommand::Platform {
        database_url,
        dry_run,
        prune,
        json,
    } = cmd;
    let configured = settings
        .platform
        .sync
        .as_ref()
        .map(|s| s.database_url.clone());
    let Some(database_url) = database_url.or(configured) else {
        anyhow::bail!(
            "no platform database: pass --database-url, or set KEYGATE_PLATFORM_DATABASE_URL or [platform] database_url"
        );
    };
    let store = store_to_fill(settings, dry_run).await?;
    let sealer = keygate::server::two_factor_sealer(settings, &store).await?;
    let options = Options {
        database_url,
        dry_run,
        prune,
        sealer: std::sync::Arc::new(sealer),
        origin: import::Origin::CommandLine,
        mail: settings.mail.is_some(),
        max_bcrypt_cost: settings.login.max_bcrypt_cost,
    };
    let progress = |line: &str| eprintln!("import: {line}");
    let report = import::run(&store, &options, &progress).await?;
    if !dry_run
        && report
            .bootstrap_admin
            .as_ref()
            .is_some_and(|admin| admin.reason.is_none())
    {
        // Its password, written there by a first start, opens nothing now.
        let file = settings
            .data_dir
            .join(keygate::server::BOOTSTRAP_PASSWORD_FILE);
        if std::fs::remove_file(&file).is_ok() {
            eprintln!("import: removed {}", file.display());
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    Ok(())
}

/// The store the import fills. The import may create it, since it fills it
/// (other management commands only change a store and never create one). A
/// dry run creates nothing: without a store it runs against an empty one
/// in memory, so everything the platform holds is reported as new.
async fn store_to_fill(settings: &Settings, dry_run: bool) -> anyhow::Result<Store> {
    if Store::exists(
        &settings.store_url,
        CLI_CONNECT_TIMEOUT,
        settings.store_pooler,
    )
    .await?
    {
        return open_store(settings).await;
    }
    let url = keygate::config::redacted_url(&settings.store_url);
    let (target, options) = if dry_run {
        eprintln!(
            "import: no store yet at {url}: everything is reported as new, and nothing is created; \
             `keygate import platform` creates the store"
        );
        // An in-memory database on one connection, which holds it (a dry
        // run writes nothing, so never waits on a second connection);
        // `create` only lets its name through: no file is ever made.
        let name = format!(
            "sqlite://keygate-dry-run-{}?mode=memory",
            uuid::Uuid::new_v4().simple()
        );
        (
            name,
            OpenOptions {
                max_connections: 1,
                create: true,
                connect_timeout: CLI_CONNECT_TIMEOUT,
                pooler: settings.store_pooler,
                direct_url: settings.store_notify_url.clone(),
            },
        )
    } else {
        eprintln!("import: no store yet at {url}: creating it");
        (
            settings.store_url.clone(),
            OpenOptions {
                max_connections: settings.store_max_connections.min(2),
                create: true,
                connect_timeout: CLI_CONNECT_TIMEOUT,
                pooler: settings.store_pooler,
                direct_url: settings.store_notify_url.clone(),
            },
        )
    };
    Ok(Store::open(&target, options).await?)
}
