//! `keygate apikey ...`: API keys in the store; a key's value is shown once.

use std::sync::Arc;

use anyhow::bail;
use uuid::Uuid;

use keygate::accounts;
use keygate::auth::scope::{Grant, Scopes};
use keygate::config::{self, Settings};

use super::{ApiKeyCommand, cli, find_user, open_store};

pub(super) async fn apikey(cmd: ApiKeyCommand, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    match cmd {
        ApiKeyCommand::Create {
            email,
            description,
            expires_in,
            scopes,
            read_only,
        } => {
            let scopes = scopes_of(&scopes, read_only)?;
            let u = find_user(&store, &email).await?;
            let expiration_time = match expires_in {
                Some(text) => {
                    let d = config::parse_duration(&text).map_err(anyhow::Error::msg)?;
                    keygate::clock::now_ms() + d.as_millis() as i64
                }
                None => 0,
            };
            let request = accounts::KeyRequest {
                prefix: &settings.api_key_prefix,
                description: &description,
                expiration_time,
                enabled: true,
                scopes: scopes.map(Arc::new),
            };
            let created =
                accounts::create_api_key_within(&cli(&store, "api_key.create"), &u, request, None)
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
                let scopes = match &k.scopes {
                    Some(scopes) => scopes.to_string(),
                    None => "unscoped".to_string(),
                };
                println!(
                    "{}  {:<8}  expires {}  {}  [{}]",
                    k.id, state, expires, k.description, scopes
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

/// The grants `--scope` and `--read-only` ask for; `None`: unscoped.
fn scopes_of(grants: &[String], read_only: bool) -> anyhow::Result<Option<Scopes>> {
    if read_only {
        return Ok(Some(Scopes::read_only()));
    }
    if grants.is_empty() {
        return Ok(None);
    }
    let grants = grants
        .iter()
        .map(|text| text.parse::<Grant>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Scopes::new(grants)?))
}

fn ensure(found: bool, id: Uuid) -> anyhow::Result<()> {
    if found {
        Ok(())
    } else {
        bail!("no API key with id {id}")
    }
}
