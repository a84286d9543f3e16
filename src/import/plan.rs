//! What to do with each platform row: map it to keygate's record (or say
//! why it cannot be imported), then compare it with what keygate holds and
//! with what was imported last time. Pure: no I/O.
//!
//! The rule of a re-import: a field changes in keygate only when it changed
//! on the platform's side since the last import. A password is decided by
//! [`password_from_platform`]; a row deleted in keygate since stays deleted.

use uuid::Uuid;

use super::source::{KeyRow, UserRow};
use crate::auth::api_key::KeyDigest;
use crate::identity::{Authority, NULL_UUID};
use crate::store::{
    ApiKeyRecord, KeyUpdate, PlatformKey, PlatformUser, ResetUpdate, UserRecord, UserUpdate,
};

/// How long an imported invitation stays valid when the platform's has no
/// expiry time: as long as one keygate sends.
use crate::store::ACTIVATION_TTL_MS;

/// How long an imported reset link stays valid when the platform's has no
/// expiry time: as long as one keygate mails by default.
pub const RESET_TTL_MS: i64 = 3600 * 1000;

/// What to do with one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<T, U> {
    Add(T),
    Update(T, U),
    /// Nothing changes in keygate. `remember`: the platform's row changed
    /// only in what keygate keeps as its own, and its state is recorded so
    /// the next import compares with it.
    Keep {
        platform: T,
        remember: bool,
    },
    Skip(String),
}

pub type UserPlan = Plan<PlatformUser, UserUpdate>;
pub type KeyPlan = Plan<PlatformKey, KeyUpdate>;

fn uuid_or_null(text: &Option<String>) -> Result<Uuid, String> {
    match text {
        None => Ok(NULL_UUID),
        Some(text) => Uuid::parse_str(text).map_err(|_| format!("bad id {text:?}")),
    }
}

/// Why a row is not imported: a short code (the `reason` label of
/// `keygate_platform_sync_skipped_total`) and the words of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: &'static str,
    pub reason: String,
}

impl Refused {
    pub fn new(code: &'static str, reason: impl Into<String>) -> Refused {
        Refused {
            code,
            reason: reason.into(),
        }
    }
}

/// The codes of [`Refused`], and of the other rows an import holds back.
pub use crate::telemetry::skip_reason as code;

/// The platform's `tb_user` text columns are `varchar(255)`: a longer value
/// cannot come from the platform itself.
pub const MAX_FIELD_CHARS: usize = 255;

/// A platform user as keygate imports it, or why it cannot be. A bcrypt
/// hash above `max_bcrypt_cost` is refused: one check of it would hold a
/// hashing thread for seconds (cost 15) to days (cost 31).
pub fn map_user(row: &UserRow, now_ms: i64, max_bcrypt_cost: u32) -> Result<PlatformUser, Refused> {
    let id = Uuid::parse_str(&row.id).map_err(|_| invalid(format!("bad id {:?}", row.id)))?;
    let text = row
        .email
        .as_deref()
        .filter(|e| !e.trim_ascii().is_empty())
        .ok_or_else(|| invalid("no e-mail address".into()))?;
    check_lengths(row, text)?;
    let email =
        crate::email::check(text).map_err(|reason| Refused::new(code::INVALID_EMAIL, reason))?;
    let authority_text = row.authority.as_deref().unwrap_or("");
    let authority = Authority::parse(authority_text)
        .ok_or_else(|| invalid(format!("authority {authority_text:?} is not a user's")))?;
    let tenant_id = uuid_or_null(&row.tenant_id).map_err(invalid)?;
    let customer_id = uuid_or_null(&row.customer_id).map_err(invalid)?;
    let (tenant_id, customer_id) = placement(authority, tenant_id, customer_id)?;
    if authority == Authority::CustomerUser {
        check_customer(row, tenant_id, customer_id)?;
    }
    let password_hash = password_of(row, max_bcrypt_cost)?;
    let pending = password_hash.is_empty();
    // The platform keeps a user who has not activated yet disabled until
    // they do; keygate keeps them enabled without a password, so the token
    // can activate them (no password: no login until then).
    let invitation = row.activate_token.as_deref().filter(|t| !t.is_empty());
    let enabled = if pending && invitation.is_some() {
        true
    } else {
        row.enabled.unwrap_or(false)
    };
    let activation = invitation.filter(|_| pending).map(|token| {
        let expires = row
            .activate_token_exp_time
            .filter(|t| *t > 0)
            .unwrap_or(now_ms + ACTIVATION_TTL_MS);
        (KeyDigest::of(token).to_hex(), expires)
    });
    Ok(PlatformUser {
        id,
        created_time: row.created_time,
        tenant_id,
        customer_id,
        email,
        authority,
        first_name: row.first_name.clone().unwrap_or_default(),
        last_name: row.last_name.clone().unwrap_or_default(),
        phone: row.phone.clone().unwrap_or_default(),
        additional_info: row.additional_info.clone(),
        enabled,
        password_hash,
        activation,
        reset: reset_of(row, !pending && enabled, now_ms),
    })
}

/// The row's reset link, when it still works. A reset link works only for
/// an active account (a pending one activates through its invitation); an
/// expired one is not imported.
fn reset_of(row: &UserRow, active: bool, now_ms: i64) -> Option<(String, i64)> {
    row.reset_token
        .as_deref()
        .filter(|t| !t.is_empty() && active)
        .map(|token| {
            let expires = row
                .reset_token_exp_time
                .filter(|t| *t > 0)
                .unwrap_or(now_ms + RESET_TTL_MS);
            (KeyDigest::of(token).to_hex(), expires)
        })
        .filter(|(_, expires)| *expires > now_ms)
}

/// A row refused as no user keygate can hold.
fn invalid(reason: String) -> Refused {
    Refused::new(code::INVALID_ROW, reason)
}

