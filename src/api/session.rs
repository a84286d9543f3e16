//! Session endpoints: login, refresh, logout, current user, password change.

use uuid::Uuid;

use super::records::User;
use super::two_factor::PreVerificationToken;
use super::wire::{
    BodyErrors, ChangePasswordRequest, CredentialErrors, JwtPair, LoginErrors, LoginRequest,
    PublicLoginRequest, RefreshErrors, RefreshTokenRequest, TokenErrors,
};
use super::{EndpointRequest, Endpoints, empty_response, json_response};
use crate::auth::jwt::TokenError;
use crate::auth::limiter::{Attempt, Limited};
use crate::auth::password;
use crate::auth::second_factor::{Cleared, Gate};
use crate::body::Body;
use crate::error::ApiError;
use crate::identity::AuthMethod;
use crate::store::{PublicCustomer, SessionRecord, UserRecord};

/// Which allowance a password hash is computed on: logins have their own, so
/// password changes and activations can never starve them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HashFor {
    Login,
    Other,
}

impl Endpoints {
    async fn hashing_permit(
        &self,
        purpose: HashFor,
        deadline: tokio::time::Instant,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        let (pool, label) = match purpose {
            HashFor::Login => (&self.hashing.login, "login"),
            HashFor::Other => (&self.hashing.other, "other"),
        };
        // Waiting is bounded: under a login storm on a busy machine (hashing
        // runs below proxying in priority) a request is refused rather than
        // queued without end.
        let permit = match tokio::time::timeout_at(deadline, pool.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(ApiError::unavailable()),
            Err(_) => {
                tracing::warn!(purpose = label, waited = ?self.hashing.wait, "no turn to hash a password in time");
                self.metrics.password_hash_refused(label);
                return Err(ApiError::unavailable());
            }
        };
        self.metrics.password_hash(label);
        Ok(permit)
    }

    /// Verifies `user`'s password on the hashing threads, within `purpose`'s
    /// allowance and the account's turn ([`crate::auth::password::Turns`]:
    /// a second check of the same account waits for the first to end, both
    /// waits within `login.hash_wait`). `None` (unknown user) verifies
    /// against a dummy hash so both cost the same. A stored bcrypt hash above
    /// `login.max_bcrypt_cost` is a mismatch, found without running it.
    pub(super) async fn verify_password(
        &self,
        purpose: HashFor,
        password: &str,
        user: Option<&UserRecord>,
    ) -> Result<bool, ApiError> {
        let stored = user.map(|u| u.password_hash.as_str());
        if let (Some(user), Some(stored)) = (user, stored)
            && password::over_cost_cap(stored, self.hashing.max_bcrypt_cost)
        {
            tracing::warn!(
                target: "keygate::security",
                user_id = %user.id,
                cost = password::bcrypt_cost(stored),
                max_bcrypt_cost = self.hashing.max_bcrypt_cost,
                "refused a password check against a bcrypt hash above login.max_bcrypt_cost without running it; set a new password for this user"
            );
            return Ok(false);
        }
        let deadline = tokio::time::Instant::now() + self.hashing.wait;
        let _turn = match user {
            Some(user) => Some(self.account_turn(purpose, user.id, deadline).await?),
            None => None,
        };
        let _permit = self.hashing_permit(purpose, deadline).await?;
        // A user who has not activated yet has no hash: same cost as unknown.
        let stored = stored.filter(|h| !h.is_empty());
        let hash = stored.unwrap_or(&self.dummy_hash).to_string();
        let ok = self
            .hashing
            .threads
            .verify(password.to_string(), hash)
            .await
            .map_err(|_| ApiError::internal())?;
        Ok(ok && stored.is_some())
    }

