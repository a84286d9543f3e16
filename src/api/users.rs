//! User endpoints: create or update, get, list in scope, delete,
//! enable/disable, and the activation flow.

use serde::Deserialize;

use uuid::Uuid;

use super::access::{
    audited, check_manage, check_sort, page_json, page_request, param, path_id, query_pairs,
};
use super::records::{EntityId, PageDataUser, PageDataUserInfo, User, UserInfo};
use super::session::HashFor;
use super::wire::{ActivateUserRequest, BodyErrors, JwtPair, ListErrors, ManageErrors};
use super::{EndpointRequest, Endpoints, MailedLink, empty_response, json_response};
use crate::accounts::{self, NewProfile, NewUser};
use crate::auth::api_key::KeyDigest;
use crate::body::Body;
use crate::error::ApiError;
use crate::identity::{Authority, NULL_UUID, Principal};
use crate::import::TokenKind;
use crate::mail::MailKind;
use crate::store::{Audit, PageRequest, USER_SORT_PROPERTIES, UserScope};

pub use crate::store::ACTIVATION_TTL_MS;
use crate::store::{ACTIVATION_RENEW_MS, ActivationToken};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

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
    params(("sendActivationMail" = Option<bool>, Query, description = "Mail the new user an activation link (default: true when mail is configured)")),
    request_body = User,
    responses(
        (status = 200, description = "The user record", body = User),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn save(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let body: UserBody = req.json()?;
    let send_mail = mail_asked(api, &req)?;
    if let Some(id) = &body.id {
        let id = id.id;
        return update_profile(api, identity, id, body).await;
    }
    api.charge_write(identity)?;
    let (new, profile) = new_user(&identity.principal, body)?;
    let store = audited(&api.store, identity, "user.create");
    let user = accounts::create_pending_user(&store, new, profile).await?;
    if send_mail && let Some(mailer) = &api.mail {
        mail_activation(api, mailer, identity, &user, &req).await?;
    }
    Ok(json_response(&User::from(&user)))
}

/// `sendActivationMail`: the platform's default is to send; without mail,
/// only an explicit request for it is refused (before anything is created).
fn mail_asked(api: &Endpoints, req: &EndpointRequest) -> Result<bool, ApiError> {
    let pairs = query_pairs(req.query.as_deref());
    match param(&pairs, "sendActivationMail") {
        None => Ok(api.mail.is_some()),
        Some("true") => {
            if api.mail.is_none() {
                return Err(mail_not_configured());
            }
            Ok(true)
        }
        Some("false") => Ok(false),
        Some(_) => Err(ApiError::bad_request(
            "sendActivationMail must be true or false",
        )),
    }
}

/// Updates the profile of the existing user `id` from `body`.
async fn update_profile(
    api: &Endpoints,
    identity: &crate::identity::Identity,
    id: Uuid,
    body: UserBody,
) -> Result<http::Response<Body>, ApiError> {
    let existing = api.store.user_by_id(id).await?;
    check_manage(&identity.principal, existing.as_ref())?;
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
    Ok(json_response(&User::from(&user)))
}

/// The user `actor` asks to create, within what `actor` may create.
fn new_user(actor: &Principal, body: UserBody) -> Result<(NewUser, NewProfile), ApiError> {
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
    Ok((new, profile))
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
    params(UserPageParams),
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
    let scope = UserScope {
        tenant_id: tenant,
        ..UserScope::default()
    };
    let page = user_page_request(&req)?;
    let users = api.store.users_page(&scope, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| User::from(u))))
}

/// The paging parameters of a user listing, its sort property checked.
fn user_page_request(req: &EndpointRequest) -> Result<PageRequest, ApiError> {
    let page = page_request(req.query.as_deref())?;
    check_sort(&page, &USER_SORT_PROPERTIES)?;
    Ok(page)
}

/// The query parameters of every user listing.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code, non_snake_case)]
struct UserPageParams {
    /// Items per page (1 to 1000)
    pageSize: i64,
    /// Page number, from 0
    page: i64,
    /// Case-insensitive filter on the e-mail and names
    textSearch: Option<String>,
    /// createdTime, firstName, lastName or email
    sortProperty: Option<String>,
    /// ASC (default) or DESC
    sortOrder: Option<String>,
}