/// Refuses a field longer than the platform's own column allows (`email`:
/// the address as the row has it).
fn check_lengths(row: &UserRow, email: &str) -> Result<(), Refused> {
    for (field, value) in [
        ("email", Some(email)),
        ("first_name", row.first_name.as_deref()),
        ("last_name", row.last_name.as_deref()),
        ("phone", row.phone.as_deref()),
    ] {
        let chars = value.map_or(0, |v| v.chars().count());
        if chars > MAX_FIELD_CHARS {
            return Err(Refused::new(
                code::TOO_LONG,
                format!(
                    "{field} is {chars} characters, longer than the platform's varchar({MAX_FIELD_CHARS})"
                ),
            ));
        }
    }
    Ok(())
}

/// The tenant and customer of a user of `authority`, or why the row's
/// cannot be theirs.
fn placement(
    authority: Authority,
    tenant_id: Uuid,
    customer_id: Uuid,
) -> Result<(Uuid, Uuid), Refused> {
    // A SYS_ADMIN belongs to no tenant and no customer, whatever the row
    // says (the platform stores the null UUID for both).
    match authority {
        Authority::SysAdmin => Ok((NULL_UUID, NULL_UUID)),
        Authority::TenantAdmin | Authority::CustomerUser if tenant_id == NULL_UUID => {
            Err(invalid(format!("a {authority} without a tenant")))
        }
        Authority::CustomerUser if customer_id == NULL_UUID => {
            Err(invalid("a CUSTOMER_USER without a customer".into()))
        }
        Authority::TenantAdmin if customer_id != NULL_UUID => Err(invalid(format!(
            "a TENANT_ADMIN assigned to customer {customer_id}"
        ))),
        _ => Ok((tenant_id, customer_id)),
    }
}

/// A customer user's customer must be one of its tenant's, as the
/// platform's `customer` table says: a row naming another tenant's
/// customer would reach that customer's devices.
fn check_customer(row: &UserRow, tenant_id: Uuid, customer_id: Uuid) -> Result<(), Refused> {
    let owner = row
        .customer_tenant_id
        .as_deref()
        .and_then(|t| Uuid::parse_str(t).ok());
    if !row.customer_found {
        return Err(Refused::new(
            code::FOREIGN_CUSTOMER,
            format!("its customer {customer_id} is not in the platform's customer table"),
        ));
    }
    if owner != Some(tenant_id) {
        let owner = owner.map_or("no tenant".to_owned(), |t| format!("tenant {t}"));
        return Err(Refused::new(
            code::FOREIGN_CUSTOMER,
            format!("its customer {customer_id} belongs to {owner}, not to its tenant {tenant_id}"),
        ));
    }
    Ok(())
}

/// The row's password hash: none (an account not activated yet), or a
/// bcrypt hash of a cost up to `max_bcrypt_cost`.
fn password_of(row: &UserRow, max_bcrypt_cost: u32) -> Result<String, Refused> {
    if !row.has_credentials {
        return Err(invalid("no credentials row".into()));
    }
    let password_hash = row.password.clone().unwrap_or_default();
    if !password_hash.is_empty() && !is_bcrypt(&password_hash) {
        return Err(invalid("the password hash is not bcrypt".into()));
    }
    if let Some(cost) = crate::auth::password::bcrypt_cost(&password_hash)
        && cost > max_bcrypt_cost
    {
        return Err(Refused::new(
            code::BCRYPT_COST,
            format!(
                "the bcrypt hash has cost {cost}, above login.max_bcrypt_cost {max_bcrypt_cost}"
            ),
        ));
    }
    Ok(password_hash)
}

fn is_bcrypt(hash: &str) -> bool {
    ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p)) && hash.len() == 60
}

/// A platform key as keygate imports it, or why it cannot be.
pub fn map_key(row: &KeyRow) -> Result<PlatformKey, String> {
    let id = Uuid::parse_str(&row.id).map_err(|_| format!("bad id {:?}", row.id))?;
    let user_id = match &row.user_id {
        Some(text) => Uuid::parse_str(text).map_err(|_| format!("bad owner id {text:?}"))?,
        None => return Err("no owner".into()),
    };
    let value = row
        .value
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or("no value")?;
    if value.len() > 8 * 1024 || !value.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err("the value cannot be sent in a header".into());
    }
    Ok(PlatformKey {
        id,
        created_time: row.created_time,
        tenant_id: uuid_or_null(&row.tenant_id)?,
        user_id,
        digest: KeyDigest::of(value).to_hex(),
        description: row.description.clone().unwrap_or_default(),
        enabled: row.enabled,
        expiration_time: row.expiration_time.unwrap_or(0).max(0),
    })
}

/// Whose password stays when both sides changed it since the last import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordOwner {
    /// The sync is on: the platform's UI manages users, and its change wins.
    Platform,
    /// An operator's import: users moved to keygate, and keygate's change
    /// wins.
    Keygate,
}

/// keygate's side of a user's password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeygatePassword<'a> {
    /// The hash keygate checks.
    pub hash: &'a str,
    /// The hash `hash` is keygate's re-hash of (the same password, at a
    /// login), when it is one.
    pub rehashed_from: Option<&'a str>,
}

/// The one rule of passwords between the platform and keygate: whether the
/// platform's current hash `platform` replaces keygate's.
///
/// The platform changed the password when its hash differs from `imported`,
/// the hash last imported from it (never compared with keygate's own
/// hashes). Unchanged there, keygate's password stays, whatever keygate did
/// with it. Changed there, it replaces keygate's when keygate still holds
/// the password last imported: that hash, or keygate's re-hash of it at a
/// login (a re-hash is nobody's password change). A password set in keygate
/// since (a change, a reset, an activation) stays only for an operator's
/// import; with the sync on, the platform owns passwords and its change
/// wins, so an operator who resets an account in the platform's UI also
/// ends every session of it there and then.
pub fn password_from_platform(
    platform: &str,
    imported: &str,
    keygate: KeygatePassword<'_>,
    owner: PasswordOwner,
) -> bool {
    if platform == imported || platform == keygate.hash {
        return false;
    }
    let imported_one = keygate.hash == imported || keygate.rehashed_from == Some(imported);
    imported_one || owner == PasswordOwner::Platform
}