    /// The account's turn to have its password checked, by `deadline`.
    async fn account_turn(
        &self,
        purpose: HashFor,
        account: Uuid,
        deadline: tokio::time::Instant,
    ) -> Result<crate::auth::password::Turn<'_>, ApiError> {
        match tokio::time::timeout_at(deadline, self.hashing.turns.take(account)).await {
            Ok(turn) => Ok(turn),
            Err(_) => {
                let label = match purpose {
                    HashFor::Login => "login",
                    HashFor::Other => "other",
                };
                tracing::warn!(target: "keygate::security", user_id = %account, waited = ?self.hashing.wait, "another check of this account's password ran all the time this one could wait");
                self.metrics.password_hash_refused(label);
                Err(ApiError::unavailable())
            }
        }
    }

    pub(super) async fn hash_password(
        &self,
        purpose: HashFor,
        password: &str,
    ) -> Result<String, ApiError> {
        let deadline = tokio::time::Instant::now() + self.hashing.wait;
        let _permit = self.hashing_permit(purpose, deadline).await?;
        self.hashing
            .threads
            .hash(password.to_string())
            .await
            .map_err(|_| ApiError::internal())
    }

    /// Opens a session and signs its first token pair, for a user the
    /// second-factor gate cleared ([`crate::auth::second_factor`]): no
    /// other way opens one.
    pub(super) async fn issue_pair(&self, cleared: Cleared) -> Result<JwtPair, ApiError> {
        let user = cleared.user();
        let session =
            SessionRecord::open(user.id, crate::clock::now_ms(), Uuid::new_v4().to_string());
        self.store.insert_session(&session).await?;
        self.sign_pair(user, session.id, &session.refresh_jti)
    }

    /// Signs a pair of an open session: its first ([`Self::issue_pair`]), or
    /// a renewal (`refresh`), whose session passed the gate when it opened.
    fn sign_pair(
        &self,
        user: &UserRecord,
        session_id: Uuid,
        jti: &str,
    ) -> Result<JwtPair, ApiError> {
        let keys = self.auth.token_keys();
        let now = crate::clock::now_secs();
        let access = keys
            .sign_access(user, session_id, now)
            .map_err(|_| ApiError::internal())?;
        let refresh = keys
            .sign_refresh(user, session_id, jti, now)
            .map_err(|_| ApiError::internal())?;
        Ok(JwtPair {
            token: access.token,
            refresh_token: refresh.token,
        })
    }

    /// Takes a password-attempt slot for `account` from the client, or answers
    /// 429 (logged without the account name: people type passwords there).
    pub(super) async fn password_attempt(
        &self,
        account: &str,
        req: &EndpointRequest,
    ) -> Result<Attempt, ApiError> {
        self.limiter
            .acquire(account, req.client_key)
            .await
            .map_err(|limited| self.rate_limited(limited, Some(account), req))
    }

    /// Takes a slot for a second-factor code of `account` from the client,
    /// in the code windows (never cleared by a right password), or answers 429.
    pub(super) async fn code_attempt(
        &self,
        account: &str,
        req: &EndpointRequest,
    ) -> Result<Attempt, ApiError> {
        self.limiter
            .acquire_code(account, req.client_key)
            .await
            .map_err(|limited| {
                self.metrics.rate_limited(limited.by);
                let account = self.log_digest.of(account);
                tracing::warn!(target: "keygate::security", account, client = %req.client_ip, by = limited.by, "second-factor code rate limited");
                ApiError::too_many_requests(limited.retry_after.as_secs())
            })
    }

    pub(super) fn rate_limited(
        &self,
        limited: Limited,
        account: Option<&str>,
        req: &EndpointRequest,
    ) -> ApiError {
        self.metrics.rate_limited(limited.by);
        let account = account.map(|a| self.log_digest.of(a)).unwrap_or_default();
        tracing::warn!(target: "keygate::security", account, client = %req.client_ip, by = limited.by, "password attempt rate limited");
        ApiError::too_many_requests(limited.retry_after.as_secs())
    }

    /// Refuses a password or token sent in clear (see [`EndpointRequest::may_send_secrets`]).
    pub(super) fn require_confidential(&self, req: &EndpointRequest) -> Result<(), ApiError> {
        if req.may_send_secrets {
            return Ok(());
        }
        self.metrics.auth("password", "plaintext_refused");
        tracing::warn!(target: "keygate::security", client = %req.client_ip, "refused a password or token sent over plain HTTP");
        Err(ApiError::credentials_over_plain_http())
    }
}

