//! Second factors at login, in the platform's wire format: TOTP and backup
//! codes, configured by each user for themselves (`/api/2fa/...`), the
//! platform-wide settings (`/api/2fa/settings`, SYS_ADMIN), and the check
//! that turns a pre-verification token into a token pair
//! (`/api/auth/2fa/...`).
//!
//! Enforcement (the platform's `enforceTwoFa`): a user the settings name who
//! has no provider logs in to an MFA configuration token, which opens the
//! four configuring endpoints and `/api/auth/2fa/login`, and nothing else.
//!
//! When a second factor is due, which providers count, and the `Cleared` a
//! token pair needs are decided by the gate, [`crate::auth::second_factor`];
//! this module keeps the platform's settings, the wire, and the endpoints.
//!
//! Beyond the platform: a TOTP secret is sealed at rest and shown once, in
//! the answer that generated it; only a secret keygate generated for the
//! user moments before can be saved; a TOTP code is accepted once; backup
//! codes are stored as keyed digests; guessing takes slots of the limiter's
//! code windows (which a right password never clears), and a number of wrong
//! codes ends the pre-verification token.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use uuid::Uuid;

use super::access::{param, query_pairs};
use super::wire::{BodyErrors, CredentialErrors, LoginErrors};
use super::{EndpointRequest, Endpoints, empty_response, json_response};
use crate::auth::at_rest::Sealer;
use crate::auth::jwt::{AccessClaims, MFA_CONFIGURATION_SCOPE, PRE_VERIFICATION_SCOPE, TokenError};
use crate::auth::second_factor::{self, Cleared, Gate, Policy, SentCode, Verified};
use crate::auth::totp;
use crate::body::Body;
use crate::config::{EnforcedUsers, TwoFactorSettings};
use crate::error::{ApiError, code};
use crate::identity::{Authority, Identity};
use crate::store::{Audit, Store, TwoFactorRecord, UserRecord};

pub use crate::auth::second_factor::{BACKUP_CODE, EMAIL, TOTP};

/// The `settings` row that holds what `POST /api/2fa/settings` saved.
const PLATFORM_SETTINGS: &str = "two_factor_platform";
/// How long a generated, not yet saved, secret or set of codes is kept.
const PENDING_LIFETIME: Duration = Duration::from_secs(600);
/// Longest a pre-verification token may live (`totalAllowedTimeForVerification`).
const MAX_VERIFICATION_TIME: i64 = 3600;
/// Characters of a backup code, and their alphabet (the platform's).
const BACKUP_CODE_LEN: usize = 8;
const BACKUP_CODE_ALPHABET: &[u8; 16] = b"0123456789abcdef";

/// A generated secret or set of codes, kept until the user saves it.
#[derive(Clone)]
enum Generated {
    Totp(String),
    Codes(Vec<String>),
    /// The address codes go to: always the user's own.
    Email(String),
}

/// What an e-mail code is for: saving the EMAIL provider, or a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CodeFor {
    Config,
    Login,
}

/// State of the second factors: the sealer, what was generated and not yet
/// saved (per user and provider), and the wrong codes of each login attempt.
/// Both maps live in this replica's memory: generating and saving a config
/// must reach the same replica, and the wrong codes of an attempt are
/// counted per replica (the limiter's code windows, shared through Redis when
/// configured, still bound guessing across replicas).
pub struct TwoFactor {
    sealer: std::sync::Arc<Sealer>,
    pending: moka::sync::Cache<(Uuid, &'static str), Generated>,
    failures: moka::sync::Cache<Uuid, u32>,
    /// The last e-mail code sent to each user, per purpose (one at a time).
    codes: moka::sync::Cache<(Uuid, CodeFor), SentCode>,
}

impl TwoFactor {
    /// The sealer of second-factor secrets (the import run by the sync
    /// stores the platform's the same way).
    pub fn sealer(&self) -> std::sync::Arc<Sealer> {
        self.sealer.clone()
    }

    /// `fallback_secret` (the token signing key) derives the sealing key
    /// when `[two_factor] encryption_secret` is not set.
    pub fn new(settings: &TwoFactorSettings, fallback_secret: &[u8]) -> TwoFactor {
        TwoFactor {
            sealer: std::sync::Arc::new(Sealer::configured(settings, fallback_secret)),
            pending: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(PENDING_LIFETIME)
                .build(),
            failures: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(MAX_VERIFICATION_TIME as u64))
                .build(),
            codes: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(MAX_VERIFICATION_TIME as u64))
                .build(),
        }
    }
}

impl std::fmt::Debug for TwoFactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwoFactor").finish_non_exhaustive()
    }
}

// --- wire types ----------------------------------------------------------------

/// A provider in the platform settings.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfig {
    pub provider_type: String,
    /// TOTP: named in authenticator apps next to the account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_name: Option<String>,
    /// BACKUP_CODE: how many codes are generated at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes_quantity: Option<i64>,
    /// EMAIL: how long a mailed code holds, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_code_lifetime: Option<i64>,
}

/// The platform's two-factor settings (`/api/2fa/settings`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformTwoFaSettings {
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub min_verification_code_send_period: Option<i64>,
    #[serde(default)]
    pub verification_code_check_rate_limit: Option<String>,
    /// Wrong codes that end a pre-verification token.
    #[serde(default)]
    pub max_verification_failures_before_user_lockout: Option<i64>,
    /// Lifetime of a pre-verification token, in seconds.
    #[serde(default)]
    pub total_allowed_time_for_verification: Option<i64>,
    /// Users without a provider must configure one before they get a
    /// token pair: they log in to an MFA configuration token.
    #[serde(default)]
    pub enforce_two_fa: bool,
    /// Whom `enforceTwoFa` applies to: `ALL_USERS`,
    /// `SYSTEM_ADMINISTRATORS` or `TENANT_ADMINISTRATORS` (with
    /// `tenantsIds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub enforced_users_filter: Option<EnforcedUsers>,
}

