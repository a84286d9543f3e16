//! The request and response bodies of the endpoints keygate answers itself,
//! each one type that both (de)serialises and describes itself in the OpenAPI
//! document, and the error responses the document shows, declared once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, response::Response};
use utoipa::{IntoResponses, ToSchema};

use super::records::EntityId;
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
}

/// One documented error answer: its status, what it means, and an example
/// body taken from the error keygate really answers.
struct ErrorExample {
    description: &'static str,
    error: fn() -> ApiError,
}

const BAD_REQUEST: ErrorExample = ErrorExample {
    description: "Bad body or parameter",
    error: || ApiError::bad_request("Invalid request body: missing field `password`"),
};
const UNAUTHENTICATED: ErrorExample = ErrorExample {
    description: "No valid credential",
    error: ApiError::authentication_failed,
};
const WRONG_CREDENTIALS: ErrorExample = ErrorExample {
    description: "Wrong username or password, disabled or locked account",
    error: ApiError::invalid_credentials,
};
const TOKEN_EXPIRED: ErrorExample = ErrorExample {
    description: "Token expired, badly signed or outdated",
    error: ApiError::token_expired,
};
const FORBIDDEN: ErrorExample = ErrorExample {
    description: "Not allowed",
    error: ApiError::permission_denied,
};
const NOT_FOUND: ErrorExample = ErrorExample {
    description: "Not found or not visible",
    error: ApiError::not_found,
};
const TOO_MANY_REQUESTS: ErrorExample = ErrorExample {
    description: "Too many failed logins; see Retry-After",
    error: || ApiError::too_many_requests(1),
};

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
