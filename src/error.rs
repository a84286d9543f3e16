//! The contract's error type and its one conversion into a response.
//!
//! Every error keygate answers itself, or about an upstream it could not reach,
//! leaves through [`ApiError::into_response`] as
//! `{"status","message","errorCode","timestamp"}` with `Content-Type: application/json`.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::{self, Body};

/// Contract error codes.
pub mod code {
    pub const GENERAL: u16 = 2;
    pub const AUTHENTICATION: u16 = 10;
    pub const TOKEN_EXPIRED: u16 = 11;
    pub const PERMISSION_DENIED: u16 = 20;
    pub const BAD_REQUEST_PARAMS: u16 = 31;
    pub const ITEM_NOT_FOUND: u16 = 32;
    pub const TOO_MANY_REQUESTS: u16 = 33;
}

/// The message of a pre-verification token used as an access token.
pub const SECOND_FACTOR_PENDING: &str =
    "A second factor is pending: finish the login at /api/auth/2fa/verification/check first";

/// The contract's error body.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"status": 401, "message": "Authentication failed", "errorCode": 10, "timestamp": 1_700_000_000_000_i64}))]
pub struct ErrorResponse {
    pub status: u16,
    pub message: String,
    /// 2 general, 10 authentication, 11 token expired, 15 credentials expired,
    /// 20 permission denied, 30/31 bad arguments, 32 not found, 33 too many requests.
    pub error_code: u16,
    /// Epoch milliseconds.
    pub timestamp: i64,
}

impl ErrorResponse {
    /// The body of `error` at `timestamp` (epoch ms).
    pub fn of(error: &ApiError, timestamp: i64) -> ErrorResponse {
        ErrorResponse {
            status: error.status.as_u16(),
            message: error.message.to_string(),
            error_code: error.code,
            timestamp,
        }
    }
}

/// An error in the contract's shape. Messages never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: u16,
    pub message: Cow<'static, str>,
    /// Seconds for `Retry-After` (429 only).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub const fn new(status: StatusCode, code: u16, message: &'static str) -> Self {
        ApiError {
            status,
            code,
            message: Cow::Borrowed(message),
            retry_after: None,
        }
    }

    pub fn with_message(status: StatusCode, code: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: Cow::Owned(message.into()),
            retry_after: None,
        }
    }

    /// No credentials, an unknown scheme or a malformed credential header.
    pub const fn authentication_failed() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            "Authentication failed",
        )
    }
    /// Wrong password, unknown user or key, malformed token.
    pub const fn invalid_credentials() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            "Invalid username or password",
        )
    }
    pub const fn not_active() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            "User account is not active",
        )
    }
    pub const fn locked() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            "User account is locked due to security policy",
        )
    }
    pub const fn api_key_expired() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            "API key is expired",
        )
    }
    /// Expired, badly signed or outdated token: code 11 makes the web UI refresh.
    pub const fn token_expired() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::TOKEN_EXPIRED,
            "Token has expired",
        )
    }
    pub const fn permission_denied() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::PERMISSION_DENIED,
            "You don't have permission to perform this operation!",
        )
    }
    /// A scoped API key asked for what its grants do not hold. Names neither
    /// the key nor its grants.
    pub const fn out_of_scope() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::PERMISSION_DENIED,
            "This API key's scopes do not allow this request",
        )
    }

    /// A pre-verification token where an access token is needed: says
    /// what to do instead of calling a right password wrong.
    pub const fn second_factor_pending() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            code::AUTHENTICATION,
            SECOND_FACTOR_PENDING,
        )
    }
    /// An API key, scoped or not, on an endpoint that changes a second
    /// factor: that needs a signed-in session.
    pub const fn session_required() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::PERMISSION_DENIED,
            "Second-factor settings change only in a signed-in session: an API key cannot change them",
        )
    }

    pub const fn api_key_over_plain_http() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::PERMISSION_DENIED,
            "API keys are accepted only over HTTPS",
        )
    }
    /// A password, refresh token or Bearer token sent in clear from a peer that
    /// is neither loopback nor a trusted proxy reporting https.
    pub const fn credentials_over_plain_http() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            code::PERMISSION_DENIED,
            "Passwords and tokens are accepted only over HTTPS",
        )
    }
    pub const fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            code::ITEM_NOT_FOUND,
            "Requested item wasn't found!",
        )
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::with_message(StatusCode::BAD_REQUEST, code::BAD_REQUEST_PARAMS, message)
    }
    pub const fn body_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::BAD_REQUEST_PARAMS,
            "Request body is too large",
        )
    }
    /// The body did not arrive in time. The response also closes the
    /// connection (RFC 9110, 15.5.9): what is left of the body is never read.
    pub const fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            code::BAD_REQUEST_PARAMS,
            "Request body was not received in time",
        )
    }
    pub const fn headers_too_large() -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            code::BAD_REQUEST_PARAMS,
            "Request header fields are too large",
        )
    }
    pub fn too_many_requests(retry_after_secs: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after_secs.max(1)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                code::TOO_MANY_REQUESTS,
                "Too many requests",
            )
        }
    }
    pub const fn bad_gateway() -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            code::GENERAL,
            "Upstream service is unavailable",
        )
    }
    /// keygate could not make a TLS connection to an `https://` upstream
    /// (its certificate not trusted, or keygate's refused): the client is
    /// told no more, the log says why.
    pub const fn upstream_tls_failed() -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            code::GENERAL,
            "Upstream service is unavailable: the TLS handshake with it failed",
        )
    }
    /// The upstream has every connection it may have in use, and none came
    /// free in time: a short wait is worth a retry.
    pub fn upstream_busy() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::GENERAL,
                "Upstream service is busy",
            )
        }
    }
    pub const fn gateway_timeout() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            code::GENERAL,
            "Upstream service did not answer in time",
        )
    }
    pub const fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            code::GENERAL,
            "Internal server error",
        )
    }
    pub const fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::GENERAL,
            "Service is temporarily unavailable",
        )
    }

    /// The JSON body of this error, with the current time.
    pub fn to_json(&self) -> String {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        // Through a `Value`, whose keys are sorted: the bytes clients have always seen.
        serde_json::to_value(ErrorResponse::of(self, timestamp))
            .map(|body| body.to_string())
            .unwrap_or_default()
    }

    pub fn into_response(self) -> Response<Body> {
        let mut response = Response::new(body::full(Bytes::from(self.to_json())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (code {}): {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

/// A store failure: logged here, answered as a general 503.
impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        tracing::error!(target: "keygate::api", %error, "store operation failed");
        ApiError::unavailable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn error_response_has_contract_shape() {
        let response = ApiError::token_expired().into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["status"], 401);
        assert_eq!(json["errorCode"], 11);
        assert_eq!(json["message"], "Token has expired");
        assert!(json["timestamp"].as_u64().unwrap() > 1_600_000_000_000);
    }

    #[test]
    fn request_timeout_closes_the_connection() {
        let response = ApiError::request_timeout().into_response();
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(response.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn too_many_requests_carries_retry_after() {
        let response = ApiError::too_many_requests(7).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
    }
}