/// What to do with a platform user, given what keygate holds with its id
/// (and, when its password hash is a re-hash, of which hash) and what was
/// imported last time.
pub fn plan_user(
    platform: PlatformUser,
    keygate: Option<&UserRecord>,
    imported: Option<&PlatformUser>,
    rehashed_from: Option<&str>,
    owner: PasswordOwner,
) -> UserPlan {
    match (keygate, imported) {
        (None, None) => Plan::Add(platform),
        (None, Some(_)) => Plan::Skip("deleted in keygate since it was imported".into()),
        (Some(_), None) => {
            Plan::Skip("keygate holds a user with this id that it did not import".into())
        }
        (Some(keygate), Some(imported)) => {
            let mut platform = platform;
            keep_expiries(&mut platform, imported);
            let update = user_update(&platform, keygate, imported, rehashed_from, owner);
            if update.is_empty() {
                let remember = platform != *imported;
                Plan::Keep { platform, remember }
            } else {
                Plan::Update(platform, update)
            }
        }
    }
}

/// An invitation or reset link without an expiry on the platform gets one
/// at its first import; the same one later keeps it.
fn keep_expiries(platform: &mut PlatformUser, imported: &PlatformUser) {
    if let (Some((digest, expires)), Some((was, expired))) =
        (platform.activation.as_mut(), imported.activation.as_ref())
        && digest == was
    {
        *expires = *expired;
    }
    if let (Some((digest, expires)), Some((was, expired))) =
        (platform.reset.as_mut(), imported.reset.as_ref())
        && digest == was
    {
        *expires = *expired;
    }
}

/// What changes in keygate's user from the platform's row: what changed
/// there since the last import (`imported`), and differs from keygate's.
fn user_update(
    platform: &PlatformUser,
    keygate: &UserRecord,
    imported: &PlatformUser,
    rehashed_from: Option<&str>,
    owner: PasswordOwner,
) -> UserUpdate {
    let identity = (
        &platform.email,
        platform.authority,
        platform.tenant_id,
        platform.customer_id,
    ) != (
        &imported.email,
        imported.authority,
        imported.tenant_id,
        imported.customer_id,
    );
    let mut update = UserUpdate {
        profile: !platform.same_profile(imported),
        identity,
        ..UserUpdate::default()
    };
    if platform.enabled != imported.enabled && platform.enabled != keygate.enabled {
        update.enabled = Some(platform.enabled);
    }
    let keygate_password = KeygatePassword {
        hash: &keygate.password_hash,
        rehashed_from,
    };
    if password_from_platform(
        &platform.password_hash,
        &imported.password_hash,
        keygate_password,
        owner,
    ) {
        update.password_hash = Some(platform.password_hash.clone());
    }
    let token = |a: &Option<(String, i64)>| a.as_ref().map(|(d, _)| d.clone());
    if token(&platform.activation) != token(&imported.activation)
        && keygate.password_hash.is_empty()
    {
        update.activation = Some(platform.activation.clone());
    }
    // A reset link new on the platform since the last import works
    // in keygate; the same link once used in keygate is not brought
    // back (the platform's token did not change since).
    if token(&platform.reset) != token(&imported.reset) {
        let gone = token(&imported.reset);
        let new = platform
            .reset
            .clone()
            .filter(|_| keygate.enabled && !keygate.password_hash.is_empty());
        if new.is_some() || gone.is_some() {
            update.reset = Some(ResetUpdate { gone, token: new });
        }
    }
    update
}

/// What to do with a platform key (as [`plan_user`]).
pub fn plan_key(
    platform: PlatformKey,
    keygate: Option<&ApiKeyRecord>,
    imported: Option<&PlatformKey>,
) -> KeyPlan {
    match (keygate, imported) {
        (None, None) => Plan::Add(platform),
        (None, Some(_)) => Plan::Skip("deleted in keygate since it was imported".into()),
        (Some(_), None) => {
            Plan::Skip("keygate holds a key with this id that it did not import".into())
        }
        (Some(keygate), Some(imported)) => {
            let mut update = KeyUpdate::default();
            if platform.digest != imported.digest && platform.digest != keygate.digest {
                update.digest = Some(platform.digest.clone());
            }
            if platform.description != imported.description
                && platform.description != keygate.description
            {
                update.description = Some(platform.description.clone());
            }
            if platform.enabled != imported.enabled && platform.enabled != keygate.enabled {
                update.enabled = Some(platform.enabled);
            }
            if platform.expiration_time != imported.expiration_time
                && platform.expiration_time != keygate.expiration_time
            {
                update.expiration_time = Some(platform.expiration_time);
            }
            if update.is_empty() {
                let remember = platform != *imported;
                Plan::Keep { platform, remember }
            } else {
                Plan::Update(platform, update)
            }
        }
    }
}

/// One second factor the platform configured for a user, ready to be
/// stored the keygate way (the caller seals or digests the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformTwoFactor {
    /// `TOTP`, `EMAIL` or `BACKUP_CODE`.
    pub provider: &'static str,
    pub use_by_default: bool,
    pub secret: PlatformSecret,
}

/// The secret of a platform second factor, in clear as the platform keeps it.
#[derive(Clone, PartialEq, Eq)]
pub enum PlatformSecret {
    /// The TOTP secret's bytes (from the Base32 of `authUrl`).
    Totp(Vec<u8>),
    /// The unused backup codes, sorted.
    Codes(Vec<String>),
    /// The address codes are mailed to (always the account's own).
    Email(String),
}

