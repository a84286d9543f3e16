//! `keygate apikey ...`: API keys in the store; a key's value is shown once.

use std::sync::Arc;

use anyhow::bail;
use uuid::Uuid;

use keygate::accounts;
use keygate::auth::scope::{Grant, Scopes};
use keygate::config::{self, Settings};

use super::{ApiKeyCommand, cli, find_user, open_store, time};

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
            create(&store, settings, &email, &description, expires_in, scopes).await?;
        }
        ApiKeyCommand::List { email, json } => list(&store, &email, json).await?,
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

/// `keygate apikey create`: the key's value is printed once, on standard
/// output; what was created, on standard error.
async fn create(
    store: &keygate::store::Store,
    settings: &Settings,
    email: &str,
    description: &str,
    expires_in: Option<String>,
    scopes: Option<Scopes>,
) -> anyhow::Result<()> {
    let u = find_user(store, email).await?;
    let expiration_time = match expires_in {
        Some(text) => {
            let d = config::parse_duration(&text).map_err(anyhow::Error::msg)?;
            keygate::clock::now_ms() + d.as_millis() as i64
        }
        None => 0,
    };
    let request = accounts::KeyRequest {
        prefix: &settings.api_key_prefix,
        description,
        expiration_time,
        enabled: true,
        scopes: scopes.map(Arc::new),
    };
    let created =
        accounts::create_api_key_within(&cli(store, "api_key.create"), &u, request, None).await?;
    eprintln!(
        "created API key {} for {} (shown once; store it now)",
        created.record.id, u.email
    );
    println!("{}", created.value.expose());
    Ok(())
}

/// `keygate apikey list`: a user's keys, as a table or a JSON array.
async fn list(store: &keygate::store::Store, email: &str, json: bool) -> anyhow::Result<()> {
    let u = find_user(store, email).await?;
    let keys = store.list_api_keys(u.id).await?;
    if json {
        let rows: Vec<_> = keys
            .iter()
            .map(|k| {
                let mut row = serde_json::json!({
                    "id": k.id,
                    "description": k.description,
                    "enabled": k.enabled,
                    "createdTime": k.created_time,
                    "expirationTime": k.expiration_time,
                });
                // Only a scoped key has them, as in its API record.
                if let Some(scopes) = &k.scopes {
                    row["scopes"] = serde_json::to_value(scopes).unwrap_or_default();
                }
                row
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    let now = keygate::clock::now_ms();
    println!(
        "{:<36}  {:<8}  {:<23}  {:<31}  DESCRIPTION  [SCOPES]",
        "ID", "STATE", "CREATED", "EXPIRES"
    );
    for k in keys {
        let state = if k.enabled { "enabled" } else { "disabled" };
        let scopes = match &k.scopes {
            Some(scopes) => scopes.to_string(),
            None => "unscoped".to_string(),
        };
        println!(
            "{}  {:<8}  {:<23}  {:<31}  {}  [{}]",
            k.id,
            state,
            time::readable(k.created_time),
            time::expiry(k.expiration_time, now),
            k.description,
            scopes
        );
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
