//! User endpoints: create or update, get, list in scope, delete,
//! enable/disable, and the activation flow.

use serde::Deserialize;

use super::access::{audited, check_manage, page_json, page_request, param, path_id, query_pairs};
use super::records::{EntityId, PageDataUser, User};
use super::session::HashFor;
use super::wire::{ActivateUserRequest, BodyErrors, JwtPair, ListErrors, ManageErrors};
use super::{EndpointRequest, Endpoints, empty_response, json_response};
use crate::accounts::{self, NewProfile, NewUser};
use crate::auth::api_key::{self, KeyDigest};
use crate::body::Body;
use crate::error::ApiError;
use crate::identity::{Authority, NULL_UUID};
use crate::store::Audit;

pub use crate::store::ACTIVATION_TTL_MS;

/// A `User` as a create or update request carries it: every field may be
/// left out, and ids need no `entityType`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UserBody {
    id: Option<EntityId>,
    email: Option<String>,
    authority: Option<String>,
    tenant_id: Option<EntityId>,
    customer_id: Option<EntityId>,
    first_name: Option<String>,
    last_name: Option<String>,
    phone: Option<String>,
    additional_info: Option<serde_json::Value>,
}

/// `POST /api/user`: creates a user without a password (they activate through
/// a link), or updates the profile of an existing one when `id` is given.
#[utoipa::path(
    post,
    path = "/api/user",
    tag = "user-controller",
    operation_id = "saveUser",
    summary = "Create a user (activated through a link) or update a profile",
    request_body = User,
    responses(
        (status = 200, description = "The user record", body = User),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn save(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let actor = &identity.principal;
    let body: UserBody = req.json()?;
    if let Some(id) = &body.id {
        let existing = api.store.user_by_id(id.id).await?;
        check_manage(actor, existing.as_ref())?;
        let mut user = existing.ok_or_else(ApiError::not_found)?;
        user.first_name = body.first_name.unwrap_or(user.first_name);
        user.last_name = body.last_name.unwrap_or(user.last_name);
        user.phone = body.phone.unwrap_or(user.phone);
        if let Some(info) = body.additional_info {
            user.additional_info = (!info.is_null()).then(|| info.to_string());
        }
        audited(&api.store, identity, "user.update")
            .update_user_profile(&user)
            .await?;
        user.version += 1;
        return Ok(json_response(&User::from(&user)));
    }
    api.charge_write(identity)?;
    let authority_text = body
        .authority
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("authority is required"))?;
    let authority = Authority::parse(authority_text).ok_or_else(|| {
        ApiError::bad_request(format!(
            "authority must be SYS_ADMIN, TENANT_ADMIN or CUSTOMER_USER, got {authority_text:?}"
        ))
    })?;
    let email = body
        .email
        .ok_or_else(|| ApiError::bad_request("email is required"))?;
    let tenant_id = body.tenant_id.map(|t| t.id).filter(|t| *t != NULL_UUID);
    let customer_id = body.customer_id.map(|c| c.id).filter(|c| *c != NULL_UUID);
    let tenant_id = match actor.authority {
        Authority::SysAdmin => tenant_id,
        Authority::TenantAdmin => {
            if authority == Authority::SysAdmin || tenant_id.is_some_and(|t| t != actor.tenant_id) {
                return Err(ApiError::permission_denied());
            }
            Some(actor.tenant_id)
        }
        Authority::CustomerUser => return Err(ApiError::permission_denied()),
    };
    let new = NewUser {
        email,
        authority,
        tenant_id,
        customer_id,
        first_name: body.first_name.unwrap_or_default(),
        last_name: body.last_name.unwrap_or_default(),
    };
    let profile = NewProfile {
        phone: body.phone.unwrap_or_default(),
        additional_info: body
            .additional_info
            .filter(|i| !i.is_null())
            .map(|i| i.to_string()),
    };
    let store = audited(&api.store, identity, "user.create");
    let user = accounts::create_pending_user(&store, new, profile).await?;
    Ok(json_response(&User::from(&user)))
}