/// `customerId` of a listing as a TENANT_ADMIN may read it: a customer
/// another tenant's users belong to is refused (403, as the platform refuses
/// reading another tenant's customer); one keygate has no users of yet
/// lists nothing.
async fn own_customer(api: &Endpoints, actor: &Principal, text: &str) -> Result<Uuid, ApiError> {
    let customer = path_id(text)?;
    match api.store.customer_tenant(customer).await? {
        Some(tenant) if tenant != actor.tenant_id => Err(ApiError::permission_denied()),
        _ => Ok(customer),
    }
}

/// `GET /api/tenant/{tenantId}/users`: the tenant's administrators, for a
/// SYS_ADMIN.
#[utoipa::path(
    get,
    path = "/api/tenant/{tenantId}/users",
    tag = "user-controller",
    operation_id = "getTenantAdmins",
    summary = "The administrators of a tenant (SYS_ADMIN)",
    params(("tenantId" = String, Path, description = "Tenant id"), UserPageParams),
    responses(
        (status = 200, description = "Page of user records", body = PageDataUser),
        ListErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn tenant_admins(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    if actor.authority != Authority::SysAdmin {
        return Err(ApiError::permission_denied());
    }
    let scope = UserScope {
        tenant_id: Some(path_id(&req.params[0])?),
        customer_id: None,
        authority: Some(Authority::TenantAdmin),
    };
    let page = user_page_request(&req)?;
    let users = api.store.users_page(&scope, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| User::from(u))))
}

/// `GET /api/customer/{customerId}/users`: a customer's users, for a
/// TENANT_ADMIN of the customer's tenant.
#[utoipa::path(
    get,
    path = "/api/customer/{customerId}/users",
    tag = "user-controller",
    operation_id = "getCustomerUsers",
    summary = "The users of a customer (TENANT_ADMIN)",
    params(("customerId" = String, Path, description = "Customer id"), UserPageParams),
    responses(
        (status = 200, description = "Page of user records", body = PageDataUser),
        ListErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn customer_users(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    if actor.authority != Authority::TenantAdmin {
        return Err(ApiError::permission_denied());
    }
    let customer = own_customer(api, actor, &req.params[0]).await?;
    let scope = UserScope {
        tenant_id: Some(actor.tenant_id),
        customer_id: Some(customer),
        authority: None,
    };
    let page = user_page_request(&req)?;
    let users = api.store.users_page(&scope, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| User::from(u))))
}

/// `GET /api/customer/{customerId}/userInfos`: a customer's users with their
/// owner, for a TENANT_ADMIN of its tenant or a user of that customer.
#[utoipa::path(
    get,
    path = "/api/customer/{customerId}/userInfos",
    tag = "user-controller",
    operation_id = "getCustomerUserInfos",
    summary = "The users of a customer, with their owner (TENANT_ADMIN, or CUSTOMER_USER of that customer)",
    params(("customerId" = String, Path, description = "Customer id"), UserPageParams),
    responses(
        (status = 200, description = "Page of user records with their owner", body = PageDataUserInfo),
        ListErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn customer_user_infos(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    let customer = match actor.authority {
        Authority::TenantAdmin => own_customer(api, actor, &req.params[0]).await?,
        Authority::CustomerUser => {
            let customer = path_id(&req.params[0])?;
            if customer != actor.customer_id {
                return Err(ApiError::permission_denied());
            }
            customer
        }
        Authority::SysAdmin => return Err(ApiError::permission_denied()),
    };
    let scope = UserScope {
        tenant_id: Some(actor.tenant_id),
        customer_id: Some(customer),
        authority: None,
    };
    let page = user_page_request(&req)?;
    let users = api.store.users_page(&scope, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| {
        UserInfo::from(u)
    })))
}