impl ProviderConfig {
    /// Refuses a provider keygate cannot honour, with the reason; EMAIL only
    /// when mail is configured.
    fn check(&self, mail: bool) -> Result<(), ApiError> {
        match self.provider_type.as_str() {
            TOTP => {
                if self
                    .issuer_name
                    .as_deref()
                    .is_none_or(|name| name.trim().is_empty())
                {
                    return Err(ApiError::bad_request("issuerName must not be blank"));
                }
            }
            BACKUP_CODE => {
                if !(1..=100).contains(&self.codes_quantity.unwrap_or(0)) {
                    return Err(ApiError::bad_request("codesQuantity must be from 1 to 100"));
                }
            }
            EMAIL if mail => {
                if !(1..=MAX_VERIFICATION_TIME)
                    .contains(&self.verification_code_lifetime.unwrap_or(120))
                {
                    return Err(ApiError::bad_request(format!(
                        "verificationCodeLifetime must be from 1 to {MAX_VERIFICATION_TIME} seconds"
                    )));
                }
            }
            other => {
                let offered = if mail {
                    "TOTP, BACKUP_CODE and EMAIL"
                } else {
                    "TOTP and BACKUP_CODE (EMAIL needs [mail])"
                };
                return Err(ApiError::bad_request(format!(
                    "2FA provider {other} is not available: keygate offers {offered}"
                )));
            }
        }
        Ok(())
    }
}

impl PlatformTwoFaSettings {
    fn from_config(
        settings: &TwoFactorSettings,
        code_lifetime: Option<Duration>,
    ) -> PlatformTwoFaSettings {
        PlatformTwoFaSettings {
            providers: settings
                .providers
                .iter()
                .map(|provider| ProviderConfig {
                    provider_type: provider.clone(),
                    issuer_name: (provider == TOTP).then(|| settings.issuer_name.clone()),
                    codes_quantity: (provider == BACKUP_CODE)
                        .then_some(settings.backup_codes as i64),
                    verification_code_lifetime: (provider == EMAIL)
                        .then(|| code_lifetime.map(|d| d.as_secs() as i64))
                        .flatten(),
                })
                .collect(),
            min_verification_code_send_period: Some(30),
            verification_code_check_rate_limit: None,
            max_verification_failures_before_user_lockout: Some(i64::from(
                settings.max_verification_failures,
            )),
            total_allowed_time_for_verification: Some(settings.verification_time.as_secs() as i64),
            enforce_two_fa: settings.enforced.is_some(),
            enforced_users_filter: settings.enforced.clone(),
        }
    }

    fn provider(&self, provider_type: &str) -> Option<&ProviderConfig> {
        self.providers
            .iter()
            .find(|p| p.provider_type == provider_type)
    }

    fn verification_time(&self) -> Duration {
        let secs = self
            .total_allowed_time_for_verification
            .unwrap_or(300)
            .clamp(60, MAX_VERIFICATION_TIME);
        Duration::from_secs(secs as u64)
    }

    fn max_failures(&self, settings: &TwoFactorSettings) -> u32 {
        match self.max_verification_failures_before_user_lockout {
            Some(n) if n > 0 => u32::try_from(n).unwrap_or(u32::MAX),
            _ => settings.max_verification_failures,
        }
    }

    /// How long a mailed code holds: the EMAIL provider's setting, else
    /// `[mail] code_lifetime`.
    fn code_lifetime(&self, mail: &crate::mail::Mailer) -> Duration {
        self.provider(EMAIL)
            .and_then(|p| p.verification_code_lifetime)
            .filter(|secs| *secs > 0)
            .map_or(mail.code_lifetime, |secs| Duration::from_secs(secs as u64))
    }

    /// Shortest time between two mailed codes (`minVerificationCodeSendPeriod`).
    fn send_period(&self) -> Duration {
        Duration::from_secs(self.min_verification_code_send_period.unwrap_or(30).max(0) as u64)
    }

    /// Refuses what keygate cannot honour, with the reason; EMAIL only when
    /// mail is configured.
    fn check(&self, mail: bool) -> Result<(), ApiError> {
        for provider in &self.providers {
            provider.check(mail)?;
        }
        if let Some(time) = self.total_allowed_time_for_verification
            && !(60..=MAX_VERIFICATION_TIME).contains(&time)
        {
            return Err(ApiError::bad_request(format!(
                "totalAllowedTimeForVerification must be from 60 to {MAX_VERIFICATION_TIME} seconds"
            )));
        }
        if self
            .max_verification_failures_before_user_lockout
            .is_some_and(|n| n < 0)
        {
            return Err(ApiError::bad_request(
                "maxVerificationFailuresBeforeUserLockout must be positive",
            ));
        }
        if self.enforce_two_fa {
            self.check_enforcement()?;
        }
        Ok(())
    }

    /// Enforcing needs a provider that stands alone and whom to enforce it for.
    fn check_enforcement(&self) -> Result<(), ApiError> {
        if !self
            .providers
            .iter()
            .any(|p| second_factor::stands_alone(&p.provider_type))
        {
            return Err(ApiError::bad_request(
                "At least one 2FA provider is required if enforcing is enabled",
            ));
        }
        match &self.enforced_users_filter {
            None => Err(ApiError::bad_request(
                "Users filter to enforce 2FA for is required",
            )),
            Some(EnforcedUsers::TenantAdministrators {
                tenant_profiles_ids: Some(profiles),
                ..
            }) if !profiles.is_empty() => Err(ApiError::bad_request(
                "tenantProfilesIds is not supported: keygate does not know tenant profiles; list tenantsIds",
            )),
            Some(_) => Ok(()),
        }
    }

    /// When a second factor is due under these settings (decided by
    /// [`second_factor::Policy`]).
    fn policy(&self) -> Policy {
        let enforced = self
            .enforce_two_fa
            .then(|| self.enforced_users_filter.clone())
            .flatten();
        Policy::new(
            self.providers.iter().map(|p| p.provider_type.clone()),
            enforced,
        )
    }
}

