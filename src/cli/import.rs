//! `keygate import platform`: the platform's users, passwords, API keys,
//! invitations, second factors and signing settings into keygate's store.

use keygate::config::Settings;
use keygate::import::{self, Options};

use super::{ImportCommand, open_store};

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
    let store = open_store(settings).await?;
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
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    Ok(())
}