/// `GET /api/userInfos/all`: for a TENANT_ADMIN the tenant's own users (its
/// administrators), or with `includeCustomers=true` every user of the tenant;
/// for a CUSTOMER_USER the users of its customer.
#[utoipa::path(
    get,
    path = "/api/userInfos/all",
    tag = "user-controller",
    operation_id = "getAllUserInfos",
    summary = "The users the caller's tenant or customer owns, with their owner (TENANT_ADMIN, CUSTOMER_USER)",
    params(
        UserPageParams,
        ("includeCustomers" = Option<bool>, Query, description = "For a TENANT_ADMIN: also the users of every customer (default false)")
    ),
    responses(
        (status = 200, description = "Page of user records with their owner", body = PageDataUserInfo),
        ListErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn all_user_infos(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    let pairs = query_pairs(req.query.as_deref());
    let include_customers = match param(&pairs, "includeCustomers") {
        None | Some("") | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Parameter 'includeCustomers' must be true or false, got {other:?}"
            )));
        }
    };
    let customer = match actor.authority {
        Authority::TenantAdmin if include_customers => None,
        Authority::TenantAdmin => Some(NULL_UUID),
        Authority::CustomerUser => Some(actor.customer_id),
        Authority::SysAdmin => return Err(ApiError::permission_denied()),
    };
    let scope = UserScope {
        tenant_id: Some(actor.tenant_id),
        customer_id: customer,
        authority: None,
    };
    let page = user_page_request(&req)?;
    let users = api.store.users_page(&scope, &page).await?;
    Ok(json_response(&page_json(&users, &page, |u| {
        UserInfo::from(u)
    })))
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

/// `GET /api/user/{id}/activationLink`: the pending one-time link, or a new
/// one when it is close to its end ([`activation_link_of`]).
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
    let (link, _) = activation_link_of(api, identity, id, &req).await?;
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

/// The one-time activation link of `user_id` and when it expires (epoch
/// ms), made by [`EndpointRequest::link`] (the configured public base URL,
/// never the client's Host). Asking never replaces a pending link: while
/// one has more than [`ACTIVATION_RENEW_MS`] left it is the answer, token
/// and all, as the platform answers its own (`checkUserActivationToken`);
/// only then is a new one issued, and the old one still works until it
/// expires. A token
/// is worked out from the user and its expiry under the sealing secret
/// ([`crate::auth::at_rest::Sealer::derive`]), so the store keeps only
/// its digest and can still show it again; one it cannot work out (issued
/// under an earlier secret, or by the platform) is never shown again, and
/// a new one is issued beside it.
async fn activation_link_of(
    api: &Endpoints,
    identity: &crate::identity::Identity,
    user_id: uuid::Uuid,
    req: &EndpointRequest,
) -> Result<(String, i64), ApiError> {
    let sealer = api.two_factor.sealer();
    let token_of = |expires_at: i64| {
        let secret = sealer.derive(user_id, "activation", &expires_at.to_be_bytes());
        URL_SAFE_NO_PAD.encode(secret)
    };
    let link = |token: &str| req.link(&format!("/api/noauth/activate?activateToken={token}"));
    let now = crate::clock::now_ms();
    for (digest, expires_at) in api.store.pending_activations(user_id, now).await? {
        if expires_at - now < ACTIVATION_RENEW_MS {
            continue;
        }
        let token = token_of(expires_at);
        if KeyDigest::of(&token).to_hex() == digest {
            return Ok((link(&token), expires_at));
        }
    }
    let expires_at = now + ACTIVATION_TTL_MS;
    let token = token_of(expires_at);
    audited(&api.store, identity, "user.activation_link")
        .add_activation(user_id, &KeyDigest::of(&token).to_hex(), expires_at)
        .await?;
    Ok((link(&token), expires_at))
}

/// Mails `user` their activation link ([`activation_link_of`]): queued,
/// never waited for.
async fn mail_activation(
    api: &Endpoints,
    mailer: &crate::mail::Mailer,
    identity: &crate::identity::Identity,
    user: &crate::store::UserRecord,
    req: &EndpointRequest,
) -> Result<(), ApiError> {
    let (link, expires_at) = activation_link_of(api, identity, user.id, req).await?;
    let left = expires_at - crate::clock::now_ms();
    let hours = ((left + 3_599_999) / 3_600_000).max(1).to_string();
    mailer.send(
        MailKind::Activation,
        &user.email,
        &[
            ("activationLink", &link),
            ("activationLinkTtlInHours", &hours),
        ],
    );
    Ok(())
}

fn mail_not_configured() -> ApiError {
    ApiError::bad_request("Mail is not configured on this server: set [mail] host to send mail")
}

