//! Creating users and keys: the rules shared by the CLI, the bootstrap admin and
//! the REST endpoints (password policy, email shape, key records).

use uuid::Uuid;

use crate::auth::{api_key, credential::Secret, password};
use crate::config::PasswordPolicy;
use crate::identity::{Authority, NULL_UUID};
use crate::store::{ApiKeyRecord, Store, StoreError, UserRecord};

pub const BOOTSTRAP_EMAIL: &str = "sysadmin@keygate.local";

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("{0}")]
    Invalid(String),
    #[error("a user with email {0} already exists")]
    Exists(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Password(#[from] password::PasswordError),
    #[error("random number generator failed")]
    Random,
    #[error("a user may hold at most {0} API keys; delete one to create another")]
    TooManyKeys(u64),
    #[error("customer id {0} belongs to another tenant")]
    ForeignCustomer(Uuid),
}

/// Optional profile fields set at creation.
#[derive(Debug, Clone, Default)]
pub struct NewProfile {
    pub phone: String,
    /// JSON text.
    pub additional_info: Option<String>,
}

/// What is needed to create a user.
#[derive(Debug, Clone)]
pub struct NewUser {
    pub email: String,
    pub authority: Authority,
    pub tenant_id: Option<Uuid>,
    pub customer_id: Option<Uuid>,
    pub first_name: String,
    pub last_name: String,
}

fn check_email(email: &str) -> Result<String, AccountError> {
    crate::email::check(email).map_err(AccountError::Invalid)
}

/// Creates a user with an Argon2id-hashed password.
pub async fn create_user(
    store: &Store,
    new: NewUser,
    password: String,
    policy: &PasswordPolicy,
) -> Result<UserRecord, AccountError> {
    policy.check(&password).map_err(AccountError::Invalid)?;
    let user = new_record(new, String::new())?;
    let password_hash = password::hash(password).await?;
    insert(
        store,
        UserRecord {
            password_hash,
            ..user
        },
    )
    .await
}

/// Sets a user's password (an administrator's reset): like a password change,
/// every earlier session and token of the user ends, on every replica.
pub async fn set_password(
    store: &Store,
    user_id: Uuid,
    password: String,
    policy: &PasswordPolicy,
) -> Result<(), AccountError> {
    policy.check(&password).map_err(AccountError::Invalid)?;
    let hash = password::hash(password).await?;
    if store
        .update_password(user_id, &hash, Some(crate::clock::now_secs()))
        .await?
        .outcome
    {
        Ok(())
    } else {
        Err(AccountError::Invalid(format!("no user with id {user_id}")))
    }
}

/// Creates a user without a password: they set one through an activation
/// link, and no password logs them in before that.
pub(crate) async fn create_pending_user(
    store: &Store,
    new: NewUser,
    profile: NewProfile,
) -> Result<UserRecord, AccountError> {
    let user = new_record(new, String::new())?;
    insert(
        store,
        UserRecord {
            phone: profile.phone,
            additional_info: profile.additional_info,
            ..user
        },
    )
    .await
}

/// A tenant or customer id that must name a real one: absent or the "no
/// tenant / no customer" id is refused (a TENANT_ADMIN without a tenant would
/// share the SYS_ADMINs' scope).
fn required_id(id: Option<Uuid>, what: &str, authority: Authority) -> Result<Uuid, AccountError> {
    match id {
        Some(id) if id != NULL_UUID => Ok(id),
        _ => Err(AccountError::Invalid(format!(
            "a {authority} needs a {what} id other than the \"no {what}\" id {NULL_UUID}"
        ))),
    }
}

fn new_record(new: NewUser, password_hash: String) -> Result<UserRecord, AccountError> {
    let email = check_email(&new.email)?;
    let authority = new.authority;
    let (tenant_id, customer_id) = match authority {
        Authority::SysAdmin => (NULL_UUID, NULL_UUID),
        Authority::TenantAdmin => (required_id(new.tenant_id, "tenant", authority)?, NULL_UUID),
        Authority::CustomerUser => (
            required_id(new.tenant_id, "tenant", authority)?,
            required_id(new.customer_id, "customer", authority)?,
        ),
    };
    Ok(UserRecord {
        id: Uuid::new_v4(),
        created_time: crate::clock::now_ms(),
        tenant_id,
        customer_id,
        email,
        authority: new.authority,
        first_name: new.first_name,
        last_name: new.last_name,
        phone: String::new(),
        additional_info: None,
        version: 1,
        enabled: true,
        password_hash,
        tokens_valid_after: 0,
    })
}

async fn insert(store: &Store, user: UserRecord) -> Result<UserRecord, AccountError> {
    match store.insert_user(&user).await {
        Err(StoreError::Conflict(_)) => Err(AccountError::Exists(user.email)),
        Err(StoreError::ForeignCustomer) => Err(AccountError::ForeignCustomer(user.customer_id)),
        other => other.map(|_| user).map_err(Into::into),
    }
}

/// What [`bootstrap_admin`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// The store was empty: the first SYS_ADMIN exists now (or another replica
    /// created it at the same moment). `generated` is the password when none was
    /// given, to be shown once.
    Created { generated: Option<String> },
    /// The store already had users; nothing was created.
    StoreHasUsers,
}

