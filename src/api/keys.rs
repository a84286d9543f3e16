//! API key endpoints: create, list, describe, enable/disable, delete.

use super::access::{audited, check_manage, page_json, page_request, path_id};
use super::records::{ApiKey, PageDataApiKey};
use super::wire::{ApiKeyCreateRequest, ManageErrors};
use super::{EndpointRequest, Endpoints, empty_response, json_response};
use std::sync::Arc;

use crate::accounts;
use crate::auth::scope::Scopes;
use crate::body::Body;
use crate::error::ApiError;
use crate::identity::Identity;
use crate::store::ApiKeyRecord;

impl Endpoints {
    /// The key of `id` if the caller may manage its owner; 404 otherwise, so
    /// keys of users the caller cannot see do not reveal their existence.
    async fn managed_key(&self, req: &EndpointRequest, id: &str) -> Result<ApiKeyRecord, ApiError> {
        let actor = &req.identity()?.principal;
        let id = path_id(id)?;
        let key = self.store.api_key_by_id(id).await?;
        let key = key.ok_or_else(ApiError::not_found)?;
        let owner = self.store.user_by_id(key.user_id).await?;
        check_manage(actor, owner.as_ref())?;
        Ok(key)
    }
}

#[utoipa::path(
    post,
    path = "/api/apiKey",
    tag = "api-key-controller",
    operation_id = "saveApiKey",
    summary = "Create an API key; the value is shown only here",
    request_body = ApiKeyCreateRequest,
    responses(
        (status = 200, description = "The key record with its value", body = ApiKey),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn create(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    api.charge_write(identity)?;
    let body: ApiKeyCreateRequest = req.json()?;
    let owner = api.store.user_by_id(body.user_id.id).await?;
    check_manage(&identity.principal, owner.as_ref())?;
    let owner = owner.ok_or_else(ApiError::not_found)?;
    let description = body.description.unwrap_or_default();
    let expiration_time = body.expiration_time.unwrap_or(0);
    if expiration_time != 0 && expiration_time <= crate::clock::now_ms() {
        return Err(ApiError::bad_request(
            "expirationTime must be in the future, or 0 for never",
        ));
    }
    let enabled = body.enabled.unwrap_or(true);
    let scopes = match body.scopes.as_ref().filter(|v| !v.is_null()) {
        Some(value) => Some(Scopes::from_json(value).map_err(|e| ApiError::bad_request(e.0))?),
        None => None,
    };
    within_creator_scopes(identity, owner.id, scopes.as_ref())?;
    let prefix = &api.settings.api_key_prefix;
    let request = accounts::KeyRequest {
        prefix,
        description: &description,
        expiration_time,
        enabled,
        scopes: scopes.map(Arc::new),
    };
    let created = accounts::create_api_key_within(
        &audited(&api.store, identity, "api_key.create"),
        &owner,
        request,
        api.settings.max_api_keys_per_user,
    )
    .await?;
    let record = created.record;
    Ok(json_response(&ApiKey::new(
        &record,
        Some(created.value.expose()),
    )))
}

/// Creating a key is a credential ([`super::Effect::Credential`]), which no
/// scoped key reaches: this is the second line. A scoped key would create
/// only keys of its own user (another user's key would skip that user's
/// second factor), within its own grants: never an unscoped one, and never
/// a grant wider (in path or methods) than one of its own.
fn within_creator_scopes(
    identity: &Identity,
    owner: uuid::Uuid,
    wanted: Option<&Scopes>,
) -> Result<(), ApiError> {
    let Some(own) = identity.scopes() else {
        return Ok(());
    };
    if owner == identity.principal.user_id && wanted.is_some_and(|wanted| own.covers(wanted)) {
        return Ok(());
    }
    tracing::warn!(
        target: "keygate::security",
        key_id = %identity.credential_id(),
        "a scoped API key asked for a key beyond its own scopes or for another user"
    );
    Err(ApiError {
        message: "A scoped API key can only create keys of its own user, within its own scopes"
            .into(),
        ..ApiError::permission_denied()
    })
}

#[utoipa::path(
    get,
    path = "/api/apiKeys/{userId}",
    tag = "api-key-controller",
    operation_id = "getUserApiKeys",
    summary = "A page of a user's API keys",
    params(("userId" = String, Path, description = "User id"), ("pageSize" = i64, Query, description = "Items per page (1 to 1000)"), ("page" = i64, Query, description = "Page number, from 0"), ("textSearch" = Option<String>, Query, description = "Case-insensitive filter")),
    responses(
        (status = 200, description = "Page of key records", body = PageDataApiKey),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn list(api: &Endpoints, req: EndpointRequest) -> Result<http::Response<Body>, ApiError> {
    let actor = &req.identity()?.principal;
    let user_id = path_id(&req.params[0])?;
    let owner = api.store.user_by_id(user_id).await?;
    check_manage(actor, owner.as_ref())?;
    let page = page_request(req.query.as_deref())?;
    let keys = api.store.api_keys_page(user_id, &page).await?;
    Ok(json_response(&page_json(&keys, &page, |k| {
        ApiKey::new(k, None)
    })))
}

#[utoipa::path(
    put,
    path = "/api/apiKey/{id}/description",
    tag = "api-key-controller",
    operation_id = "updateApiKeyDescription",
    summary = "Change the description (the body is the bare text)",
    request_body = String,
    params(("id" = String, Path, description = "API key id")),
    responses(
        (status = 200, description = "The key record", body = ApiKey),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn describe(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let mut key = api.managed_key(&req, &req.params[0]).await?;
    // The body is the bare description; a JSON string is accepted too.
    let text = std::str::from_utf8(&req.body)
        .map_err(|_| ApiError::bad_request("description must be UTF-8 text"))?;
    let description = serde_json::from_str::<String>(text).unwrap_or_else(|_| text.to_string());
    let description = description.trim();
    if description.is_empty() || description.chars().count() > 255 {
        return Err(ApiError::bad_request(
            "description must be non-blank and at most 255 characters",
        ));
    }
    audited(&api.store, identity, "api_key.describe")
        .set_api_key_description(key.id, description)
        .await?;
    key.description = description.to_string();
    Ok(json_response(&ApiKey::new(&key, None)))
}

#[utoipa::path(
    put,
    path = "/api/apiKey/{id}/enabled/{enabled}",
    tag = "api-key-controller",
    operation_id = "enableApiKey",
    summary = "Enable or disable a key",
    params(("id" = String, Path, description = "API key id"), ("enabled" = bool, Path, description = "true or false")),
    responses(
        (status = 200, description = "The key record", body = ApiKey),
        ManageErrors
    ),
    security(("HttpLoginForm" = []), ("ApiKeyForm" = []))
)]
pub async fn set_enabled(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<http::Response<Body>, ApiError> {
    let identity = req.identity()?;
    let mut key = api.managed_key(&req, &req.params[0]).await?;
    let enabled = match req.params[1].as_str() {
        "true" => true,
        "false" => false,
        other => {
            return Err(ApiError::bad_request(format!(
                "enabled must be true or false, got {other:?}"
            )));
        }
    };
    let action = if enabled {
        "api_key.enable"
    } else {
        "api_key.disable"
    };
    let changed = audited(&api.store, identity, action)
        .set_api_key_enabled(key.id, enabled)
        .await?;
    api.applied(changed).await;
    key.enabled = enabled;
    Ok(json_response(&ApiKey::new(&key, None)))
}

#[utoipa::path(
    delete,
    path = "/api/apiKey/{id}",
    tag = "api-key-controller",
    operation_id = "deleteApiKey",
    summary = "Delete a key",
    params(("id" = String, Path, description = "API key id")),
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
    let key = api.managed_key(&req, &req.params[0]).await?;
    let deleted = audited(&api.store, identity, "api_key.delete")
        .delete_api_key(key.id)
        .await?;
    api.applied(deleted).await;
    Ok(empty_response())
}