#[utoipa::path(
    get,
    path = "/api/user/{id}",
    tag = "user-controller",
    operation_id = "getUserById",
    summary = "A user",
    params(("id" = String, Path, description = "User id")),
    responses(
        (status = 200, description = "The user record", body = User),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn get(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    let user = api.store.user_by_id(path_id(&req.params[0])?).await?;
    check_manage(actor, user.as_ref())?;
    let user = user.ok_or_else(ApiError::not_found)?;
    Ok(json_response(&User::from(&user)))
}

#[utoipa::path(
    get,
    path = "/api/users",
    tag = "user-controller",
    operation_id = "getUsers",
    summary = "Users in scope",
    params(("pageSize" = i64, Query, description = "Items per page (1 to 1000)"), ("page" = i64, Query, description = "Page number, from 0"), ("textSearch" = Option<String>, Query, description = "Case-insensitive filter")),
    responses(
        (status = 200, description = "Page of user records", body = PageDataUser),
        ListErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn list(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    let tenant = match actor.authority {
        Authority::SysAdmin => None,
        Authority::TenantAdmin => Some(actor.tenant_id),
        Authority::CustomerUser => return Err(ApiError::permission_denied()),
    };
    let page = page_request(req.query.as_deref())?;
    let users = api.store.users_page(tenant, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| User::from(u))))
}