#[utoipa::path(
    post,
    path = "/api/auth/login",
    tag = "auth-controller",
    operation_id = "login",
    summary = "Log in: username and password for a token pair",
    request_body = LoginRequest,
    responses(
        (status = 200, description = "Token pair; or, for a user with a second factor, a pre-verification token (scope PRE_VERIFICATION_TOKEN, no refresh token)", body = JwtPair),
        LoginErrors
    )
)]
pub async fn login(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let body: LoginRequest = req
        .json()
        .inspect_err(|_| api.metrics.login("bad_request"))?;
    let username = body.username.trim();
    // The slot is taken before the hash: parallel guesses cannot overrun the limit.
    let attempt = api
        .password_attempt(username, &req)
        .await
        .inspect_err(|_| api.metrics.login("rate_limited"))?;
    let user = api.store.user_by_email(username).await?;
    let verified = api
        .verify_password(HashFor::Login, &body.password, user.as_ref())
        .await?;
    let user = match user {
        Some(user) if verified => user,
        other => return Err(failed_login(api, username, other.as_ref(), &req).await),
    };
    // The password is right: its slots go back. Its (account, address)
    // window is cleared only by a completed login: here when no second
    // factor is due, else by the right code (`api::two_factor`). A right
    // password never clears the windows second-factor codes count in.
    let gated = api.gate(&user).await;
    if matches!(gated, Ok(Ok(_))) {
        api.limiter.succeeded(attempt).await;
    } else {
        api.limiter.released(attempt).await;
    }
    let gated = gated?;
    if api.store.is_locked(user.id).await? {
        api.metrics.login("locked");
        return Err(ApiError::locked());
    }
    if !user.enabled {
        api.metrics.login("disabled");
        return Err(ApiError::not_active());
    }
    api.store.clear_login_failures(user.id).await?;
    if password::needs_rehash(&user.password_hash) {
        let rehashed = api.hash_password(HashFor::Other, &body.password).await?;
        // Only if the hash is still the one checked: a password the
        // platform's sync or the user set meanwhile stays.
        if api
            .store
            .rehash_password(user.id, &user.password_hash, &rehashed)
            .await?
        {
            tracing::info!(user_id = %user.id, "re-hashed an imported password with Argon2id");
        }
    }
    // A user with a second factor gets a pre-verification token, which
    // opens nothing but the second-factor check; one whom a second factor is
    // enforced for, without one, an MFA configuration token, which opens
    // nothing but configuring one (`api::two_factor`).
    let cleared = match gated {
        Ok(cleared) => cleared,
        Err(pending) => return Ok(second_factor_due(api, &user, &req, &pending)),
    };
    let pair = api.issue_pair(cleared).await?;
    api.metrics.login("success");
    tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "login succeeded");
    Ok(json_response(&pair))
}

/// A login's answer while a second factor is due: the token that waits for it.
fn second_factor_due(
    api: &Endpoints,
    user: &UserRecord,
    req: &EndpointRequest,
    pending: &PreVerificationToken,
) -> http::Response<Body> {
    if pending.scope == crate::auth::jwt::MFA_CONFIGURATION_SCOPE {
        api.metrics.login("second_factor_enforced");
        tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "password accepted; a second factor must be configured first");
    } else {
        api.metrics.login("second_factor_required");
        tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "password accepted; second factor required");
    }
    json_response(pending)
}

/// Counts a failed login (its limiter slot stays taken) and applies the
/// optional lockout. The typed name is logged as a keyed digest, never as
/// typed: people type passwords there.
async fn failed_login(
    api: &Endpoints,
    username: &str,
    user: Option<&UserRecord>,
    req: &EndpointRequest,
) -> ApiError {
    api.metrics.login("bad_credentials");
    match user {
        Some(user) => {
            tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "login failed")
        }
        None => {
            tracing::info!(target: "keygate::security", account = api.log_digest.of(username), client = %req.client_ip, "login failed: unknown account")
        }
    }
    let lockout_after = api.settings.login.lockout_after;
    if lockout_after == 0 {
        return ApiError::invalid_credentials();
    }
    let Some(user) = user else {
        return ApiError::invalid_credentials();
    };
    match api.store.record_login_failure(user.id).await {
        Ok(failures) if failures >= i64::from(lockout_after) => {
            match api.store.lock_user(user.id, crate::clock::now_secs()).await {
                Ok(locked) => api.applied(locked).await,
                Err(error) => {
                    tracing::error!(%error, "locking an account failed");
                    return ApiError::invalid_credentials();
                }
            };
            api.metrics.login("locked");
            tracing::warn!(target: "keygate::security", user_id = %user.id, failures, "account locked after consecutive failed logins");
            ApiError::locked()
        }
        Ok(_) => ApiError::invalid_credentials(),
        Err(error) => {
            tracing::error!(%error, "counting a failed login failed");
            ApiError::invalid_credentials()
        }
    }
}

impl Endpoints {
    /// The public customer `customer_id`, if it is one: configured
    /// (`platform.public_customers`) or imported from the platform.
    async fn public_customer(&self, customer_id: Uuid) -> Result<Option<PublicCustomer>, ApiError> {
        let configured = self
            .settings
            .platform
            .public_customers
            .iter()
            .find(|c| c.customer_id == customer_id);
        if let Some(customer) = configured {
            return Ok(Some(*customer));
        }
        Ok(self.store.public_customer(customer_id).await?)
    }

