//! Password reset by mail: the request (`resetPasswordByEmail`), the link's
//! check (a redirect to the reset page) and the reset itself.
//!
//! The request answers the same, at the same speed, whatever the address:
//! the answer never waits for the store. Both paths do the same work before
//! it; the lookup, the stored token (its digest only) and the mail happen
//! after it, in a bounded number of background tasks. That later work is not
//! the same (a known address costs a write and a mail), and on a busy machine
//! it would show in the time of the answers around it: so the answer leaves
//! no sooner than [`ANSWER_AFTER`] after the request arrived, the same for
//! every address.

use serde::Deserialize;
use utoipa::ToSchema;

use super::access::{param, query_pairs};
use super::session::HashFor;
use super::wire::BodyErrors;
use super::{EndpointRequest, Endpoints, MailedLink, empty_response, encode_component};
use crate::auth::api_key::{self, KeyDigest};
use crate::body::Body;
use crate::error::ApiError;
use crate::import::TokenKind;
use crate::mail::{MailKind, Mailer, redact};
use crate::store::{Audit, ResetToken, Store};

/// When a reset request is answered, after it arrived, whatever the address:
/// far above the work before the answer (well under a millisecond), so the
/// work after an answer (a lookup, or a lookup, a write and a mail) never
/// shows in the time of this one or the next.
const ANSWER_AFTER: std::time::Duration = std::time::Duration::from_millis(25);

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetPasswordEmailRequest {
    pub email: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetPasswordRequest {
    pub reset_token: String,
    pub password: String,
}

/// `POST /api/noauth/resetPasswordByEmail`: always 200, whether or not the
/// address belongs to an active user.
#[utoipa::path(
    post,
    path = "/api/noauth/resetPasswordByEmail",
    tag = "noauth-controller",
    operation_id = "requestResetPasswordByEmail",
    summary = "Mail a password reset link; the same answer for every address",
    request_body = ResetPasswordEmailRequest,
    responses(
        (status = 200, description = "Always, whether or not the address is known"),
        BodyErrors
    )
)]
pub async fn request_by_email(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let answer_at = tokio::time::Instant::now() + ANSWER_AFTER;
    let body: ResetPasswordEmailRequest = req.json()?;
    let email = crate::email::fold(&body.email);
    if email.is_empty() || email.len() > crate::email::MAX_LEN || !email.contains('@') {
        return Err(ApiError::bad_request("email must be an e-mail address"));
    }
    // Counted per address and per account, known or not: each request
    // keeps its slot (a reset request never "succeeds" for the limiter).
    let attempt = api
        .limiter
        .acquire(&format!("reset:{email}"), req.client_key)
        .await
        .map_err(|limited| api.rate_limited(limited, None, &req))?;
    drop(attempt);
    // The same work for every address up to the answer: a token and its
    // digest are made whether or not they will be used.
    let token = api_key::generate("").map_err(|_| ApiError::internal())?;
    let Some(mailer) = api.mail.clone() else {
        tracing::info!(target: "keygate::security", client = %req.client_ip, "password reset requested, but [mail] is not configured");
        tokio::time::sleep_until(answer_at).await;
        return Ok(empty_response());
    };
    match api.reset_work.clone().try_acquire_owned() {
        Ok(permit) => {
            let work = ResetWork {
                store: api.store.clone(),
                mailer,
                email,
                link: req.link(&format!(
                    "/api/noauth/resetPassword?resetToken={}",
                    encode_component(token.value.expose())
                )),
                digest: token.digest.to_hex(),
            };
            tokio::spawn(async move {
                work.run().await;
                drop(permit);
            });
        }
        Err(_) => {
            tracing::warn!(target: "keygate::security", client = %req.client_ip, "too many password reset requests at once: one dropped");
        }
    }
    tokio::time::sleep_until(answer_at).await;
    Ok(empty_response())
}

/// What a reset request does after its answer.
struct ResetWork {
    store: Store,
    mailer: Mailer,
    email: String,
    /// The link to mail, token and all ([`EndpointRequest::link`]).
    link: String,
    digest: String,
}

impl ResetWork {
    async fn run(self) {
        let user = match self.store.user_by_email(&self.email).await {
            Ok(Some(user)) => user,
            Ok(None) => {
                tracing::info!(target: "keygate::security", to = %redact(&self.email), "password reset requested for an unknown address: nothing sent");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "password reset request: the store did not answer");
                return;
            }
        };
        // Only an active account (enabled, with a password) gets a link: a
        // pending one activates through its invitation.
        if !user.enabled || user.password_hash.is_empty() {
            tracing::info!(target: "keygate::security", user_id = %user.id, "password reset requested for an inactive account: nothing sent");
            return;
        }
        let lifetime = self.mailer.reset_link_lifetime;
        let now_ms = crate::clock::now_ms();
        let expires_at = now_ms + lifetime.as_millis() as i64;
        let audit = Audit::by_user(
            user.id,
            user.tenant_id,
            &user.email,
            "user.reset_password_request",
        );
        if let Err(error) = self
            .store
            .audited(audit)
            .replace_reset_token(user.id, &self.digest, expires_at, now_ms)
            .await
        {
            tracing::warn!(%error, user_id = %user.id, "password reset token not stored: nothing sent");
            return;
        }
        let hours = lifetime.as_secs().div_ceil(3600).to_string();
        self.mailer.send(
            MailKind::Reset,
            &user.email,
            &[
                ("passwordResetLink", &self.link),
                ("passwordResetLinkTtlInHours", &hours),
            ],
        );
    }
}

