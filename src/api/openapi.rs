//! The OpenAPI document of the endpoints keygate answers itself, generated from
//! the handlers' annotations and the wire types they name.

use serde_json::Value;
use utoipa::OpenApi;

use super::records::{
    ApiKey, EntityId, PageDataApiKey, PageDataUser, PageDataUserInfo, ScopeGrant, User, UserInfo,
};
use super::users::UserPasswordPolicy;
use super::wire::{
    ActivateUserRequest, ApiKeyCreateRequest, ChangePasswordRequest, JwtPair, LoginRequest,
    PublicLoginRequest, RefreshTokenRequest,
};
use super::{jwks, keys, reset, session, sso, two_factor, users};
use crate::error::ErrorResponse;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "keygate",
        description = "Authentication gateway of the device platform's REST API. Authorize with a username and password (HttpLoginForm) or an API key (ApiKeyForm); when both are authorized the token is sent.",
    ),
    paths(
        session::login,
        session::public_login,
        session::refresh,
        session::logout,
        session::current_user,
        session::change_password,
        keys::create,
        keys::list,
        keys::describe,
        keys::set_enabled,
        keys::delete,
        users::save,
        users::get,
        users::list,
        users::all_user_infos,
        users::tenant_admins,
        users::customer_users,
        users::customer_user_infos,
        users::delete,
        users::set_enabled,
        users::activation_link,
        users::check_activate_token,
        users::activate,
        jwks::jwks,
        users::password_policy,
        two_factor::providers,
        two_factor::generate,
        two_factor::save,
        two_factor::account_settings_endpoint,
        two_factor::update,
        two_factor::delete,
        two_factor::platform_settings,
        two_factor::save_platform_settings,
        two_factor::login_providers,
        two_factor::send_code,
        two_factor::check_code,
        two_factor::configured_login,
        two_factor::submit,
        users::send_activation_mail,
        reset::request_by_email,
        reset::check_token,
        reset::reset,
        sso::clients,
        sso::authorize,
        sso::callback,
        sso::callback_named,
    ),
    components(schemas(
        ErrorResponse,
        LoginRequest,
        JwtPair,
        RefreshTokenRequest,
        ChangePasswordRequest,
        ActivateUserRequest,
        EntityId,
        User,
        ApiKey,
        ApiKeyCreateRequest,
        ScopeGrant,
        PageDataApiKey,
        PageDataUser,
        UserInfo,
        PageDataUserInfo,
        PublicLoginRequest,
        UserPasswordPolicy,
        two_factor::PlatformTwoFaSettings,
        two_factor::ProviderConfig,
        two_factor::AccountConfigRequest,
        two_factor::AccountConfigUpdate,
        two_factor::PreVerificationToken,
        reset::ResetPasswordEmailRequest,
        reset::ResetPasswordRequest
    ))
)]
struct KeygateApi;

/// keygate's own document, with its security schemes, as JSON.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(KeygateApi::openapi()).unwrap_or(Value::Null);
    if let Some(components) = doc.get_mut("components").and_then(Value::as_object_mut) {
        components.insert("securitySchemes".into(), security_schemes());
    }
    doc
}

/// Both schemes put their credential where keygate reads it, the
/// `X-Authorization` header. `HttpLoginForm`: the page asks for a username and
/// password, posts them to `/api/auth/login` and sends the token it gets as
/// `X-Authorization: Bearer <token>` (the header, not HTTP Basic).
/// `ApiKeyForm`: the key, sent as `X-Authorization: ApiKey <key>` (the page
/// adds the prefix). Swagger UI renders descriptions as Markdown and drops
/// anything that looks like an HTML tag, so the header values are written as
/// code, where `<key>` shows as typed.
pub fn security_schemes() -> Value {
    serde_json::json!({
        "HttpLoginForm": {
            "type": "apiKey",
            "in": "header",
            "name": "X-Authorization",
            "description": "Log in with a username and password: the page posts them as JSON to `/api/auth/login` and sends the token it gets back as `X-Authorization: Bearer <token>`, refreshing it when it expires. The password is not kept."
        },
        "ApiKeyForm": {
            "type": "apiKey",
            "in": "header",
            "name": "X-Authorization",
            "description": "Paste the API key only: the page sends `X-Authorization: ApiKey <key>`."
        }
    })
}