    /// A token pair of the public user of `customer`, as the platform
    /// issues one: no session is stored (the platform keeps none for it),
    /// each pair names a new session id.
    fn sign_public_pair(&self, customer: &PublicCustomer) -> Result<JwtPair, ApiError> {
        let keys = self.auth.token_keys();
        let now = crate::clock::now_secs();
        let session_id = Uuid::new_v4();
        let access = keys
            .sign_public_access(customer.customer_id, customer.tenant_id, session_id, now)
            .map_err(|_| ApiError::internal())?;
        let refresh = keys
            .sign_public_refresh(
                customer.customer_id,
                session_id,
                &Uuid::new_v4().to_string(),
                now,
            )
            .map_err(|_| ApiError::internal())?;
        Ok(JwtPair {
            token: access.token,
            refresh_token: refresh.token,
        })
    }
}

/// `POST /api/auth/login/public`: a token pair of a public customer's public
/// user. A body without a `publicId` is refused as the platform refuses it
/// ("Authentication failed"); an id that is no public customer's, as a bad
/// password is. Unknown ids count against the client's address like failed
/// logins, so the ids cannot be guessed at speed.
#[utoipa::path(
    post,
    path = "/api/auth/login/public",
    tag = "auth-controller",
    operation_id = "loginPublic",
    summary = "Log in as the public user of a public customer",
    request_body = PublicLoginRequest,
    responses(
        (status = 200, description = "Token pair of the public user (CUSTOMER_USER, isPublic)", body = JwtPair),
        LoginErrors
    )
)]
pub async fn public_login(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let refused = |error: ApiError| {
        api.metrics.login("public_refused");
        error
    };
    let body: PublicLoginRequest = serde_json::from_slice(&req.body)
        .map_err(|_| refused(ApiError::authentication_failed()))?;
    let public_id = body.public_id.unwrap_or_default();
    if public_id.trim().is_empty() {
        return Err(refused(ApiError::authentication_failed()));
    }
    let attempt = api
        .limiter
        .acquire_address(req.client_key)
        .await
        .map_err(|limited| refused(api.rate_limited(limited, None, &req)))?;
    let customer = match Uuid::parse_str(public_id.trim()) {
        Ok(id) if id != crate::identity::NULL_UUID => api.public_customer(id).await?,
        _ => None,
    };
    let Some(customer) = customer else {
        tracing::info!(target: "keygate::security", client = %req.client_ip, "public login with an id that is no public customer's");
        return Err(refused(ApiError::invalid_credentials()));
    };
    api.limiter.succeeded(attempt).await;
    let pair = api.sign_public_pair(&customer)?;
    api.metrics.login("public_success");
    tracing::info!(target: "keygate::security", customer_id = %customer.customer_id, client = %req.client_ip, "public login");
    Ok(json_response(&pair))
}

#[utoipa::path(
    post,
    path = "/api/auth/token",
    tag = "auth-controller",
    operation_id = "refreshToken",
    summary = "Exchange a refresh token for a new pair; the old one is retired",
    request_body = RefreshTokenRequest,
    responses(
        (status = 200, description = "New token pair", body = JwtPair),
        RefreshErrors
    )
)]
pub async fn refresh(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let body: RefreshTokenRequest = req.json()?;
    let claims = api
        .auth
        .token_keys()
        .verify_refresh(&body.refresh_token)
        .map_err(|e| match e {
            TokenError::Expired | TokenError::BadSignature => ApiError::token_expired(),
            TokenError::Malformed | TokenError::WrongScope | TokenError::SecondFactorPending => {
                ApiError::invalid_credentials()
            }
        })?;
    // A public user's refresh holds while its customer is still public, as
    // on the platform; it has no stored session to rotate.
    if let Some(public_id) = claims.public_id() {
        let customer = api
            .public_customer(public_id)
            .await?
            .ok_or_else(ApiError::invalid_credentials)?;
        return Ok(json_response(&api.sign_public_pair(&customer)?));
    }
    let session = api.store.session_by_id(claims.session_id).await?;
    // A pruned session is gone: refused exactly like an ended one.
    let Some(session) = session.filter(|s| !s.ended && s.user_id == claims.user_id) else {
        return Err(ApiError::token_expired());
    };
    let user = api.store.user_by_id(claims.user_id).await?;
    let Some(user) = user else {
        return Err(ApiError::token_expired());
    };
    if api.store.is_locked(user.id).await? {
        return Err(ApiError::locked());
    }
    if !user.enabled {
        return Err(ApiError::not_active());
    }
    if claims.iat < user.tokens_valid_after {
        return Err(ApiError::token_expired());
    }
    let next_jti = Uuid::new_v4().to_string();
    let rotated = api
        .store
        .rotate_refresh(session.id, &claims.jti, &next_jti, crate::clock::now_ms())
        .await?;
    if !rotated {
        // A retired refresh token came back: someone holds a copy. End the session.
        let ended = api
            .store
            .end_session(session.id, crate::clock::now_ms())
            .await?;
        api.applied(ended).await;
        api.metrics.refresh_reuse();
        tracing::warn!(
            target: "keygate::security",
            session_id = %session.id,
            user_id = %user.id,
            client = %req.client_ip,
            "refresh token reuse detected; the session was ended"
        );
        return Err(ApiError::token_expired());
    }
    Ok(json_response(&api.sign_pair(&user, session.id, &next_jti)?))
}