impl std::fmt::Debug for PlatformSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlatformSecret::Totp(_) => f.write_str("Totp(..)"),
            PlatformSecret::Codes(codes) => write!(f, "Codes({} codes)", codes.len()),
            PlatformSecret::Email(_) => f.write_str("Email(..)"),
        }
    }
}

impl PlatformSecret {
    /// The text a keyed fingerprint is taken of: changes when the secret does.
    pub fn canonical(&self) -> String {
        match self {
            PlatformSecret::Totp(raw) => format!("TOTP:{}", crate::auth::totp::base32_encode(raw)),
            PlatformSecret::Codes(codes) => format!("BACKUP_CODE:{}", codes.join(",")),
            PlatformSecret::Email(email) => format!("EMAIL:{email}"),
        }
    }
}

/// The platform's `AccountTwoFaSettings` JSON of one user (whose address
/// is `account_email`): the providers keygate can store, and for each one
/// it cannot, why. EMAIL is stored only when this keygate sends mail
/// (`mail`), and only for the account's own address.
pub fn map_two_factors(
    json: &str,
    account_email: &str,
    mail: bool,
) -> (Vec<PlatformTwoFactor>, Vec<(String, String)>) {
    let mut mapped = Vec::new();
    let mut refused = Vec::new();
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        refused.push(("*".to_owned(), "the 2FA settings are not JSON".to_owned()));
        return (mapped, refused);
    };
    let Some(configs) = value.get("configs").and_then(|c| c.as_object()) else {
        return (mapped, refused);
    };
    for (name, config) in configs {
        let use_by_default = config
            .get("useByDefault")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let secret = two_factor_secret(name, config, account_email, mail);
        match secret {
            Ok(secret) => mapped.push(PlatformTwoFactor {
                provider: match name.as_str() {
                    "TOTP" => "TOTP",
                    "EMAIL" => "EMAIL",
                    _ => "BACKUP_CODE",
                },
                use_by_default,
                secret,
            }),
            Err(reason) => refused.push((name.clone(), reason.to_owned())),
        }
    }
    // Backup codes count only beside another provider, as in keygate.
    if mapped.iter().all(|f| f.provider == "BACKUP_CODE") && !mapped.is_empty() {
        mapped.clear();
        refused.push((
            "BACKUP_CODE".to_owned(),
            "backup codes without another provider".to_owned(),
        ));
    }
    (mapped, refused)
}

/// The secret of the platform's provider `name` configured as `config`,
/// or why keygate cannot store it (as [`map_two_factors`]).
fn two_factor_secret(
    name: &str,
    config: &serde_json::Value,
    account_email: &str,
    mail: bool,
) -> Result<PlatformSecret, &'static str> {
    match name {
        "TOTP" => config
            .get("authUrl")
            .and_then(|v| v.as_str())
            .and_then(crate::auth::totp::secret_of_url)
            .and_then(|secret| crate::auth::totp::base32_decode(&secret.to_ascii_uppercase()))
            .filter(|raw| !raw.is_empty())
            .map(PlatformSecret::Totp)
            .ok_or("authUrl holds no Base32 secret"),
        "BACKUP_CODE" => {
            let codes: Option<Vec<String>> =
                config.get("codes").and_then(|v| v.as_array()).map(|codes| {
                    codes
                        .iter()
                        .filter_map(|c| c.as_str())
                        .map(|c| c.trim().to_owned())
                        .filter(|c| !c.is_empty())
                        .collect()
                });
            match codes {
                Some(mut codes) if !codes.is_empty() => {
                    codes.sort();
                    codes.dedup();
                    Ok(PlatformSecret::Codes(codes))
                }
                _ => Err("no unused backup codes"),
            }
        }
        "EMAIL" if !mail => Err("EMAIL needs [mail]"),
        "EMAIL" => match config.get("email").and_then(|v| v.as_str()) {
            Some(email) if crate::email::same(email, account_email) => {
                Ok(PlatformSecret::Email(crate::email::fold(account_email)))
            }
            Some(_) => Err("EMAIL names another address than the account's"),
            None => Err("EMAIL names no address"),
        },
        "SMS" => Err("keygate does not offer this provider"),
        _ => Err("an unknown provider"),
    }
}

/// What was imported of one second factor: a keyed fingerprint of the
/// platform's config, and when keygate's row was written (a row written
/// since is keygate's own).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedTwoFactor {
    pub fingerprint: String,
    pub created_time: i64,
}

/// What to do with one second factor of one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwoFactorPlan {
    /// New on the platform: store it.
    Add,
    /// Changed on the platform, and keygate's is still the one imported.
    Replace,
    /// Gone from the platform, and keygate's is still the one imported.
    Remove,
    /// Nothing changes in keygate (unchanged, or keygate's own since).
    Keep,
    /// Gone from the platform, and keygate's is its own: keep it, forget
    /// the import.
    Forget,
    /// Neither side has it.
    Nothing,
}