fn reset_token_param(req: &EndpointRequest) -> Result<String, ApiError> {
    let pairs = query_pairs(req.query.as_deref());
    param(&pairs, "resetToken")
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::bad_request("Required request parameter 'resetToken' is not present")
        })
}

/// What a reset token is in keygate's store; with the sync on, a token
/// keygate does not know is first looked up in the platform's database (a
/// link the platform mailed since the last sync works at once).
async fn known_reset_token(
    api: &Endpoints,
    token: &str,
    digest: &str,
) -> Result<ResetToken, ApiError> {
    let found = api
        .store
        .reset_token(digest, crate::clock::now_ms())
        .await?;
    if found != ResetToken::Unknown {
        return Ok(found);
    }
    Ok(
        match super::users::platform_token(api, TokenKind::Reset, token).await {
            Some(user_id) => ResetToken::Valid(user_id),
            None => ResetToken::Unknown,
        },
    )
}

/// `GET /api/noauth/resetPassword?resetToken=`: the link in the mail,
/// answered as the platform's `checkResetToken`: a valid token is sent on to
/// the reset page, an expired one to the platform's expired-link page (303s,
/// on [`EndpointRequest::link`]); an unknown one is a 409. Nothing is used
/// up or replaced: the token still sets the password.
#[utoipa::path(
    get,
    path = "/api/noauth/resetPassword",
    tag = "noauth-controller",
    operation_id = "checkResetToken",
    summary = "The reset link: 303 to the reset page, 409 for an unknown token",
    params(("resetToken" = String, Query, description = "The token from the mail")),
    responses(
        (status = 303, description = "To <base>/login/resetPassword?resetToken=..., or <base>/passwordResetLinkExpired"),
        (status = 409, description = "Unknown or used token"),
        BodyErrors
    )
)]
pub async fn check_token(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let token = reset_token_param(&req)?;
    // Unknown tokens count against the client's address, like failed logins.
    let attempt = api
        .limiter
        .acquire_address(req.client_key)
        .await
        .map_err(|limited| api.rate_limited(limited, None, &req))?;
    let digest = KeyDigest::of(&token).to_hex();
    let found = known_reset_token(api, &token, &digest).await?;
    RESET_LINK.answer(api, &req, attempt, found, &token).await
}

/// The reset mail's link, answered as the platform's `checkResetToken`.
const RESET_LINK: MailedLink = MailedLink {
    page: "/login/resetPassword?resetToken=",
    expired_page: "/passwordResetLinkExpired",
    unknown: "Password reset token is invalid or was used",
    logged: "reset link with an unknown token",
};

/// `POST /api/noauth/resetPassword`: sets the new password with the token
/// from the mail, once. Every earlier session of the user ends; API keys stay.
#[utoipa::path(
    post,
    path = "/api/noauth/resetPassword",
    tag = "noauth-controller",
    operation_id = "resetPassword",
    summary = "Set a new password with a reset token (once); earlier sessions end",
    request_body = ResetPasswordRequest,
    responses(
        (status = 200, description = "Password set"),
        BodyErrors
    )
)]
pub async fn reset(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let body: ResetPasswordRequest = req.json()?;
    let attempt = api
        .limiter
        .acquire_address(req.client_key)
        .await
        .map_err(|limited| api.rate_limited(limited, None, &req))?;
    let invalid = || ApiError::bad_request("Invalid reset token!");
    let digest = KeyDigest::of(&body.reset_token).to_hex();
    // The token is checked before anything is hashed: a flood of bogus
    // tokens costs a lookup each, never an Argon2 computation.
    let user_id = match known_reset_token(api, &body.reset_token, &digest).await? {
        ResetToken::Valid(user_id) => user_id,
        ResetToken::Expired => {
            return Err(ApiError::bad_request("Password reset token expired"));
        }
        ResetToken::Unknown => {
            tracing::info!(target: "keygate::security", client = %req.client_ip, "password reset with an unknown or used token");
            return Err(invalid());
        }
    };
    api.limiter.succeeded(attempt).await;
    api.settings
        .password_policy
        .check(&body.password)
        .map_err(ApiError::bad_request)?;
    let user = api.store.user_by_id(user_id).await?.ok_or_else(invalid)?;
    if api
        .verify_password(HashFor::Other, &body.password, Some(&user))
        .await?
    {
        return Err(ApiError::bad_request(
            "New password should be different from existing!",
        ));
    }
    let hash = api.hash_password(HashFor::Other, &body.password).await?;
    let audit = Audit::by_user(user.id, user.tenant_id, &user.email, "user.reset_password");
    let changed = api
        .store
        .audited(audit)
        .reset_password(
            &digest,
            &hash,
            crate::clock::now_ms(),
            crate::clock::now_secs(),
        )
        .await?;
    // Of two uses at once, one finds the token gone.
    api.applied(changed).await.ok_or_else(invalid)?;
    tracing::info!(target: "keygate::security", user_id = %user.id, client = %req.client_ip, "password reset by mail; older tokens outdated");
    if let Some(mailer) = &api.mail {
        let login = req.link("/login");
        mailer.send(
            MailKind::PasswordWasReset,
            &user.email,
            &[("loginLink", &login)],
        );
    }
    Ok(empty_response())
}
