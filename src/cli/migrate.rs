//! `keygate migrate`: applies the store's migrations as their own step (a
//! job before a rollout), or with `--check` says whether any is pending.

use keygate::config::{Settings, redacted_url};
use keygate::store::{OpenOptions, Store, StoreError, pending_list};

use super::CLI_CONNECT_TIMEOUT;

pub(super) async fn migrate(settings: &Settings, check: bool) -> anyhow::Result<()> {
    if check {
        return check_schema(settings).await;
    }
    // Setting up the schema is this command's work: a SQLite store is
    // created when missing, as the first `serve` would.
    let options = OpenOptions {
        max_connections: 1,
        create: true,
        connect_timeout: CLI_CONNECT_TIMEOUT,
        pooler: settings.store_pooler,
        direct_url: settings.store_notify_url.clone(),
    };
    let store = Store::open_as_is(&settings.store_url, options).await?;
    let applied = store.migrate().await;
    store.close().await;
    match applied?.as_slice() {
        [] => println!("the store's schema is up to date"),
        applied => println!(
            "applied {} migration{}: {}",
            applied.len(),
            if applied.len() == 1 { "" } else { "s" },
            pending_list(applied)
        ),
    }
    Ok(())
}

/// Exits non-zero, naming what is pending, when the schema is behind;
/// changes nothing and never creates a store.
async fn check_schema(settings: &Settings) -> anyhow::Result<()> {
    let options = OpenOptions {
        max_connections: 1,
        create: false,
        connect_timeout: CLI_CONNECT_TIMEOUT,
        pooler: settings.store_pooler,
        direct_url: settings.store_notify_url.clone(),
    };
    let pending = match Store::open_as_is(&settings.store_url, options).await {
        Ok(store) => {
            let pending = store.pending_migrations().await;
            store.close().await;
            pending?
        }
        Err(StoreError::Missing(_)) => Store::migrations_for(&settings.store_url),
        Err(error) => return Err(error.into()),
    };
    if pending.is_empty() {
        println!("the store's schema is up to date");
        return Ok(());
    }
    anyhow::bail!(
        "the store's schema is behind ({}): {} migration{} pending: {}; run `keygate migrate`",
        redacted_url(&settings.store_url),
        pending.len(),
        if pending.len() == 1 { "" } else { "s" },
        pending_list(&pending)
    )
}