/// A config a user submits (`POST /api/2fa/account/config`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountConfigRequest {
    pub provider_type: String,
    #[serde(default)]
    pub use_by_default: bool,
    /// TOTP: the URL `generate` answered.
    #[serde(default)]
    pub auth_url: Option<String>,
    /// BACKUP_CODE: the codes `generate` answered.
    #[serde(default)]
    pub codes: Option<Vec<String>>,
    /// EMAIL: the address `generate` answered (the user's own).
    #[serde(default)]
    pub email: Option<String>,
}

/// `PUT /api/2fa/account/config`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountConfigUpdate {
    pub use_by_default: bool,
}

/// A login's answer when a second factor is due: to answer
/// (`PRE_VERIFICATION_TOKEN`), or, enforced, to configure first
/// (`MFA_CONFIGURATION_TOKEN`). `refreshToken` is there, and null: the
/// platform's Python client reads the key unconditionally.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreVerificationToken {
    /// Opens the `/api/auth/2fa/...` endpoints only (pre-verification), or
    /// configuring a second factor and `/api/auth/2fa/login` only (MFA
    /// configuration).
    pub token: String,
    /// Always null: no refresh before the second factor.
    pub refresh_token: Option<String>,
    /// `PRE_VERIFICATION_TOKEN` or `MFA_CONFIGURATION_TOKEN`.
    pub scope: String,
}

// --- shared --------------------------------------------------------------------

impl Endpoints {
    /// The platform settings in force: saved by a SYS_ADMIN, else `[two_factor]`.
    async fn platform_two_fa(&self) -> Result<PlatformTwoFaSettings, ApiError> {
        let mut settings = match self.store.setting(PLATFORM_SETTINGS).await? {
            Some(text) => serde_json::from_str(&text).map_err(|error| {
                tracing::error!(%error, "stored two-factor settings do not parse");
                ApiError::internal()
            })?,
            None => PlatformTwoFaSettings::from_config(
                &self.settings.two_factor,
                self.mail.as_ref().map(|m| m.code_lifetime),
            ),
        };
        // Saved while mail was configured: without mail EMAIL cannot work.
        if self.mail.is_none() {
            settings.providers.retain(|p| p.provider_type != EMAIL);
        }
        Ok(settings)
    }

    /// Mails `user` a new 6-digit code for `purpose` at `email`, replacing
    /// the one sent before; at most one per `minVerificationCodeSendPeriod`.
    /// Only the code's keyed digest is kept.
    async fn mail_code(
        &self,
        user: &UserRecord,
        email: &str,
        purpose: CodeFor,
        platform: &PlatformTwoFaSettings,
    ) -> Result<(), ApiError> {
        let mailer = self.mail.as_ref().ok_or_else(not_configured)?;
        let key = (user.id, purpose);
        let period = platform.send_period();
        if let Some(previous) = self.two_factor.codes.get(&key)
            && previous.sent.elapsed() < period
        {
            let wait = period.saturating_sub(previous.sent.elapsed());
            self.metrics.rate_limited("email_code");
            return Err(ApiError {
                message: "Too many verification code requests: wait before asking again".into(),
                ..ApiError::too_many_requests(wait.as_secs().max(1))
            });
        }
        let code = email_code()?;
        let lifetime = platform.code_lifetime(mailer);
        self.two_factor.codes.insert(
            key,
            SentCode {
                digest: self.two_factor.sealer.code_digest(user.id, &code),
                sent: std::time::Instant::now(),
                lifetime,
            },
        );
        let seconds = lifetime.as_secs().to_string();
        mailer.send(
            crate::mail::MailKind::Code,
            email,
            &[("code", &code), ("expirationTimeSeconds", &seconds)],
        );
        tracing::info!(target: "keygate::security", user_id = %user.id, "e-mail verification code sent");
        Ok(())
    }

    /// `code`, the unexpired code last mailed to `user` for `purpose`: a
    /// right code is used up.
    fn take_code(&self, user: &UserRecord, code: &str, purpose: CodeFor) -> Option<Verified> {
        let sealer = &self.two_factor.sealer;
        second_factor::check_mailed_code(
            &self.two_factor.codes,
            (user.id, purpose),
            sealer,
            user,
            code,
        )
    }

    /// The user's providers that count ([`Policy::counting`]).
    async fn active_two_factors(
        &self,
        user_id: Uuid,
        platform: &PlatformTwoFaSettings,
    ) -> Result<Vec<TwoFactorRecord>, ApiError> {
        second_factor::active(&self.store, &platform.policy(), user_id).await
    }

    /// The second-factor gate for `user` under the settings in force
    /// ([`Gate::check`]): cleared for a token pair, or the login's answer
    /// while a second factor is due: a pre-verification token for a user
    /// with a provider, an MFA configuration token for a user without one
    /// whom the settings make configure one.
    pub(super) async fn gate(
        &self,
        user: &UserRecord,
    ) -> Result<Result<Cleared, PreVerificationToken>, ApiError> {
        let platform = self.platform_two_fa().await?;
        let pending = match Gate::check(&self.store, &platform.policy(), user).await? {
            Ok(cleared) => return Ok(Ok(cleared)),
            Err(pending) => pending,
        };
        let scope = pending.scope();
        let signed = self
            .auth
            .token_keys()
            .sign_second_factor(
                user,
                scope,
                Uuid::new_v4(),
                crate::clock::now_secs(),
                platform.verification_time(),
            )
            .map_err(|_| ApiError::internal())?;
        Ok(Err(PreVerificationToken {
            token: signed.token,
            refresh_token: None,
            scope: scope.to_string(),
        }))
    }
}

/// `AccountTwoFaSettings`: the configs, never a secret.
fn account_settings(records: &[TwoFactorRecord]) -> Value {
    let configs: serde_json::Map<String, Value> = records
        .iter()
        .map(|record| {
            let mut config = json!({
                "providerType": record.provider,
                "useByDefault": record.use_by_default,
            });
            if record.provider == BACKUP_CODE {
                config["codesLeft"] = json!(second_factor::code_digests(&record.secret).len());
            }
            (record.provider.clone(), config)
        })
        .collect();
    json!({ "configs": configs })
}