/// `POST /api/user/sendActivationMail?email=`: mails the activation link
/// ([`activation_link_of`]) to a user who has not activated yet.
#[utoipa::path(
    post,
    path = "/api/user/sendActivationMail",
    tag = "user-controller",
    operation_id = "sendActivationEmail",
    summary = "Mail the one-time activation link (24 h)",
    params(("email" = String, Query, description = "The user's e-mail address")),
    responses(
        (status = 200, description = "Queued for sending"),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn send_activation_mail(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let pairs = query_pairs(req.query.as_deref());
    let email = param(&pairs, "email")
        .filter(|e| !e.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_request("Required request parameter 'email' is not present")
        })?;
    let user = api.store.user_by_email(email).await?;
    check_manage(&identity.principal, user.as_ref())?;
    let user = user.ok_or_else(ApiError::not_found)?;
    if !user.password_hash.is_empty() {
        return Err(ApiError::bad_request("User is already active"));
    }
    let mailer = api.mail.as_ref().ok_or_else(mail_not_configured)?;
    mail_activation(api, mailer, identity, &user, &req).await?;
    Ok(empty_response())
}

/// `GET /api/noauth/activate?activateToken=`: the link in the invitation,
/// answered as the platform's `checkActivateToken`: a valid token is sent on
/// to the create-password page, an expired one to the platform's
/// expired-link page (303s, on [`EndpointRequest::link`]); an unknown or
/// used one is a 409. Nothing is used up or replaced: the token still
/// activates. Unknown tokens count against the client's address as failed
/// activations do.
#[utoipa::path(
    get,
    path = "/api/noauth/activate",
    tag = "noauth-controller",
    operation_id = "checkActivateToken",
    summary = "The invitation link: 303 to the create-password page, 409 for an unknown token",
    params(("activateToken" = String, Query, description = "The token from the invitation")),
    responses(
        (status = 303, description = "To <base>/login/createPassword?activateToken=..., or <base>/activationLinkExpired"),
        (status = 409, description = "Unknown or used token"),
        BodyErrors
    )
)]
pub async fn check_activate_token(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    api.require_confidential(&req)?;
    let pairs = query_pairs(req.query.as_deref());
    let token = param(&pairs, "activateToken")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            ApiError::bad_request("Required request parameter 'activateToken' is not present")
        })?;
    let attempt = api
        .limiter
        .acquire_address(req.client_key)
        .await
        .map_err(|limited| api.rate_limited(limited, None, &req))?;
    let digest = KeyDigest::of(&token).to_hex();
    let mut state = api
        .store
        .activation_token(&digest, crate::clock::now_ms())
        .await?;
    // With the sync on, an invitation the platform mailed since the last
    // round is its; looking it up imports its holder (never uses it), and
    // an expired one is imported as expired.
    if state == ActivationToken::Unknown && api.settings.platform.sync.is_some() {
        state = match platform_token(api, TokenKind::Activation, &token).await {
            Some(user_id) => ActivationToken::Valid(user_id),
            None => {
                api.store
                    .activation_token(&digest, crate::clock::now_ms())
                    .await?
            }
        };
    }
    INVITATION_LINK
        .answer(api, &req, attempt, state, &token)
        .await
}

/// The invitation's link, answered as the platform's `checkActivateToken`.
const INVITATION_LINK: MailedLink = MailedLink {
    page: "/login/createPassword?activateToken=",
    expired_page: "/activationLinkExpired",
    unknown: "Activation token is invalid or was used",
    logged: "activation link with an unknown token",
};

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
        None => platform_token(api, TokenKind::Activation, &body.activate_token).await,
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
    // Activation logs the user in: a second factor due at login is due here.
    match api.gate(&user).await? {
        Ok(cleared) => Ok(json_response(&api.issue_pair(cleared).await?)),
        Err(pending) => Ok(json_response(&pending)),
    }
}

/// With the sync on, a token keygate does not know may be an invitation
/// or a reset link the platform mailed since the last sync: its holder is
/// imported now ([`crate::import::lookup_token`]). The platform's database
/// down reads as an unknown token.
pub(super) async fn platform_token(
    api: &Endpoints,
    kind: TokenKind,
    token: &str,
) -> Option<uuid::Uuid> {
    let sync = api.settings.platform.sync.as_ref()?;
    let options = crate::import::Options {
        database_url: sync.database_url.clone(),
        dry_run: false,
        prune: false,
        sealer: api.two_factor.sealer(),
        origin: crate::import::Origin::Sync,
        mail: api.mail.is_some(),
        max_bcrypt_cost: api.settings.login.max_bcrypt_cost,
    };
    match crate::import::lookup_token(&api.store, &options, kind, token).await {
        Ok(Some((id, revocations))) => {
            for revocation in revocations {
                api.auth.revoke(Some(revocation)).await;
            }
            Some(id)
        }
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(%error, ?kind, "could not look a token up in the platform's database");
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