#[utoipa::path(
    delete,
    path = "/api/user/{id}",
    tag = "user-controller",
    operation_id = "deleteUser",
    summary = "Delete a user with their keys and sessions",
    params(("id" = String, Path, description = "User id")),
    responses(
        (status = 200, description = "Deleted"),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn delete(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let id = path_id(&req.params[0])?;
    let user = api.store.user_by_id(id).await?;
    check_manage(&identity.principal, user.as_ref())?;
    let deleted = audited(&api.store, identity, "user.delete")
        .delete_user(id)
        .await?;
    api.applied(deleted).await;
    Ok(empty_response())
}

#[utoipa::path(
    post,
    path = "/api/user/{id}/userCredentialsEnabled",
    tag = "user-controller",
    operation_id = "setUserCredentialsEnabled",
    summary = "Enable or disable a user",
    params(("id" = String, Path, description = "User id"), ("userCredentialsEnabled" = bool, Query, description = "true or false")),
    responses(
        (status = 200, description = "Done"),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn set_enabled(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let id = path_id(&req.params[0])?;
    let pairs = query_pairs(req.query.as_deref());
    let enabled = match param(&pairs, "userCredentialsEnabled") {
        Some("true") => true,
        Some("false") => false,
        _ => {
            return Err(ApiError::bad_request(
                "userCredentialsEnabled must be true or false",
            ));
        }
    };
    let user = api.store.user_by_id(id).await?;
    check_manage(&identity.principal, user.as_ref())?;
    let action = if enabled {
        "user.enable"
    } else {
        "user.disable"
    };
    let changed = audited(&api.store, identity, action)
        .set_user_enabled(id, enabled, crate::clock::now_secs())
        .await?;
    api.applied(changed).await;
    Ok(empty_response())
}

/// `GET /api/user/{id}/activationLink`: a new one-time link (older ones stop working).
#[utoipa::path(
    get,
    path = "/api/user/{id}/activationLink",
    tag = "user-controller",
    operation_id = "getActivationLink",
    summary = "A one-time activation link (24 h)",
    params(("id" = String, Path, description = "User id")),
    responses(
        (status = 200, description = "The link, as text", body = String),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn activation_link(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let id = path_id(&req.params[0])?;
    let user = api.store.user_by_id(id).await?;
    check_manage(&identity.principal, user.as_ref())?;
    // A link sets a first password, nothing else: for an account that has one,
    // it would let whoever holds the link take the account over.
    if user.is_some_and(|u| !u.password_hash.is_empty()) {
        return Err(ApiError::bad_request("User is already active"));
    }
    let token = api_key::generate("").map_err(|_| ApiError::internal())?;
    let expires_at = crate::clock::now_ms() + ACTIVATION_TTL_MS;
    audited(&api.store, identity, "user.activation_link")
        .replace_activation(id, &token.digest.to_hex(), expires_at)
        .await?;
    let link = format!(
        "{}/api/noauth/activate?activateToken={}",
        req.base_url,
        token.value.expose()
    );
    let mut response = http::Response::new(crate::body::full(link));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

/// `POST /api/noauth/activate`: sets the first password and logs the user in.
#[utoipa::path(
    post,
    path = "/api/noauth/activate",
    tag = "noauth-controller",
    operation_id = "activateUser",
    summary = "Set the first password with an activation token",
    request_body = ActivateUserRequest,
    responses(
        (status = 200, description = "Token pair", body = JwtPair),
        BodyErrors
    )
)]
pub async fn activate(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let body: ActivateUserRequest = req.json()?;
    api.settings
        .password_policy
        .check(&body.password)
        .map_err(ApiError::bad_request)?;
    // Bogus tokens count against the client's address, like failed logins.
    let attempt = api
        .limiter
        .acquire_address(req.client_key)
        .await
        .map_err(|limited| api.rate_limited(limited, None, &req))?;
    let invalid = || ApiError::bad_request("Activation token is invalid or expired");
    let digest = KeyDigest::of(&body.activate_token).to_hex();
    // The token is checked before anything is hashed: a flood of bogus tokens
    // costs a lookup each, never an Argon2 computation.
    let now_ms = crate::clock::now_ms();
    let known = match api.store.activation_user(&digest, now_ms).await? {
        Some(owner) => Some(owner),
        None => platform_invitation(api, &body.activate_token).await,
    };
    let Some(owner) = known else {
        tracing::info!(target: "keygate::security", client = %req.client_ip, "activation with an unknown or expired token");
        return Err(invalid());
    };
    let owner = api.store.user_by_id(owner).await?.ok_or_else(invalid)?;
    api.limiter.succeeded(attempt).await;
    let hash = api.hash_password(HashFor::Other, &body.password).await?;
    let now = crate::clock::now_secs();
    // Consumed once, atomically, and only for an account without a password.
    let audit = Audit::by_user(owner.id, owner.tenant_id, &owner.email, "user.activate");
    let activated = api
        .store
        .audited(audit)
        .activate(&digest, &hash, crate::clock::now_ms(), now)
        .await?;
    let user_id = api.applied(activated).await.ok_or_else(invalid)?;
    let user = api
        .store
        .user_by_id(user_id)
        .await?
        .ok_or_else(ApiError::not_found)?;
    if !user.enabled {
        return Err(ApiError::not_active());
    }
    Ok(json_response(&api.issue_pair(&user).await?))
}

/// With the sync on, a token keygate does not know may be an invitation
/// the platform sent since the last sync: its holder is imported now
/// ([`crate::import::lookup_activation_token`]). The platform's database
/// down reads as an unknown token.
async fn platform_invitation(api: &Endpoints, token: &str) -> Option<uuid::Uuid> {
    let sync = api.settings.platform.sync.as_ref()?;
    match crate::import::lookup_activation_token(&api.store, &sync.database_url, token).await {
        Ok(Some((id, revocations))) => {
            for revocation in revocations {
                api.auth.revoke(Some(revocation)).await;
            }
            Some(id)
        }
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(%error, "could not look an activation token up in the platform's database");
            None
        }
    }
}

/// The password rules in the platform's shape. keygate's rules are a length
/// range; the platform's other rules are answered as not required.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordPolicy {
    minimum_length: usize,
    maximum_length: usize,
    minimum_uppercase_letters: u32,
    minimum_lowercase_letters: u32,
    minimum_digits: u32,
    minimum_special_characters: u32,
    allow_whitespaces: bool,
    force_user_to_reset_password_if_not_valid: bool,
    password_expiration_period_days: u32,
    password_reuse_frequency_days: u32,
}

/// `GET /api/noauth/userPasswordPolicy`: the rules every password set
/// (activation, change, reset, creation) is checked against.
#[utoipa::path(
    get,
    path = "/api/noauth/userPasswordPolicy",
    tag = "noauth-controller",
    operation_id = "getUserPasswordPolicy",
    summary = "The password rules",
    responses((status = 200, description = "The password policy", body = UserPasswordPolicy))
)]
pub async fn password_policy(
    api: &Endpoints,
    _req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let policy = &api.settings.password_policy;
    Ok(json_response(&UserPasswordPolicy {
        minimum_length: policy.min_length,
        maximum_length: policy.max_length,
        minimum_uppercase_letters: 0,
        minimum_lowercase_letters: 0,
        minimum_digits: 0,
        minimum_special_characters: 0,
        allow_whitespaces: true,
        force_user_to_reset_password_if_not_valid: false,
        password_expiration_period_days: 0,
        password_reuse_frequency_days: 0,
    }))
}