#[utoipa::path(
    post,
    path = "/api/auth/logout",
    tag = "auth-controller",
    operation_id = "logout",
    summary = "End the session: its tokens stop working",
    responses(
        (status = 200, description = "Logged out"),
        CredentialErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn logout(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    if let AuthMethod::Jwt { session_id } = identity.method {
        let ended = api
            .store
            .end_session(session_id, crate::clock::now_ms())
            .await?;
        api.applied(ended).await;
        tracing::info!(target: "keygate::security", %session_id, user_id = %identity.principal.user_id, "logged out");
    }
    Ok(empty_response())
}

#[utoipa::path(
    get,
    path = "/api/auth/user",
    tag = "auth-controller",
    operation_id = "getUser",
    summary = "The authenticated user",
    responses(
        (status = 200, description = "The user record", body = User),
        TokenErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn current_user(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let p = &identity.principal;
    if p.is_public {
        // No user of the store: the user its token names.
        return Ok(json_response(&User::public(p)));
    }
    let user = api
        .store
        .user_by_id(p.user_id)
        .await?
        .ok_or_else(ApiError::not_active)?;
    Ok(json_response(&User::from(&user)))
}

#[utoipa::path(
    post,
    path = "/api/auth/changePassword",
    tag = "auth-controller",
    operation_id = "changePassword",
    summary = "Change the password; every older token stops working",
    request_body = ChangePasswordRequest,
    responses(
        (status = 200, description = "New token pair", body = JwtPair),
        BodyErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn change_password(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    api.require_confidential(&req)?;
    let body: ChangePasswordRequest = req.json()?;
    let user = api
        .store
        .user_by_id(identity.principal.user_id)
        .await?
        .ok_or_else(ApiError::not_active)?;
    // Limited like login: an API key must not buy unlimited password guesses.
    let attempt = api.password_attempt(&user.email, &req).await?;
    if !api
        .verify_password(HashFor::Other, &body.current_password, Some(&user))
        .await?
    {
        tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "password change refused: wrong current password");
        return Err(ApiError::bad_request("Current password doesn't match!"));
    }
    api.limiter.succeeded(attempt).await;
    if body.new_password == body.current_password {
        return Err(ApiError::bad_request(
            "New password should be different from existing!",
        ));
    }
    api.settings
        .password_policy
        .check(&body.new_password)
        .map_err(ApiError::bad_request)?;
    let hash = api
        .hash_password(HashFor::Other, &body.new_password)
        .await?;
    let now = crate::clock::now_secs();
    let changed = super::access::audited(&api.store, identity, "user.change_password")
        .update_password(user.id, &hash, Some(now))
        .await?;
    api.applied(changed).await;
    tracing::info!(target: "keygate::security", user_id = %user.id, "password changed; older tokens outdated");
    let user = UserRecord {
        tokens_valid_after: now,
        ..user
    };
    // A session's pair comes from a login that passed its second factor; an
    // API key and the password are not that: the second factor due at login
    // is due here, as on activation.
    let gated = match Gate::session(identity, &user) {
        Some(cleared) => Ok(cleared),
        None => api.gate(&user).await?,
    };
    match gated {
        Ok(cleared) => Ok(json_response(&api.issue_pair(cleared).await?)),
        Err(pending) => Ok(json_response(&pending)),
    }
}