/// The security requirement of an authenticated operation.
pub fn secured() -> Value {
    serde_json::json!([{ "HttpLoginForm": [] }, { "ApiKeyForm": [] }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Access, ROUTES};

    #[test]
    fn every_owned_route_is_in_the_document_with_its_security() {
        let doc = document();
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        for route in ROUTES {
            let method = route.method.as_str().to_lowercase();
            let operation = &doc["paths"][route.pattern][&method];
            assert!(
                operation.is_object(),
                "{} {} is missing from the document",
                route.method,
                route.pattern
            );
            let security = operation.get("security").cloned().unwrap_or(Value::Null);
            match route.access {
                Access::Authenticated | Access::Configuring => {
                    assert_eq!(security, secured(), "{}", route.pattern)
                }
                Access::PreVerification | Access::MfaConfiguration => assert_eq!(
                    security,
                    serde_json::json!([{ "HttpLoginForm": [] }]),
                    "{}",
                    route.pattern
                ),
                Access::Public => assert!(
                    security.is_null() || security == serde_json::json!([{}]),
                    "{}",
                    route.pattern
                ),
            }
            // A link the platform answers with a redirect has no 200.
            assert!(
                ["200", "302", "303"]
                    .iter()
                    .any(|status| operation["responses"][status].is_object()),
                "{}",
                route.pattern
            );
        }
        let documented: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p.as_object().unwrap().len())
            .sum();
        assert_eq!(
            documented,
            ROUTES.len(),
            "the document lists an operation the router does not serve"
        );
    }

    /// Text outside Markdown code spans, where Swagger UI would take
    /// `<token>` for an HTML tag and drop it.
    fn outside_code(markdown: &str) -> String {
        markdown.split('`').step_by(2).collect()
    }

    #[test]
    fn security_schemes_show_their_header_values_and_claim_no_basic_auth() {
        let schemes = security_schemes();
        for (name, shown) in [
            ("HttpLoginForm", "`X-Authorization: Bearer <token>`"),
            ("ApiKeyForm", "`X-Authorization: ApiKey <key>`"),
        ] {
            let scheme = &schemes[name];
            let description = scheme["description"].as_str().unwrap();
            assert!(description.contains(shown), "{name}: {description}");
            assert!(
                !outside_code(description).contains(['<', '>']),
                "{name}: a tag-like word outside code vanishes on the page: {description}"
            );
            assert_eq!(scheme["in"], "header", "{name}");
            assert_eq!(scheme["name"], "X-Authorization", "{name}");
            assert_ne!(
                scheme["type"], "http",
                "{name}: keygate takes no Authorization: Basic"
            );
        }
        assert!(
            schemes["HttpLoginForm"]["description"]
                .as_str()
                .unwrap()
                .contains("`/api/auth/login`")
        );
        assert_eq!(document()["components"]["securitySchemes"], schemes);
    }

    #[test]
    fn key_schemas_show_scopes_with_an_example() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for name in ["ApiKey", "ApiKeyCreateRequest"] {
            let scopes = schemas[name]["properties"]["scopes"].to_string();
            assert!(scopes.contains("ScopeGrant"), "{name}: {scopes}");
            assert!(
                scopes.contains("/api/device/"),
                "{name}: no example: {scopes}"
            );
        }
        let grant = &schemas["ScopeGrant"]["properties"];
        assert!(
            grant["path"].is_object() && grant["methods"].is_object(),
            "{grant}"
        );
    }

    #[test]
    fn error_responses_carry_examples() {
        let doc = document();
        let unauthorized = &doc["paths"]["/api/auth/login"]["post"]["responses"]["401"];
        let example = &unauthorized["content"]["application/json"]["example"];
        assert_eq!(example["errorCode"], 10, "{unauthorized}");
        assert!(doc["components"]["securitySchemes"]["ApiKeyForm"].is_object());
    }
}
