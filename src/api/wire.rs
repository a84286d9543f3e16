//! The request and response bodies of the endpoints keygate answers itself,
//! each one type that both (de)serialises and describes itself in the OpenAPI
//! document, and the error responses the document shows, declared once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, response::Response};
use utoipa::{IntoResponses, ToSchema};

use super::records::{EntityId, ScopeGrant};
use crate::error::{ApiError, ErrorResponse};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    #[schema(example = "tenant@example.com")]
    pub username: String,
    #[schema(example = "a-long-password")]
    pub password: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtPair {
    /// HS512 access token.
    pub token: String,
    pub refresh_token: String,
}

/// The body of `POST /api/auth/login/public`: the public customer's id.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublicLoginRequest {
    #[schema(example = "784f394c-42b6-435a-983c-b7beff2784f9")]
    pub public_id: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshTokenRequest {
    pub refresh_token: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangePasswordRequest {
    pub current_password: String,
    pub new_password: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivateUserRequest {
    pub activate_token: String,
    pub password: String,
}

// A missing description is an empty one.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyCreateRequest {
    pub user_id: EntityId,
    #[schema(value_type = String, required = true)]
    pub description: Option<String>,
    pub enabled: Option<bool>,
    pub expiration_time: Option<i64>,
    /// Limits the key to these grants, fixed at creation; absent or null:
    /// the key has its owner's full rights. Read field by field, so a
    /// malformed grant is a 400 naming its field.
    #[schema(value_type = Option<Vec<ScopeGrant>>, example = json!([
        {"path": "/api/device/", "methods": ["GET", "POST"]},
        {"path": "/api/auth/user", "methods": ["GET"]}
    ]))]
    pub scopes: Option<serde_json::Value>,
}

/// One documented error answer: its status, what it means, and an example
/// body taken from the error keygate really answers.
struct ErrorExample {
    description: &'static str,
    error: fn() -> ApiError,
}

const fn example(description: &'static str, error: fn() -> ApiError) -> ErrorExample {
    ErrorExample { description, error }
}

const BAD_REQUEST: ErrorExample = example("Bad body or parameter", || {
    ApiError::bad_request("Invalid request body: missing field `password`")
});
const UNAUTHENTICATED: ErrorExample =
    example("No valid credential", ApiError::authentication_failed);
const WRONG_CREDENTIALS: ErrorExample = example(
    "Wrong username or password, disabled or locked account",
    ApiError::invalid_credentials,
);
const TOKEN_EXPIRED: ErrorExample = example(
    "Token expired, badly signed or outdated",
    ApiError::token_expired,
);
const FORBIDDEN: ErrorExample = example("Not allowed", ApiError::permission_denied);
const NOT_FOUND: ErrorExample = example("Not found or not visible", ApiError::not_found);
const TOO_MANY_REQUESTS: ErrorExample = example("Too many failed logins; see Retry-After", || {
    ApiError::too_many_requests(1)
});

/// The timestamp the document's examples show.
const EXAMPLE_TIMESTAMP: i64 = 1_700_000_000_000;

fn error_responses(examples: &[ErrorExample]) -> BTreeMap<String, RefOr<Response>> {
    examples
        .iter()
        .map(|example| {
            let error = (example.error)();
            let body = ErrorResponse::of(&error, EXAMPLE_TIMESTAMP);
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorResponse")))
                .example(serde_json::to_value(body).ok())
                .build();
            let response = ResponseBuilder::new()
                .description(example.description)
                .content("application/json", content)
                .build();
            (error.status.as_str().to_string(), response.into())
        })
        .collect()
}

/// Declares sets of error responses, for the `responses(...)` of operations.
macro_rules! error_sets {
    ($($(#[$doc:meta])* $name:ident = [$($example:ident),+];)+) => {
        $(
            $(#[$doc])*
            pub struct $name;

            impl IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    error_responses(&[$($example),+])
                }
            }
        )+
    };
}

error_sets! {
    /// A login: bad body, wrong credentials, rate limited.
    LoginErrors = [BAD_REQUEST, WRONG_CREDENTIALS, TOO_MANY_REQUESTS];
    /// A refresh: bad body, a refresh token that no longer works.
    RefreshErrors = [BAD_REQUEST, TOKEN_EXPIRED];
    /// An authenticated operation without a body or parameters.
    CredentialErrors = [UNAUTHENTICATED];
    /// An authenticated operation whose token may have run out.
    TokenErrors = [TOKEN_EXPIRED];
    /// An operation with a body, on no one else's records.
    BodyErrors = [BAD_REQUEST, UNAUTHENTICATED];
    /// A listing in the caller's scope.
    ListErrors = [BAD_REQUEST, UNAUTHENTICATED, FORBIDDEN];
    /// An operation on a record the caller must be allowed to manage.
    ManageErrors = [BAD_REQUEST, UNAUTHENTICATED, FORBIDDEN, NOT_FOUND];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_request_names_its_owner_by_id_alone() {
        let id = uuid::Uuid::from_u128(7);
        let body = format!(r#"{{"userId": {{"id": "{id}"}}, "extra": 1}}"#);
        let request: ApiKeyCreateRequest = serde_json::from_str(&body).unwrap();
        assert_eq!(request.user_id.id, id);
        assert_eq!(request.description, None, "left out means empty");
        let typed = format!(r#"{{"userId": {{"entityType": "USER", "id": "{id}"}}}}"#);
        let request: ApiKeyCreateRequest = serde_json::from_str(&typed).unwrap();
        assert_eq!(request.user_id.id, id);
    }

    #[test]
    fn login_body_with_an_unknown_field_is_refused() {
        let body = r#"{"username": "u", "password": "p", "admin": true}"#;
        assert!(serde_json::from_str::<LoginRequest>(body).is_err());
    }

    #[test]
    fn documented_errors_show_the_bodies_keygate_answers() {
        let responses = ManageErrors::responses();
        let codes: Vec<&str> = responses.keys().map(String::as_str).collect();
        assert_eq!(codes, ["400", "401", "403", "404"]);
        let doc = serde_json::to_value(&responses["404"]).unwrap();
        let example = &doc["content"]["application/json"]["example"];
        let not_found = ApiError::not_found();
        assert_eq!(example["errorCode"], not_found.code);
        assert_eq!(example["message"], not_found.message.as_ref());
        assert_eq!(example["status"], 404);
    }
}
