//! `keygate apikey ...`: API keys in the store; a key's value is shown once.

use anyhow::bail;
use uuid::Uuid;

use keygate::accounts;
use keygate::config::{self, Settings};

use super::{ApiKeyCommand, cli, find_user, open_store};

pub(super) async fn apikey(cmd: ApiKeyCommand, settings: &Settings) -> anyhow::Result<()> {
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
