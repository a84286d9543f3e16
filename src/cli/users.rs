//! `keygate user ...`: users in the store, changed with an audit event each.

use anyhow::bail;
use uuid::Uuid;

use keygate::accounts::{self, NewUser};
use keygate::config::Settings;
use keygate::identity::Authority;

use super::prompt::read_password;
use super::{UserCommand, cli, find_user, open_store};

pub(super) async fn user(cmd: UserCommand, settings: &Settings) -> anyhow::Result<()> {
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
            let new = NewUser {
                email,
                authority,
                tenant_id,
                customer_id,
                first_name,
                last_name,
            };
            add(&store, new, settings).await?;
        }
        UserCommand::List { json } => list(&store, json).await?,
        UserCommand::Disable { email } => set_enabled(&store, &email, false, now).await?,
        UserCommand::Enable { email } => set_enabled(&store, &email, true, now).await?,
        UserCommand::Delete { email } => {
            let u = find_user(&store, &email).await?;
            let _ = cli(&store, "user.delete").delete_user(u.id).await?; // as above
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

/// `keygate user add`: the ids are checked before the password is asked for.
async fn add(
    store: &keygate::store::Store,
    new: NewUser,
    settings: &Settings,
) -> anyhow::Result<()> {
    check_ids(new.authority, new.tenant_id, new.customer_id)?;
    let password = read_password(true).await?;
    let user = accounts::create_user(
        &cli(store, "user.create"),
        new,
        password,
        &settings.password_policy,
    )
    .await?;
    println!(
        "created user {} ({}, {})",
        user.email, user.authority, user.id
    );
    Ok(())
}

/// `keygate user list`: a table, or a JSON array.
async fn list(store: &keygate::store::Store, json: bool) -> anyhow::Result<()> {
    let users = store.list_users().await?;
    if json {
        let rows: Vec<_> = users
            .iter()
            .map(|u| {
                serde_json::json!({
                    "id": u.id,
                    "email": u.email,
                    "authority": u.authority.as_str(),
                    "enabled": u.credentials_enabled(),
                    "activated": u.activated(),
                    "tenantId": shown_id(u.tenant_id),
                    "customerId": shown_id(u.customer_id),
                    "createdTime": u.created_time,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<36}  {:<13}  {:<8}  {:<36}  {:<23}  EMAIL",
        "ID", "AUTHORITY", "STATE", "TENANT", "CREATED"
    );
    for u in users {
        let state = state(&u);
        println!(
            "{}  {:<13}  {:<8}  {:<36}  {:<23}  {}",
            u.id,
            u.authority.as_str(),
            state,
            shown_id(u.tenant_id).unwrap_or_else(|| "-".into()),
            super::time::readable(u.created_time),
            u.email
        );
    }
    Ok(())
}

/// `keygate user enable` and `disable`: a user already so is left as it is.
async fn set_enabled(
    store: &keygate::store::Store,
    email: &str,
    enabled: bool,
    now: i64,
) -> anyhow::Result<()> {
    let (action, done) = if enabled {
        ("user.enable", "enabled")
    } else {
        ("user.disable", "disabled")
    };
    let u = find_user(store, email).await?;
    if u.enabled == enabled {
        println!("user {email} is already {done}; nothing changed");
        return Ok(());
    }
    let _ = cli(store, action)
        .set_user_enabled(u.id, enabled, now)
        .await?; // servers hear of it by notification or the audit poll
    println!("{done} user {email}");
    Ok(())
}

/// A user's state as listed: an invitation not used yet is `pending`, never
/// `enabled` (the user cannot log in until they set a password).
fn state(user: &keygate::store::UserRecord) -> &'static str {
    match (user.enabled, user.activated()) {
        (false, _) => "disabled",
        (true, false) => "pending",
        (true, true) => "enabled",
    }
}

/// A tenant or customer id as shown: none for the platform's "no tenant"
/// (null) id.
fn shown_id(id: Uuid) -> Option<String> {
    (id != keygate::identity::NULL_UUID).then(|| id.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_invitation_is_listed_as_pending_never_as_enabled() {
        let invited = keygate::store::UserRecord {
            id: Uuid::new_v4(),
            created_time: 0,
            tenant_id: Uuid::new_v4(),
            customer_id: keygate::identity::NULL_UUID,
            email: "invited@example.com".into(),
            authority: Authority::TenantAdmin,
            first_name: String::new(),
            last_name: String::new(),
            phone: String::new(),
            additional_info: None,
            version: 1,
            enabled: true,
            password_hash: String::new(),
            tokens_valid_after: 0,
        };
        assert_eq!(state(&invited), "pending");
        let active = keygate::store::UserRecord {
            password_hash: "$argon2id$hash".into(),
            ..invited.clone()
        };
        assert_eq!(state(&active), "enabled");
        let disabled = keygate::store::UserRecord {
            enabled: false,
            ..active
        };
        assert_eq!(state(&disabled), "disabled");
        let disabled_invited = keygate::store::UserRecord {
            enabled: false,
            ..invited
        };
        assert_eq!(state(&disabled_invited), "disabled");
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
}
