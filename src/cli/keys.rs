//! `keygate apikey ...`: API keys in the store; a key's value is shown once.

use anyhow::bail;
use uuid::Uuid;

use keygate::accounts;
use keygate::config::{self, Settings};

use super::{ApiKeyCommand, cli, find_user, open_store, time};

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
        ApiKeyCommand::List { email, json } => {
            let u = find_user(&store, &email).await?;
            let keys = store.list_api_keys(u.id).await?;
            if json {
                let rows: Vec<_> = keys
                    .iter()
                    .map(|k| {
                        serde_json::json!({
                            "id": k.id,
                            "description": k.description,
                            "enabled": k.enabled,
                            "createdTime": k.created_time,
                            "expirationTime": k.expiration_time,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                let now = keygate::clock::now_ms();
                println!(
                    "{:<36}  {:<8}  {:<23}  {:<31}  DESCRIPTION",
                    "ID", "STATE", "CREATED", "EXPIRES"
                );
                for k in keys {
                    let state = if k.enabled { "enabled" } else { "disabled" };
                    println!(
                        "{}  {:<8}  {:<23}  {:<31}  {}",
                        k.id,
                        state,
                        time::readable(k.created_time),
                        time::expiry(k.expiration_time, now),
                        k.description
                    );
                }
            }
        }
        ApiKeyCommand::Disable { id } => {
            let id = super::parse_key_id(&id)?;
            let store = cli(&store, "api_key.disable");
            ensure(store.set_api_key_enabled(id, false).await?.outcome, id)?;
            println!("disabled API key {id}");
        }
        ApiKeyCommand::Enable { id } => {
            let id = super::parse_key_id(&id)?;
            let store = cli(&store, "api_key.enable");
            ensure(store.set_api_key_enabled(id, true).await?.outcome, id)?;
            println!("enabled API key {id}");
        }
        ApiKeyCommand::Delete { id } => {
            let id = super::parse_key_id(&id)?;
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