/// A 6-digit code, uniformly drawn.
fn email_code() -> Result<String, ApiError> {
    loop {
        let bytes: [u8; 4] =
            crate::auth::api_key::random_bytes().map_err(|_| ApiError::internal())?;
        let n = u32::from_le_bytes(bytes);
        // Below the largest multiple of a million: no digit is likelier.
        if n < 4_294_000_000 {
            return Ok(format!("{:06}", n % 1_000_000));
        }
    }
}

/// `providerType` from the query: a known provider, else a 400.
fn provider_param(req: &EndpointRequest) -> Result<&'static str, ApiError> {
    let pairs = query_pairs(req.query.as_deref());
    match param(&pairs, "providerType") {
        Some(TOTP) => Ok(TOTP),
        Some(BACKUP_CODE) => Ok(BACKUP_CODE),
        Some(EMAIL) => Ok(EMAIL),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid providerType: {other}"
        ))),
        None => Err(ApiError::bad_request(
            "Required request parameter 'providerType' is not present",
        )),
    }
}

fn provider_name(text: &str) -> Result<&'static str, ApiError> {
    match text {
        TOTP => Ok(TOTP),
        BACKUP_CODE => Ok(BACKUP_CODE),
        EMAIL => Ok(EMAIL),
        other => Err(ApiError::bad_request(format!(
            "Invalid providerType: {other}"
        ))),
    }
}

fn not_configured() -> ApiError {
    ApiError::bad_request("2FA provider is not configured")
}

fn random_code() -> Result<String, ApiError> {
    let bytes: [u8; BACKUP_CODE_LEN] =
        crate::auth::api_key::random_bytes().map_err(|_| ApiError::internal())?;
    Ok(bytes
        .iter()
        .map(|b| char::from(BACKUP_CODE_ALPHABET[usize::from(b & 0x0f)]))
        .collect())
}

fn audited_by_user(store: &Store, user: &UserRecord, action: &'static str) -> Store {
    store.audited(Audit::by_user(user.id, user.tenant_id, &user.email, action))
}

fn same(a: &str, b: &str) -> bool {
    aws_lc_rs::constant_time::verify_slices_are_equal(a.as_bytes(), b.as_bytes()).is_ok()
}

// --- configuring (any authenticated user, for themselves) -----------------------

/// Who configures a second factor: a signed-in user, or a login holding an
/// MFA configuration token (a second factor is enforced for the user, who
/// has none yet).
enum Configurer<'r> {
    SignedIn(&'r Identity),
    Enforced(Box<UserRecord>),
}

impl Configurer<'_> {
    fn user_id(&self) -> Uuid {
        match self {
            Configurer::SignedIn(identity) => identity.principal.user_id,
            Configurer::Enforced(user) => user.id,
        }
    }

    fn email(&self) -> &str {
        match self {
            Configurer::SignedIn(identity) => &identity.principal.email,
            Configurer::Enforced(user) => &user.email,
        }
    }

    /// The session that makes the change, if it is one (not an API key or
    /// an MFA configuration token): it goes on when the others end.
    fn session_id(&self) -> Option<Uuid> {
        match self {
            Configurer::SignedIn(identity) => identity.session_id(),
            Configurer::Enforced(_) => None,
        }
    }

    fn audited(&self, store: &Store, action: &'static str) -> Store {
        match self {
            Configurer::SignedIn(identity) => super::access::audited(store, identity, action),
            Configurer::Enforced(user) => audited_by_user(store, user, action),
        }
    }
}

/// The configurer of an [`super::Access::Configuring`] route: the verified
/// identity, else the holder of a valid MFA configuration token.
async fn configurer<'r>(
    api: &Endpoints,
    req: &'r EndpointRequest,
) -> Result<Configurer<'r>, ApiError> {
    if let Some(identity) = &req.identity {
        return Ok(Configurer::SignedIn(identity));
    }
    let (_, user) = waiting_login(api, req, MFA_CONFIGURATION_SCOPE).await?;
    Ok(Configurer::Enforced(Box::new(user)))
}