/// The rule of a re-import for second factors, as for passwords: keygate's
/// config changes only when the platform's changed since the last import
/// and keygate's is still the one imported; one configured or removed in
/// keygate since is kept.
pub fn plan_two_factor(
    platform: Option<&str>,
    keygate_created: Option<i64>,
    imported: Option<&ImportedTwoFactor>,
) -> TwoFactorPlan {
    match (platform, keygate_created, imported) {
        (Some(_), None, None) => TwoFactorPlan::Add,
        (Some(_), Some(_), None) => TwoFactorPlan::Keep,
        (Some(_), None, Some(_)) => TwoFactorPlan::Keep,
        (Some(fingerprint), Some(created), Some(imported)) => {
            if fingerprint == imported.fingerprint || created != imported.created_time {
                TwoFactorPlan::Keep
            } else {
                TwoFactorPlan::Replace
            }
        }
        (None, Some(created), Some(imported)) if created == imported.created_time => {
            TwoFactorPlan::Remove
        }
        (None, _, Some(_)) => TwoFactorPlan::Forget,
        (None, _, None) => TwoFactorPlan::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_two_fa_settings_map_totp_and_backup_codes_and_name_the_rest() {
        let json = r#"{"configs":{
            "TOTP":{"providerType":"TOTP","useByDefault":true,"authUrl":"otpauth://totp/TB:a%40b.c?issuer=TB&secret=JBSWY3DPEHPK3PXP"},
            "BACKUP_CODE":{"providerType":"BACKUP_CODE","useByDefault":false,"codes":["b2","a1"],"codesLeft":2},
            "EMAIL":{"providerType":"EMAIL","useByDefault":false,"email":"a@b.c"}}}"#;
        let (mapped, refused) = map_two_factors(json, "a@b.c", false);
        assert_eq!(mapped.len(), 2);
        let totp = mapped.iter().find(|f| f.provider == "TOTP").unwrap();
        assert!(totp.use_by_default);
        assert_eq!(
            totp.secret,
            PlatformSecret::Totp(b"Hello!\xde\xad\xbe\xef".to_vec())
        );
        let codes = mapped.iter().find(|f| f.provider == "BACKUP_CODE").unwrap();
        assert_eq!(
            codes.secret,
            PlatformSecret::Codes(vec!["a1".into(), "b2".into()])
        );
        assert_eq!(
            refused,
            vec![("EMAIL".to_owned(), "EMAIL needs [mail]".to_owned())]
        );
        let (mapped, refused) = map_two_factors("not json", "a@b.c", true);
        assert!(mapped.is_empty());
        assert_eq!(refused.len(), 1);
        let (mapped, refused) = map_two_factors(
            r#"{"configs":{"BACKUP_CODE":{"providerType":"BACKUP_CODE","codes":["a1"]}}}"#,
            "a@b.c",
            true,
        );
        assert!(mapped.is_empty(), "backup codes alone count for nothing");
        assert_eq!(refused[0].0, "BACKUP_CODE");
    }

    #[test]
    fn a_platform_email_config_maps_only_to_the_accounts_own_address_and_only_with_mail() {
        let json = |email: &str| {
            format!(
                r#"{{"configs":{{"EMAIL":{{"providerType":"EMAIL","useByDefault":true,"email":"{email}"}},
                "BACKUP_CODE":{{"providerType":"BACKUP_CODE","codes":["a1"]}}}}}}"#
            )
        };
        let (mapped, refused) = map_two_factors(&json("Ann@Example.com"), "ann@example.com", true);
        assert!(refused.is_empty(), "{refused:?}");
        let email = mapped.iter().find(|f| f.provider == "EMAIL").unwrap();
        assert!(email.use_by_default);
        assert_eq!(
            email.secret,
            PlatformSecret::Email("ann@example.com".into())
        );
        assert!(
            mapped.iter().any(|f| f.provider == "BACKUP_CODE"),
            "backup codes count beside EMAIL"
        );
        let (mapped, refused) =
            map_two_factors(&json("mallory@evil.test"), "ann@example.com", true);
        assert!(mapped.is_empty());
        assert!(
            refused
                .iter()
                .any(|(p, r)| p == "EMAIL" && r.contains("another address"))
        );
        let (mapped, refused) = map_two_factors(&json("ann@example.com"), "ann@example.com", false);
        assert!(mapped.is_empty());
        assert!(refused.contains(&("EMAIL".to_owned(), "EMAIL needs [mail]".to_owned())));
    }

    #[test]
    fn a_platform_reset_token_is_imported_as_a_digest_unless_expired() {
        let row = UserRow {
            reset_token: Some("reset-token".into()),
            reset_token_exp_time: Some(5_000),
            ..row()
        };
        let user = map_user(&row, 1_000, CAP).unwrap();
        assert_eq!(
            user.reset,
            Some((KeyDigest::of("reset-token").to_hex(), 5_000))
        );
        assert_eq!(map_user(&row, 5_000, CAP).unwrap().reset, None, "expired");
        let pending = UserRow {
            password: None,
            ..row.clone()
        };
        assert_eq!(map_user(&pending, 1_000, CAP).unwrap().reset, None);
        let disabled = UserRow {
            enabled: Some(false),
            ..row.clone()
        };
        assert_eq!(map_user(&disabled, 1_000, CAP).unwrap().reset, None);
    }

    #[test]
    fn a_reset_token_used_in_keygate_is_not_brought_back_and_a_new_one_is() {
        let row = UserRow {
            reset_token: Some("reset-token".into()),
            reset_token_exp_time: Some(5_000),
            ..row()
        };
        let imported = map_user(&row, 1_000, CAP).unwrap();
        let keygate = keygate_of(&imported);
        let again = map_user(&row, 2_000, CAP).unwrap();
        assert!(matches!(
            plan_user(
                again,
                Some(&keygate),
                Some(&imported),
                None,
                PasswordOwner::Keygate
            ),
            Plan::Keep { .. }
        ));
        let newer = map_user(
            &UserRow {
                reset_token: Some("newer-token".into()),
                ..row.clone()
            },
            2_000,
            CAP,
        )
        .unwrap();
        let Plan::Update(_, update) = plan_user(
            newer,
            Some(&keygate),
            Some(&imported),
            None,
            PasswordOwner::Keygate,
        ) else {
            panic!("not an update");
        };
        assert_eq!(
            update.reset,
            Some(ResetUpdate {
                gone: Some(KeyDigest::of("reset-token").to_hex()),
                token: Some((KeyDigest::of("newer-token").to_hex(), 5_000)),
            })
        );
    }

    #[test]
    fn a_two_factor_config_changed_in_keygate_is_never_overwritten_by_a_reimport() {
        use TwoFactorPlan::*;
        let was = ImportedTwoFactor {
            fingerprint: "f1".into(),
            created_time: 10,
        };
        assert_eq!(plan_two_factor(Some("f1"), None, None), Add);
        assert_eq!(
            plan_two_factor(Some("f1"), Some(5), None),
            Keep,
            "keygate's own"
        );
        assert_eq!(
            plan_two_factor(Some("f1"), Some(10), Some(&was)),
            Keep,
            "unchanged"
        );
        assert_eq!(plan_two_factor(Some("f2"), Some(10), Some(&was)), Replace);
        assert_eq!(
            plan_two_factor(Some("f2"), Some(20), Some(&was)),
            Keep,
            "reconfigured in keygate since"
        );
        assert_eq!(
            plan_two_factor(Some("f2"), None, Some(&was)),
            Keep,
            "removed in keygate since"
        );
        assert_eq!(plan_two_factor(None, Some(10), Some(&was)), Remove);
        assert_eq!(plan_two_factor(None, Some(20), Some(&was)), Forget);
        assert_eq!(plan_two_factor(None, None, Some(&was)), Forget);
        assert_eq!(plan_two_factor(None, Some(20), None), Nothing);
    }

    const CAP: u32 = 12;
    const HASH: &str = "$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy";
    const OTHER_HASH: &str = "$2a$10$abcdefghijklmnopqrstuu5Ud1Nw1zJ8jQk5Qb0bq8mXl5lXyVYFW";

    fn row() -> UserRow {
        UserRow {
            id: Uuid::new_v4().to_string(),
            created_time: 1,
            tenant_id: Some(Uuid::new_v4().to_string()),
            customer_id: Some(NULL_UUID.to_string()),
            email: Some("Ann@Example.com".into()),
            authority: Some("TENANT_ADMIN".into()),
            enabled: Some(true),
            password: Some(HASH.into()),
            has_credentials: true,
            ..UserRow::default()
        }
    }

    fn keygate_of(user: &PlatformUser) -> UserRecord {
        UserRecord {
            id: user.id,
            created_time: user.created_time,
            tenant_id: user.tenant_id,
            customer_id: user.customer_id,
            email: user.email.clone(),
            authority: user.authority,
            first_name: user.first_name.clone(),
            last_name: user.last_name.clone(),
            phone: user.phone.clone(),
            additional_info: user.additional_info.clone(),
            version: 1,
            enabled: user.enabled,
            password_hash: user.password_hash.clone(),
            tokens_valid_after: 0,
        }
    }

    #[test]
    fn a_platform_user_keeps_its_id_email_and_bcrypt_hash() {
        let row = row();
        let user = map_user(&row, 0, CAP).unwrap();
        assert_eq!(user.id.to_string(), row.id);
        assert_eq!(user.email, "ann@example.com");
        assert_eq!(user.password_hash, HASH);
        assert!(user.enabled && user.activation.is_none());
    }

    #[test]
    fn rows_that_are_not_importable_say_why() {
        let cases: [(UserRow, &str); 6] = [
            (
                UserRow {
                    email: None,
                    ..row()
                },
                "no e-mail",
            ),
            (
                UserRow {
                    authority: Some("REFRESH_TOKEN".into()),
                    ..row()
                },
                "not a user's",
            ),
            (
                UserRow {
                    tenant_id: None,
                    ..row()
                },
                "without a tenant",
            ),
            (
                UserRow {
                    authority: Some("CUSTOMER_USER".into()),
                    ..row()
                },
                "without a customer",
            ),
            (
                UserRow {
                    password: Some("plain".into()),
                    ..row()
                },
                "not bcrypt",
            ),
            (
                UserRow {
                    has_credentials: false,
                    ..row()
                },
                "no credentials",
            ),
        ];
        for (row, reason) in cases {
            let error = map_user(&row, 0, CAP).unwrap_err();
            assert!(error.reason.contains(reason), "{error:?} lacks {reason}");
            assert_eq!(error.code, code::INVALID_ROW);
        }
    }

    #[test]
    fn an_imported_row_with_an_address_the_rest_endpoint_refuses_is_skipped() {
        for bad in [
            "evil@example.com\r\nBcc: x@example.com",
            "a b@example.com",
            "not an email",
            "\u{212A}elvin@example.com",
        ] {
            let row = UserRow {
                email: Some(bad.into()),
                ..row()
            };
            let error = map_user(&row, 0, CAP).unwrap_err();
            assert_eq!(error.code, code::INVALID_EMAIL, "{bad:?}: {error:?}");
            assert!(error.reason.contains("Invalid email address"), "{error:?}");
        }
    }

    #[test]
    fn an_imported_name_longer_than_the_platforms_column_is_skipped() {
        let megabyte = "x".repeat(1 << 20);
        for row in [
            UserRow {
                first_name: Some(megabyte.clone()),
                ..row()
            },
            UserRow {
                last_name: Some("é".repeat(MAX_FIELD_CHARS + 1)),
                ..row()
            },
            UserRow {
                phone: Some(megabyte.clone()),
                ..row()
            },
            UserRow {
                email: Some(format!("{megabyte}@example.com")),
                ..row()
            },
        ] {
            let error = map_user(&row, 0, CAP).unwrap_err();
            assert_eq!(error.code, code::TOO_LONG, "{error:?}");
            assert!(error.reason.contains("varchar(255)"), "{error:?}");
        }
        // 255 characters of two bytes each fit the platform's column.
        let fits = UserRow {
            last_name: Some("é".repeat(MAX_FIELD_CHARS)),
            ..row()
        };
        assert!(map_user(&fits, 0, CAP).is_ok());
    }

    #[test]
    fn an_imported_bcrypt_hash_above_the_cost_cap_is_skipped_naming_its_cost() {
        for (cost, skipped) in [(10, false), (12, false), (13, true), (31, true)] {
            let hash = format!("$2a${cost:02}${}", &HASH[7..]);
            let row = UserRow {
                password: Some(hash),
                ..row()
            };
            match map_user(&row, 0, CAP) {
                Err(error) if skipped => {
                    assert_eq!(error.code, code::BCRYPT_COST);
                    assert!(error.reason.contains(&format!("cost {cost}")), "{error:?}");
                }
                Ok(user) if !skipped => assert!(user.password_hash.starts_with("$2a$")),
                other => panic!("cost {cost}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_customer_user_whose_customer_is_another_tenants_is_skipped() {
        let tenant = Uuid::new_v4();
        let customer_user = |found: bool, owner: Option<Uuid>| UserRow {
            authority: Some("CUSTOMER_USER".into()),
            tenant_id: Some(tenant.to_string()),
            customer_id: Some(Uuid::new_v4().to_string()),
            customer_found: found,
            customer_tenant_id: owner.map(|t| t.to_string()),
            ..row()
        };
        assert!(map_user(&customer_user(true, Some(tenant)), 0, CAP).is_ok());
        for (row, words) in [
            (
                customer_user(true, Some(Uuid::new_v4())),
                "belongs to tenant",
            ),
            (customer_user(true, None), "belongs to no tenant"),
            (
                customer_user(false, None),
                "not in the platform's customer table",
            ),
        ] {
            let error = map_user(&row, 0, CAP).unwrap_err();
            assert_eq!(error.code, code::FOREIGN_CUSTOMER);
            assert!(error.reason.contains(words), "{error:?}");
        }
    }

    #[test]
    fn an_imported_sys_admin_has_no_tenant_and_no_customer() {
        let admin = UserRow {
            authority: Some("SYS_ADMIN".into()),
            customer_id: Some(Uuid::new_v4().to_string()),
            ..row()
        };
        let user = map_user(&admin, 0, CAP).unwrap();
        assert_eq!((user.tenant_id, user.customer_id), (NULL_UUID, NULL_UUID));
        let assigned = UserRow {
            customer_id: Some(Uuid::new_v4().to_string()),
            ..row()
        };
        let error = map_user(&assigned, 0, CAP).unwrap_err();
        assert!(error.reason.contains("TENANT_ADMIN assigned"), "{error:?}");
    }

    #[test]
    fn a_pending_user_is_enabled_with_its_invitation_as_a_digest() {
        let row = UserRow {
            enabled: Some(false),
            password: None,
            activate_token: Some("invite-token".into()),
            activate_token_exp_time: Some(5_000),
            ..row()
        };
        let user = map_user(&row, 0, CAP).unwrap();
        assert!(user.enabled);
        assert_eq!(user.password_hash, "");
        assert_eq!(
            user.activation,
            Some((KeyDigest::of("invite-token").to_hex(), 5_000))
        );
    }

    #[test]
    fn a_disabled_user_stays_disabled() {
        let user = map_user(
            &UserRow {
                enabled: Some(false),
                ..row()
            },
            0,
            CAP,
        )
        .unwrap();
        assert!(!user.enabled);
    }

    #[test]
    fn a_reimport_of_an_unchanged_user_changes_nothing() {
        let user = map_user(&row(), 0, CAP).unwrap();
        let keygate = keygate_of(&user);
        let plan = plan_user(
            user.clone(),
            Some(&keygate),
            Some(&user),
            None,
            PasswordOwner::Keygate,
        );
        assert_eq!(
            plan,
            Plan::Keep {
                platform: user,
                remember: false
            }
        );
    }

    #[test]
    fn a_password_changed_in_keygate_survives_a_platform_password_change() {
        let imported = map_user(&row(), 0, CAP).unwrap();
        let mut keygate = keygate_of(&imported);
        keygate.password_hash = "$argon2id$v=19$...".into();
        let platform = PlatformUser {
            password_hash: OTHER_HASH.into(),
            ..imported.clone()
        };
        let plan = plan_user(
            platform.clone(),
            Some(&keygate),
            Some(&imported),
            None,
            PasswordOwner::Keygate,
        );
        assert_eq!(
            plan,
            Plan::Keep {
                platform,
                remember: true
            }
        );
    }

    /// The cases of [`password_from_platform`], for the sync (the platform
    /// owns passwords) and for an operator's import.
    #[test]
    fn a_platform_password_replaces_keygates_unless_keygate_set_one_since() {
        use PasswordOwner::{Keygate, Platform};
        const REHASH: &str = "$argon2id$v=19$rehash-of-HASH";
        const SET: &str = "$argon2id$v=19$set-in-keygate";
        let untouched = KeygatePassword {
            hash: HASH,
            rehashed_from: None,
        };
        let rehashed = KeygatePassword {
            hash: REHASH,
            rehashed_from: Some(HASH),
        };
        let set_in_keygate = KeygatePassword {
            hash: SET,
            rehashed_from: None,
        };
        // A re-hash of a hash imported before the last platform change is
        // keygate's own password, not the one imported last.
        let rehash_of_older = KeygatePassword {
            hash: REHASH,
            rehashed_from: Some(OTHER_HASH),
        };
        for owner in [Platform, Keygate] {
            // Unchanged on the platform: keygate's stays, whatever it is.
            for keygate in [untouched, rehashed, set_in_keygate, rehash_of_older] {
                assert!(
                    !password_from_platform(HASH, HASH, keygate, owner),
                    "{keygate:?} {owner:?}"
                );
            }
            // Changed on the platform: it replaces the imported one, and
            // keygate's re-hash of it (which is no password change).
            assert!(password_from_platform(OTHER_HASH, HASH, untouched, owner));
            assert!(password_from_platform(OTHER_HASH, HASH, rehashed, owner));
            // Already the platform's: nothing to write.
            let same = KeygatePassword {
                hash: OTHER_HASH,
                rehashed_from: None,
            };
            assert!(!password_from_platform(OTHER_HASH, HASH, same, owner));
        }
        // Changed in keygate and on the platform since the last import: the
        // sync's platform owns passwords; an operator's import keeps
        // keygate's.
        assert!(password_from_platform(
            OTHER_HASH,
            HASH,
            set_in_keygate,
            Platform
        ));
        assert!(!password_from_platform(
            OTHER_HASH,
            HASH,
            set_in_keygate,
            Keygate
        ));
        assert!(password_from_platform("", HASH, rehash_of_older, Platform));
        assert!(!password_from_platform(
            OTHER_HASH,
            HASH,
            rehash_of_older,
            Keygate
        ));
        // A pending user (no password on either side) who activates on the
        // platform gets the platform's password.
        let pending = KeygatePassword {
            hash: "",
            rehashed_from: None,
        };
        assert!(password_from_platform(HASH, "", pending, Keygate));
    }

    #[test]
    fn a_password_rehashed_at_login_is_replaced_by_the_platforms_new_one() {
        let imported = map_user(&row(), 0, CAP).unwrap();
        let mut keygate = keygate_of(&imported);
        keygate.password_hash = "$argon2id$v=19$rehash".into();
        let platform = PlatformUser {
            password_hash: OTHER_HASH.into(),
            ..imported.clone()
        };
        for owner in [PasswordOwner::Platform, PasswordOwner::Keygate] {
            let plan = plan_user(
                platform.clone(),
                Some(&keygate),
                Some(&imported),
                Some(HASH),
                owner,
            );
            let Plan::Update(_, update) = plan else {
                panic!("not an update: {plan:?}");
            };
            assert_eq!(update.password_hash.as_deref(), Some(OTHER_HASH));
        }
        // The platform's unchanged: the re-hash stays, nothing is written.
        let plan = plan_user(
            imported.clone(),
            Some(&keygate),
            Some(&imported),
            Some(HASH),
            PasswordOwner::Platform,
        );
        assert!(matches!(plan, Plan::Keep { .. }), "{plan:?}");
    }

    #[test]
    fn a_platform_change_updates_only_what_changed_there() {
        let imported = map_user(&row(), 0, CAP).unwrap();
        let keygate = keygate_of(&imported);
        let platform = PlatformUser {
            last_name: "Smith".into(),
            enabled: false,
            password_hash: OTHER_HASH.into(),
            ..imported.clone()
        };
        let Plan::Update(_, update) = plan_user(
            platform,
            Some(&keygate),
            Some(&imported),
            None,
            PasswordOwner::Keygate,
        ) else {
            panic!("not an update");
        };
        assert!(update.profile);
        assert!(!update.identity, "a new name ends no session");
        assert_eq!(update.enabled, Some(false));
        assert_eq!(update.password_hash.as_deref(), Some(OTHER_HASH));
        assert_eq!(update.activation, None);
    }

    #[test]
    fn a_user_deleted_in_keygate_is_not_imported_again() {
        let imported = map_user(&row(), 0, CAP).unwrap();
        let plan = plan_user(
            imported.clone(),
            None,
            Some(&imported),
            None,
            PasswordOwner::Keygate,
        );
        assert!(matches!(plan, Plan::Skip(reason) if reason.contains("deleted in keygate")));
    }

    fn key_row() -> KeyRow {
        KeyRow {
            id: Uuid::new_v4().to_string(),
            created_time: 7,
            tenant_id: Some(Uuid::new_v4().to_string()),
            user_id: Some(Uuid::new_v4().to_string()),
            value: Some("tb_platformvalue".into()),
            enabled: true,
            expiration_time: None,
            description: None,
        }
    }

    #[test]
    fn a_platform_key_is_kept_only_as_the_digest_keygate_looks_up() {
        let key = map_key(&key_row()).unwrap();
        assert_eq!(key.digest, KeyDigest::of("tb_platformvalue").to_hex());
        assert_eq!(key.expiration_time, 0);
        assert!(!format!("{key:?}").contains("platformvalue"));
    }

    #[test]
    fn keys_without_owner_or_a_sendable_value_are_skipped() {
        assert!(
            map_key(&KeyRow {
                user_id: None,
                ..key_row()
            })
            .is_err()
        );
        assert!(
            map_key(&KeyRow {
                value: None,
                ..key_row()
            })
            .is_err()
        );
        assert!(
            map_key(&KeyRow {
                value: Some("a b".into()),
                ..key_row()
            })
            .is_err()
        );
    }

    #[test]
    fn a_key_disabled_in_keygate_stays_disabled_while_the_platform_is_unchanged() {
        let imported = map_key(&key_row()).unwrap();
        let keygate = ApiKeyRecord {
            id: imported.id,
            created_time: imported.created_time,
            tenant_id: imported.tenant_id,
            user_id: imported.user_id,
            digest: imported.digest.clone(),
            description: imported.description.clone(),
            enabled: false,
            expiration_time: 0,
            scopes: None,
        };
        let plan = plan_key(imported.clone(), Some(&keygate), Some(&imported));
        assert_eq!(
            plan,
            Plan::Keep {
                platform: imported.clone(),
                remember: false
            }
        );
        let disabled_there = PlatformKey {
            enabled: false,
            description: "ci".into(),
            ..imported.clone()
        };
        let Plan::Update(_, update) = plan_key(disabled_there, Some(&keygate), Some(&imported))
        else {
            panic!("not an update");
        };
        assert_eq!(update.enabled, None);
        assert_eq!(update.description.as_deref(), Some("ci"));
    }
}