/// Creates the first SYS_ADMIN when the store has no user at all.
pub async fn bootstrap_admin(
    store: &Store,
    password: Option<String>,
    policy: &PasswordPolicy,
) -> Result<Bootstrap, AccountError> {
    if store.user_count().await? > 0 {
        return Ok(Bootstrap::StoreHasUsers);
    }
    let (password, generated) = match password {
        Some(p) => (p, false),
        None => {
            let bytes = api_key::random_bytes::<18>().map_err(|_| AccountError::Random)?;
            use base64::Engine;
            (
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
                true,
            )
        }
    };
    let new = NewUser {
        email: BOOTSTRAP_EMAIL.into(),
        authority: Authority::SysAdmin,
        tenant_id: None,
        customer_id: None,
        first_name: String::new(),
        last_name: String::new(),
    };
    match create_user(store, new, password.clone(), policy).await {
        Ok(_) => Ok(Bootstrap::Created {
            generated: generated.then_some(password),
        }),
        // Another replica bootstrapped first.
        Err(AccountError::Exists(_)) => Ok(Bootstrap::Created { generated: None }),
        Err(e) => Err(e),
    }
}

/// A new key record and its value, shown once.
pub struct CreatedKey {
    pub record: ApiKeyRecord,
    pub value: Secret,
}

/// The shape of a key to create, as the caller asked for it.
pub struct KeyRequest<'a> {
    pub prefix: &'a str,
    pub description: &'a str,
    pub expiration_time: i64,
    pub enabled: bool,
    /// The grants the key is limited to; `None`: its owner's full rights.
    pub scopes: Option<std::sync::Arc<crate::auth::scope::Scopes>>,
}

pub async fn create_api_key(
    store: &Store,
    user: &UserRecord,
    prefix: &str,
    description: &str,
    expiration_time: i64,
    enabled: bool,
) -> Result<CreatedKey, AccountError> {
    let request = KeyRequest {
        prefix,
        description,
        expiration_time,
        enabled,
        scopes: None,
    };
    create_api_key_within(store, user, request, None).await
}

/// Creates a key for `user` unless they already hold `cap` keys
/// ([`AccountError::TooManyKeys`]); `None`: no cap.
pub async fn create_api_key_within(
    store: &Store,
    user: &UserRecord,
    request: KeyRequest<'_>,
    cap: Option<u64>,
) -> Result<CreatedKey, AccountError> {
    let KeyRequest {
        prefix,
        description,
        expiration_time,
        enabled,
        scopes,
    } = request;
    let description = description.trim();
    if description.is_empty() || description.chars().count() > 255 {
        return Err(AccountError::Invalid(
            "description must be non-blank and at most 255 characters".into(),
        ));
    }
    if expiration_time < 0 {
        return Err(AccountError::Invalid(
            "expirationTime must be 0 (never) or epoch milliseconds".into(),
        ));
    }
    let generated = api_key::generate(prefix).map_err(|_| AccountError::Random)?;
    let record = ApiKeyRecord {
        id: Uuid::new_v4(),
        created_time: crate::clock::now_ms(),
        tenant_id: user.tenant_id,
        user_id: user.id,
        digest: generated.digest.to_hex(),
        description: description.to_string(),
        enabled,
        expiration_time,
        scopes,
    };
    let held_cap = cap.map_or(i64::MAX, |cap| i64::try_from(cap).unwrap_or(i64::MAX));
    if !store.insert_api_key_capped(&record, held_cap).await? {
        return Err(AccountError::TooManyKeys(cap.unwrap_or(u64::MAX)));
    }
    Ok(CreatedKey {
        record,
        value: generated.value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_lower_cased_and_checked() {
        assert_eq!(
            check_email(" Admin@Example.COM ").unwrap(),
            "admin@example.com"
        );
        assert_eq!(
            check_email("sysadmin@keygate.local").unwrap(),
            "sysadmin@keygate.local"
        );
        for bad in ["", "no-at", "@example.com", "a b@example.com", "a@nodot"] {
            assert!(check_email(bad).is_err(), "{bad}");
        }
    }

    fn tenant_admin(tenant_id: Option<Uuid>) -> NewUser {
        NewUser {
            email: "ta@example.com".into(),
            authority: Authority::TenantAdmin,
            tenant_id,
            customer_id: None,
            first_name: String::new(),
            last_name: String::new(),
        }
    }

    #[test]
    fn tenant_admin_with_the_no_tenant_id_is_refused() {
        for tenant in [None, Some(NULL_UUID)] {
            let error = new_record(tenant_admin(tenant), String::new()).unwrap_err();
            assert!(error.to_string().contains("tenant id"), "{error}");
        }
        let customer = NewUser {
            authority: Authority::CustomerUser,
            tenant_id: Some(Uuid::from_u128(7)),
            customer_id: Some(NULL_UUID),
            ..tenant_admin(None)
        };
        assert!(new_record(customer, String::new()).is_err());
        let ok = new_record(tenant_admin(Some(Uuid::from_u128(7))), String::new()).unwrap();
        assert_eq!(ok.tenant_id, Uuid::from_u128(7));
    }
}