#[utoipa::path(
    get,
    path = "/api/2fa/providers",
    tag = "two-factor-auth-config-controller",
    operation_id = "getAvailableTwoFaProviderTypes",
    summary = "The second-factor providers a user may configure",
    responses(
        (status = 200, description = "Provider types", body = Vec<String>),
        CredentialErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn providers(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    configurer(api, &req).await?;
    let platform = api.platform_two_fa().await?;
    let types: Vec<&str> = platform
        .providers
        .iter()
        .map(|p| p.provider_type.as_str())
        .collect();
    Ok(json_response(&types))
}

#[utoipa::path(
    post,
    path = "/api/2fa/account/config/generate",
    tag = "two-factor-auth-config-controller",
    operation_id = "generateTwoFaAccountConfig",
    summary = "Generate a TOTP secret or backup codes; shown this once",
    params(("providerType" = String, Query, description = "TOTP, BACKUP_CODE or EMAIL")),
    responses(
        (status = 200, description = "The new config, with its secret", body = Object),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn generate(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let configurer = configurer(api, &req).await?;
    let provider = provider_param(&req)?;
    let platform = api.platform_two_fa().await?;
    let config = platform.provider(provider).ok_or_else(not_configured)?;
    let user_id = configurer.user_id();
    let answer = match provider {
        TOTP => {
            let secret: [u8; totp::SECRET_BYTES] =
                crate::auth::api_key::random_bytes().map_err(|_| ApiError::internal())?;
            let secret = totp::base32_encode(&secret);
            let issuer = config
                .issuer_name
                .clone()
                .unwrap_or_else(|| api.settings.two_factor.issuer_name.clone());
            let url = totp::auth_url(&issuer, configurer.email(), &secret);
            api.two_factor
                .pending
                .insert((user_id, TOTP), Generated::Totp(secret));
            json!({"providerType": TOTP, "useByDefault": false, "authUrl": url})
        }
        EMAIL => {
            // Codes go to the account's own address, never one the client names.
            let email = configurer.email().to_owned();
            api.two_factor
                .pending
                .insert((user_id, EMAIL), Generated::Email(email.clone()));
            json!({"providerType": EMAIL, "useByDefault": false, "email": email})
        }
        _ => {
            let quantity = config.codes_quantity.unwrap_or(10).clamp(1, 100) as usize;
            let mut codes: Vec<String> = Vec::with_capacity(quantity);
            while codes.len() < quantity {
                let code = random_code()?;
                if !codes.contains(&code) {
                    codes.push(code);
                }
            }
            api.two_factor
                .pending
                .insert((user_id, BACKUP_CODE), Generated::Codes(codes.clone()));
            json!({"providerType": BACKUP_CODE, "useByDefault": false, "codes": codes})
        }
    };
    Ok(json_response(&answer))
}

#[utoipa::path(
    post,
    path = "/api/2fa/account/config",
    tag = "two-factor-auth-config-controller",
    operation_id = "verifyAndSaveTwoFaAccountConfig",
    summary = "Save the config generated moments before, after checking a current code",
    params(("verificationCode" = Option<String>, Query, description = "A current TOTP code; none for backup codes")),
    request_body = AccountConfigRequest,
    responses(
        (status = 200, description = "The account's two-factor settings", body = Object),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn save(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let configurer = configurer(api, &req).await?;
    let body: AccountConfigRequest = req.json()?;
    let provider = provider_name(&body.provider_type)?;
    let platform = api.platform_two_fa().await?;
    platform.provider(provider).ok_or_else(not_configured)?;
    let user = api
        .store
        .user_by_id(configurer.user_id())
        .await?
        .ok_or_else(ApiError::not_active)?;
    let active = api.active_two_factors(user.id, &platform).await?;
    if api
        .store
        .two_factors(user.id)
        .await?
        .iter()
        .any(|r| r.provider == provider)
    {
        return Err(ApiError::bad_request("2FA provider is already configured"));
    }
    let submitted = Submitted {
        api,
        req: &req,
        body: &body,
        user: &user,
    };
    let record = submitted.checked_record(provider, &active).await?;
    // Every other session of the user ends: one from before the change
    // cannot go on refreshing as though nothing happened.
    let added = configurer
        .audited(&api.store, "two_factor.configure")
        .add_two_factor(
            user.id,
            &record,
            crate::clock::now_ms(),
            configurer.session_id(),
        )
        .await?;
    if !api.applied(added).await {
        return Err(ApiError::bad_request("2FA provider is already configured"));
    }
    api.two_factor.pending.invalidate(&(user.id, provider));
    tracing::info!(target: "keygate::security", user_id = %user.id, provider, "second factor configured; the user's other sessions ended");
    let records = api.active_two_factors(user.id, &platform).await?;
    Ok(json_response(&account_settings(&records)))
}

/// A config a user submitted to save, with what it is checked against.
struct Submitted<'a> {
    api: &'a Endpoints,
    req: &'a EndpointRequest,
    body: &'a AccountConfigRequest,
    user: &'a UserRecord,
}

impl Submitted<'_> {
    /// The record to save: the config keygate generated for this user
    /// moments before, proved by a current code where the provider has one.
    async fn checked_record(
        &self,
        provider: &'static str,
        active: &[TwoFactorRecord],
    ) -> Result<TwoFactorRecord, ApiError> {
        let generated = self.api.two_factor.pending.get(&(self.user.id, provider));
        match (provider, generated) {
            (TOTP, Some(Generated::Totp(secret))) => self.totp_record(&secret).await,
            (EMAIL, Some(Generated::Email(email))) => self.email_record(email).await,
            (BACKUP_CODE, Some(Generated::Codes(codes))) => self.codes_record(&codes, active),
            _ => Err(not_generated(self.user.id, provider)),
        }
    }

    /// The `verificationCode` of the query, or an empty one.
    fn code(&self) -> String {
        let pairs = query_pairs(self.req.query.as_deref());
        param(&pairs, "verificationCode")
            .unwrap_or_default()
            .to_string()
    }

    fn wrong_code(&self) -> ApiError {
        tracing::info!(target: "keygate::security", user_id = %self.user.id, client = %self.req.client_ip, "second factor not saved: wrong verification code");
        ApiError::bad_request("Verification code is incorrect")
    }

    async fn totp_record(&self, secret: &str) -> Result<TwoFactorRecord, ApiError> {
        let (api, user) = (self.api, self.user);
        let submitted = self
            .body
            .auth_url
            .as_deref()
            .and_then(totp::secret_of_url)
            .unwrap_or_default();
        if !same(submitted, secret) {
            return Err(not_generated(user.id, TOTP));
        }
        let code = self.code();
        let attempt = api.code_attempt(&user.email, self.req).await?;
        let raw = totp::base32_decode(secret).ok_or_else(ApiError::internal)?;
        let Some(step) = totp::matching_step(&raw, &code, crate::clock::now_secs()) else {
            return Err(self.wrong_code());
        };
        api.limiter.released(attempt).await;
        Ok(TwoFactorRecord {
            provider: TOTP.into(),
            use_by_default: self.body.use_by_default,
            secret: api
                .two_factor
                .sealer
                .seal(user.id, TOTP, &raw)
                .map_err(|_| ApiError::internal())?,
            // The code that proved the secret cannot log in too.
            last_step: step,
        })
    }

    async fn email_record(&self, email: String) -> Result<TwoFactorRecord, ApiError> {
        let (api, user) = (self.api, self.user);
        if !same_address(self.body.email.as_deref(), &email) {
            return Err(not_generated(user.id, EMAIL));
        }
        let code = self.code();
        let attempt = api.code_attempt(&user.email, self.req).await?;
        if api.take_code(user, code.trim(), CodeFor::Config).is_none() {
            return Err(self.wrong_code());
        }
        api.limiter.released(attempt).await;
        Ok(TwoFactorRecord {
            provider: EMAIL.into(),
            use_by_default: self.body.use_by_default,
            secret: email,
            last_step: 0,
        })
    }

    /// Backup codes: only beside a provider that counts on its own.
    fn codes_record(
        &self,
        codes: &[String],
        active: &[TwoFactorRecord],
    ) -> Result<TwoFactorRecord, ApiError> {
        if active.is_empty() {
            return Err(ApiError::bad_request(
                "To use 2FA backup codes you first need to configure at least one provider",
            ));
        }
        let mut submitted = self.body.codes.clone().unwrap_or_default();
        submitted.sort();
        let mut generated = codes.to_vec();
        generated.sort();
        if submitted != generated {
            return Err(not_generated(self.user.id, BACKUP_CODE));
        }
        let sealer = &self.api.two_factor.sealer;
        let digests: Vec<String> = codes
            .iter()
            .map(|code| sealer.code_digest(self.user.id, code))
            .collect();
        Ok(TwoFactorRecord {
            provider: BACKUP_CODE.into(),
            use_by_default: self.body.use_by_default,
            secret: serde_json::to_string(&digests).map_err(|_| ApiError::internal())?,
            last_step: 0,
        })
    }
}

/// Whether a submitted address is the generated one (any case).
fn same_address(submitted: Option<&str>, generated: &str) -> bool {
    submitted.is_some_and(|s| s.trim().eq_ignore_ascii_case(generated))
}

#[utoipa::path(
    post,
    path = "/api/2fa/account/config/submit",
    tag = "two-factor-auth-config-controller",
    operation_id = "submitTwoFaAccountConfig",
    summary = "EMAIL: mail a code to check before saving the config; other providers need none",
    request_body = AccountConfigRequest,
    responses(
        (status = 200, description = "Code sent (EMAIL), or nothing to send"),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn submit(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let configurer = configurer(api, &req).await?;
    let body: AccountConfigRequest = req.json()?;
    let provider = provider_name(&body.provider_type)?;
    let platform = api.platform_two_fa().await?;
    platform.provider(provider).ok_or_else(not_configured)?;
    if provider != EMAIL {
        return Ok(empty_response());
    }
    let user = api
        .store
        .user_by_id(configurer.user_id())
        .await?
        .ok_or_else(ApiError::not_active)?;
    let Some(Generated::Email(email)) = api.two_factor.pending.get(&(user.id, EMAIL)) else {
        return Err(not_generated(user.id, provider));
    };
    if !same_address(body.email.as_deref(), &email) {
        return Err(not_generated(user.id, provider));
    }
    api.mail_code(&user, &email, CodeFor::Config, &platform)
        .await?;
    Ok(empty_response())
}

/// A config that is not the one keygate generated for this user: refused,
/// whatever it holds (a secret chosen by the client is never saved).
fn not_generated(user_id: Uuid, provider: &str) -> ApiError {
    tracing::warn!(target: "keygate::security", %user_id, provider, "refused a second-factor config that keygate did not generate for this user");
    ApiError::bad_request(format!(
        "This {provider} config was not generated for this account (or has expired): generate a new one"
    ))
}

#[utoipa::path(
    get,
    path = "/api/2fa/account/settings",
    tag = "two-factor-auth-config-controller",
    operation_id = "getAccountTwoFaSettings",
    summary = "The caller's configured second factors; no secret is ever shown again",
    responses(
        (status = 200, description = "Configs by provider", body = Object),
        CredentialErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn account_settings_endpoint(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let configurer = configurer(api, &req).await?;
    let platform = api.platform_two_fa().await?;
    let records = api
        .active_two_factors(configurer.user_id(), &platform)
        .await?;
    Ok(json_response(&account_settings(&records)))
}

#[utoipa::path(
    put,
    path = "/api/2fa/account/config",
    tag = "two-factor-auth-config-controller",
    operation_id = "updateTwoFaAccountConfig",
    summary = "Make a configured provider the default, or not",
    params(("providerType" = String, Query, description = "TOTP, BACKUP_CODE or EMAIL")),
    request_body = AccountConfigUpdate,
    responses(
        (status = 200, description = "The account's two-factor settings", body = Object),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn update(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let provider = provider_param(&req)?;
    let body: AccountConfigUpdate = req.json()?;
    let user_id = identity.principal.user_id;
    let found = super::access::audited(&api.store, identity, "two_factor.update")
        .set_two_factor_default(user_id, provider, body.use_by_default)
        .await?;
    if !found {
        return Err(ApiError::bad_request(format!(
            "Config for {provider} 2FA provider not found"
        )));
    }
    let platform = api.platform_two_fa().await?;
    let records = api.active_two_factors(user_id, &platform).await?;
    Ok(json_response(&account_settings(&records)))
}

#[utoipa::path(
    delete,
    path = "/api/2fa/account/config",
    tag = "two-factor-auth-config-controller",
    operation_id = "deleteTwoFaAccountConfig",
    summary = "Remove a provider; backup codes go with the last other one",
    params(("providerType" = String, Query, description = "TOTP, BACKUP_CODE or EMAIL")),
    responses(
        (status = 200, description = "The account's two-factor settings", body = Object),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn delete(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let provider = provider_param(&req)?;
    let user_id = identity.principal.user_id;
    let platform = api.platform_two_fa().await?;
    let policy = platform.policy();
    // The providers are looked up only when a second factor is enforced.
    if let Some(user) = api.store.user_by_id(user_id).await?
        && policy.enforced_for(&user)
        && !policy.may_remove(
            &user,
            &api.active_two_factors(user_id, &platform).await?,
            provider,
        )
    {
        return Err(ApiError::bad_request(
            "At least one 2FA provider is required",
        ));
    }
    // Backup codes go with the last other provider; every other session of
    // the user ends, as when one is configured.
    let removed = super::access::audited(&api.store, identity, "two_factor.remove")
        .remove_second_factor(
            user_id,
            provider,
            crate::clock::now_ms(),
            identity.session_id(),
        )
        .await?;
    if !api.applied(removed).await {
        return Err(ApiError::bad_request("2FA not configured"));
    }
    tracing::info!(target: "keygate::security", %user_id, provider, "second factor removed; the user's other sessions ended");
    let records = api.active_two_factors(user_id, &platform).await?;
    Ok(json_response(&account_settings(&records)))
}

// --- platform settings (SYS_ADMIN) ------------------------------------------------

fn require_sys_admin(identity: &Identity) -> Result<(), ApiError> {
    if identity.principal.authority == Authority::SysAdmin {
        Ok(())
    } else {
        Err(ApiError::permission_denied())
    }
}

#[utoipa::path(
    get,
    path = "/api/2fa/settings",
    tag = "two-factor-auth-config-controller",
    operation_id = "getPlatformTwoFaSettings",
    summary = "The platform's two-factor settings (SYS_ADMIN)",
    responses(
        (status = 200, description = "Settings", body = PlatformTwoFaSettings),
        CredentialErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn platform_settings(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    require_sys_admin(req.identity()?)?;
    Ok(json_response(&api.platform_two_fa().await?))
}

#[utoipa::path(
    post,
    path = "/api/2fa/settings",
    tag = "two-factor-auth-config-controller",
    operation_id = "savePlatformTwoFaSettings",
    summary = "Save the platform's two-factor settings (SYS_ADMIN)",
    request_body = PlatformTwoFaSettings,
    responses(
        (status = 200, description = "Settings as saved", body = PlatformTwoFaSettings),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn save_platform_settings(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    require_sys_admin(identity)?;
    let settings: PlatformTwoFaSettings = req.json()?;
    settings.check(api.mail.is_some())?;
    let text = serde_json::to_string(&settings).map_err(|_| ApiError::internal())?;
    api.store.put_setting(PLATFORM_SETTINGS, &text).await?;
    tracing::info!(target: "keygate::security", user_id = %identity.principal.user_id, settings = %text, "platform two-factor settings saved");
    Ok(json_response(&settings))
}

// --- logging in with a pre-verification token ---------------------------------------

/// The user and login attempt of a valid pre-verification token. Any other
/// token, an expired one, one of a disabled, locked or outdated user, and
/// one whose attempt ended (used, or too many wrong codes) is a 401.
async fn pre_verified(
    api: &Endpoints,
    req: &EndpointRequest,
) -> Result<(AccessClaims, UserRecord), ApiError> {
    waiting_login(api, req, PRE_VERIFICATION_SCOPE).await
}

/// The user and login attempt of a valid token of `scope`, a login waiting
/// for its second factor: as [`pre_verified`].
async fn waiting_login(
    api: &Endpoints,
    req: &EndpointRequest,
    scope: &'static str,
) -> Result<(AccessClaims, UserRecord), ApiError> {
    let token = req
        .bearer
        .as_ref()
        .ok_or_else(ApiError::authentication_failed)?;
    let keys = api.auth.token_keys();
    let verified = if scope == MFA_CONFIGURATION_SCOPE {
        keys.verify_mfa_configuration(token.expose())
    } else {
        keys.verify_pre_verification(token.expose())
    };
    let claims = verified.map_err(|error| match error {
        TokenError::Expired | TokenError::BadSignature => ApiError::token_expired(),
        TokenError::Malformed | TokenError::WrongScope | TokenError::SecondFactorPending => {
            ApiError::invalid_credentials()
        }
    })?;
    let platform = api.platform_two_fa().await?;
    let max = platform.max_failures(&api.settings.two_factor);
    if api
        .two_factor
        .failures
        .get(&claims.session_id)
        .is_some_and(|n| n >= max)
    {
        return Err(attempt_ended());
    }
    let user = api
        .store
        .user_by_id(claims.user_id)
        .await?
        .ok_or_else(ApiError::token_expired)?;
    if claims.iat < user.tokens_valid_after {
        return Err(ApiError::token_expired());
    }
    if api.store.is_locked(user.id).await? {
        return Err(ApiError::locked());
    }
    if !user.enabled {
        return Err(ApiError::not_active());
    }
    Ok((claims, user))
}

fn attempt_ended() -> ApiError {
    ApiError::with_message(
        http::StatusCode::UNAUTHORIZED,
        code::AUTHENTICATION,
        "This login attempt has ended: log in again",
    )
}

#[utoipa::path(
    get,
    path = "/api/auth/2fa/providers",
    tag = "two-factor-auth-controller",
    operation_id = "getAvailableTwoFaProviderInfos",
    summary = "The second factors the logging-in user may answer with (pre-verification token)",
    responses(
        (status = 200, description = "Provider infos", body = Vec<Object>),
        CredentialErrors
    ),
    security(("HttpLoginForm" = []))
)]
pub async fn login_providers(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let (_, user) = pre_verified(api, &req).await?;
    let platform = api.platform_two_fa().await?;
    let infos: Vec<Value> = api
        .active_two_factors(user.id, &platform)
        .await?
        .iter()
        .map(|record| {
            json!({
                "type": record.provider,
                "default": record.use_by_default,
                "contact": (record.provider == EMAIL).then(|| crate::mail::redact(&record.secret)),
                "minVerificationCodeSendPeriod": platform.min_verification_code_send_period,
            })
        })
        .collect();
    Ok(json_response(&infos))
}

#[utoipa::path(
    post,
    path = "/api/auth/2fa/verification/send",
    tag = "two-factor-auth-controller",
    operation_id = "requestTwoFaVerificationCode",
    summary = "EMAIL: mail a code (at most one per minVerificationCodeSendPeriod); TOTP and backup codes need none (pre-verification token)",
    params(("providerType" = String, Query, description = "TOTP, BACKUP_CODE or EMAIL")),
    responses(
        (status = 200, description = "Nothing to send for these providers"),
        BodyErrors
    ),
    security(("HttpLoginForm" = []))
)]
pub async fn send_code(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let (_, user) = pre_verified(api, &req).await?;
    let provider = provider_param(&req)?;
    let platform = api.platform_two_fa().await?;
    let Some(record) = api
        .active_two_factors(user.id, &platform)
        .await?
        .into_iter()
        .find(|r| r.provider == provider)
    else {
        return Err(ApiError::bad_request("2FA is not configured for account"));
    };
    if provider == EMAIL {
        api.mail_code(&user, &record.secret, CodeFor::Login, &platform)
            .await?;
        audited_by_user(&api.store, &user, "two_factor.code_sent")
            .record_user_event(user.id)
            .await?;
    }
    Ok(empty_response())
}

#[utoipa::path(
    post,
    path = "/api/auth/2fa/verification/check",
    tag = "two-factor-auth-controller",
    operation_id = "checkTwoFaVerificationCode",
    summary = "Check a code for the token pair (pre-verification token)",
    params(
        ("providerType" = String, Query, description = "TOTP, BACKUP_CODE or EMAIL"),
        ("verificationCode" = String, Query, description = "The code")
    ),
    responses(
        (status = 200, description = "Token pair; `codesLeft` after a backup code", body = Object),
        LoginErrors
    ),
    security(("HttpLoginForm" = []))
)]
pub async fn check_code(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let (claims, user) = pre_verified(api, &req).await?;
    let provider = provider_param(&req)?;
    let pairs = query_pairs(req.query.as_deref());
    let code = param(&pairs, "verificationCode")
        .ok_or_else(|| {
            ApiError::bad_request("Required request parameter 'verificationCode' is not present")
        })?
        .trim()
        .to_string();
    let platform = api.platform_two_fa().await?;
    let record = api
        .active_two_factors(user.id, &platform)
        .await?
        .into_iter()
        .find(|r| r.provider == provider)
        .ok_or_else(|| ApiError::bad_request("2FA is not configured for account"))?;
    // The slot is taken before the code is checked: parallel guesses cannot
    // overrun the limit. Codes count in windows of their own, which a right
    // password never clears: logging in again buys no fresh guesses.
    let attempt = api.code_attempt(&user.email, &req).await?;
    let Some(verified) = verified_code(api, &user, &record, &code).await? else {
        return Err(wrong_code(api, &claims, &user, provider, &platform, &req));
    };
    // The login is complete: the only thing that clears the code windows
    // of this account and address.
    api.limiter.completed_with_second_factor(attempt).await;
    // The attempt is over: this token opens nothing more.
    api.two_factor.failures.insert(claims.session_id, u32::MAX);
    let codes_left = verified.codes_left();
    let pair = api.issue_pair(Gate::passed(verified)).await?;
    api.metrics.login("success");
    tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, provider, "login succeeded with a second factor");
    let mut answer = json!({"token": pair.token, "refreshToken": pair.refresh_token});
    if let Some(left) = codes_left {
        answer["codesLeft"] = json!(left);
    }
    Ok(json_response(&answer))
}

/// `code` checked against the provider of `record`: `None` when wrong (or
/// used before).
async fn verified_code(
    api: &Endpoints,
    user: &UserRecord,
    record: &TwoFactorRecord,
    code: &str,
) -> Result<Option<Verified>, ApiError> {
    let (store, sealer) = (&api.store, &api.two_factor.sealer);
    match record.provider.as_str() {
        TOTP => second_factor::check_totp(store, sealer, user, record, code).await,
        EMAIL => {
            let Some(verified) = api.take_code(user, code, CodeFor::Login) else {
                return Ok(None);
            };
            audited_by_user(store, user, "two_factor.use")
                .record_user_event(user.id)
                .await?;
            Ok(Some(verified))
        }
        _ => second_factor::check_backup_code(store, sealer, user, record, code).await,
    }
}

#[utoipa::path(
    post,
    path = "/api/auth/2fa/login",
    tag = "two-factor-auth-controller",
    operation_id = "authenticateByTwoFaConfigurationToken",
    summary = "The token pair once a second factor is configured (MFA configuration token)",
    responses(
        (status = 200, description = "Token pair", body = Object),
        LoginErrors
    ),
    security(("HttpLoginForm" = []))
)]
pub async fn configured_login(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let (claims, user) = waiting_login(api, &req, MFA_CONFIGURATION_SCOPE).await?;
    let platform = api.platform_two_fa().await?;
    let Some(cleared) = Gate::configured(&api.store, &platform.policy(), &user).await? else {
        tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "no token pair: the enforced second factor is not configured yet");
        return Err(ApiError::bad_request("2FA is not configured"));
    };
    // The attempt is over: this token opens nothing more.
    api.two_factor.failures.insert(claims.session_id, u32::MAX);
    let pair = api.issue_pair(cleared).await?;
    api.metrics.login("success");
    tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "login succeeded after configuring an enforced second factor");
    Ok(json_response(&pair))
}

/// A wrong code: counted against the attempt, which ends at the limit.
fn wrong_code(
    api: &Endpoints,
    claims: &AccessClaims,
    user: &UserRecord,
    provider: &str,
    platform: &PlatformTwoFaSettings,
    req: &EndpointRequest,
) -> ApiError {
    let failures = api
        .two_factor
        .failures
        .get(&claims.session_id)
        .unwrap_or(0)
        .saturating_add(1);
    api.two_factor.failures.insert(claims.session_id, failures);
    api.metrics.login("bad_second_factor");
    let max = platform.max_failures(&api.settings.two_factor);
    if failures >= max {
        tracing::warn!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, provider, failures, "login attempt ended after wrong second-factor codes");
        return attempt_ended();
    }
    tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, provider, failures, "wrong second-factor code");
    ApiError::bad_request("Verification code is incorrect")
}
