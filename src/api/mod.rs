//! Endpoints keygate answers itself: a static route table, the dispatch, and
//! the small request and response helpers they share. Every rejection, including
//! a bad body or a wrong method, is a contract error.

pub(crate) mod access;
pub(crate) mod jwks;
pub(crate) mod keys;
pub(crate) mod openapi;
pub(crate) mod records;
pub(crate) mod reset;
pub(crate) mod session;
pub(crate) mod sso;
pub(crate) mod two_factor;
pub(crate) mod users;
pub(crate) mod wire;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use uuid::Uuid;

use crate::accounts::AccountError;
use crate::address::AddressKey;
use crate::auth::Authenticator;
use crate::auth::limiter::LoginLimiter;
pub use crate::auth::scope::Effect;
use crate::body::{self, Body};
use crate::config::{HttpLimits, Settings};
use crate::error::ApiError;
use crate::identity::Identity;
use crate::shared_limits::budget::Budgets;
use crate::store::{Published, Store};
use crate::telemetry::Metrics;

/// Largest body an owned endpoint reads.
pub const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential needed (login, refresh).
    Public,
    /// The normal credential check runs first.
    Authenticated,
    /// A pre-verification token only (a login waiting for its second
    /// factor), which the handler checks; the normal check refuses it.
    PreVerification,
    /// The normal credential, or an MFA configuration token (a login that
    /// must configure a second factor first), which the handler checks.
    Configuring,
    /// An MFA configuration token only, which the handler checks; the
    /// normal check refuses it.
    MfaConfiguration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Login,
    PublicLogin,
    Refresh,
    Logout,
    CurrentUser,
    ChangePassword,
    CreateApiKey,
    ListApiKeys,
    DescribeApiKey,
    EnableApiKey,
    DeleteApiKey,
    SaveUser,
    GetUser,
    ListUsers,
    AllUserInfos,
    TenantAdmins,
    CustomerUsers,
    CustomerUserInfos,
    DeleteUser,
    EnableUser,
    ActivationLink,
    CheckActivateToken,
    Activate,
    Jwks,
    PasswordPolicy,
    TwoFaProviders,
    TwoFaGenerate,
    TwoFaSave,
    TwoFaAccountSettings,
    TwoFaUpdate,
    TwoFaDelete,
    TwoFaPlatformSettings,
    TwoFaSavePlatformSettings,
    TwoFaLoginProviders,
    TwoFaSendCode,
    TwoFaCheckCode,
    TwoFaConfiguredLogin,
    TwoFaSubmit,
    SendActivationMail,
    RequestPasswordReset,
    CheckResetToken,
    ResetPassword,
    SsoClients,
    SsoAuthorize,
    SsoCallback,
    SsoCallbackNamed,
}

impl Endpoint {
    /// May a public customer's public user call it? Only what a public user
    /// of the platform can use of keygate's own endpoints: who it is, and
    /// logging out. Every account operation (password, API keys, second
    /// factors, users) is refused with 403: it has no account.
    pub fn opens_to_public(self) -> bool {
        matches!(self, Endpoint::CurrentUser | Endpoint::Logout)
    }

    /// Does it change the caller's second factor? Then it needs an
    /// interactive session: a token of a session keygate opened (a password,
    /// and the second factor when one was due), or on the routes that take
    /// one an MFA configuration token. An API key, scoped or not, never
    /// removes or replaces its owner's second factor.
    pub fn needs_session(self) -> bool {
        matches!(
            self,
            Endpoint::TwoFaGenerate
                | Endpoint::TwoFaSave
                | Endpoint::TwoFaSubmit
                | Endpoint::TwoFaUpdate
                | Endpoint::TwoFaDelete
        )
    }
}

/// One owned route: `{name}` segments match any one path segment.
#[derive(Debug)]
pub struct EndpointRoute {
    pub method: Method,
    pub pattern: &'static str,
    pub access: Access,
    pub endpoint: Endpoint,
    /// What it does, whatever its method ([`Effect`]): a credential is
    /// never a scoped key's.
    pub effect: Effect,
}

/// Every endpoint keygate answers itself.
pub static ROUTES: &[EndpointRoute] = &[
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/login",
        access: Access::Public,
        endpoint: Endpoint::Login,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/login/public",
        access: Access::Public,
        endpoint: Endpoint::PublicLogin,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/token",
        access: Access::Public,
        endpoint: Endpoint::Refresh,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/logout",
        access: Access::Authenticated,
        endpoint: Endpoint::Logout,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/auth/user",
        access: Access::Authenticated,
        endpoint: Endpoint::CurrentUser,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/changePassword",
        access: Access::Authenticated,
        endpoint: Endpoint::ChangePassword,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/apiKey",
        access: Access::Authenticated,
        endpoint: Endpoint::CreateApiKey,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/apiKeys/{userId}",
        access: Access::Authenticated,
        endpoint: Endpoint::ListApiKeys,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::PUT,
        pattern: "/api/apiKey/{id}/description",
        access: Access::Authenticated,
        endpoint: Endpoint::DescribeApiKey,
        effect: Effect::Write,
    },
    EndpointRoute {
        method: Method::PUT,
        pattern: "/api/apiKey/{id}/enabled/{enabled}",
        access: Access::Authenticated,
        endpoint: Endpoint::EnableApiKey,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::DELETE,
        pattern: "/api/apiKey/{id}",
        access: Access::Authenticated,
        endpoint: Endpoint::DeleteApiKey,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/user",
        access: Access::Authenticated,
        endpoint: Endpoint::SaveUser,
        effect: Effect::Write,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/user/{id}",
        access: Access::Authenticated,
        endpoint: Endpoint::GetUser,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::DELETE,
        pattern: "/api/user/{id}",
        access: Access::Authenticated,
        endpoint: Endpoint::DeleteUser,
        effect: Effect::Write,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/users",
        access: Access::Authenticated,
        endpoint: Endpoint::ListUsers,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/userInfos/all",
        access: Access::Authenticated,
        endpoint: Endpoint::AllUserInfos,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/tenant/{tenantId}/users",
        access: Access::Authenticated,
        endpoint: Endpoint::TenantAdmins,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/customer/{customerId}/users",
        access: Access::Authenticated,
        endpoint: Endpoint::CustomerUsers,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/customer/{customerId}/userInfos",
        access: Access::Authenticated,
        endpoint: Endpoint::CustomerUserInfos,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/user/{id}/userCredentialsEnabled",
        access: Access::Authenticated,
        endpoint: Endpoint::EnableUser,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/user/{id}/activationLink",
        access: Access::Authenticated,
        endpoint: Endpoint::ActivationLink,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/noauth/activate",
        access: Access::Public,
        endpoint: Endpoint::CheckActivateToken,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/noauth/activate",
        access: Access::Public,
        endpoint: Endpoint::Activate,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/.well-known/jwks.json",
        access: Access::Public,
        endpoint: Endpoint::Jwks,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/noauth/userPasswordPolicy",
        access: Access::Public,
        endpoint: Endpoint::PasswordPolicy,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/2fa/providers",
        access: Access::Configuring,
        endpoint: Endpoint::TwoFaProviders,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/2fa/account/config/generate",
        access: Access::Configuring,
        endpoint: Endpoint::TwoFaGenerate,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/2fa/account/config",
        access: Access::Configuring,
        endpoint: Endpoint::TwoFaSave,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/2fa/account/settings",
        access: Access::Configuring,
        endpoint: Endpoint::TwoFaAccountSettings,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::PUT,
        pattern: "/api/2fa/account/config",
        access: Access::Authenticated,
        endpoint: Endpoint::TwoFaUpdate,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::DELETE,
        pattern: "/api/2fa/account/config",
        access: Access::Authenticated,
        endpoint: Endpoint::TwoFaDelete,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/2fa/settings",
        access: Access::Authenticated,
        endpoint: Endpoint::TwoFaPlatformSettings,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/2fa/settings",
        access: Access::Authenticated,
        endpoint: Endpoint::TwoFaSavePlatformSettings,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/auth/2fa/providers",
        access: Access::PreVerification,
        endpoint: Endpoint::TwoFaLoginProviders,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/2fa/verification/send",
        access: Access::PreVerification,
        endpoint: Endpoint::TwoFaSendCode,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/2fa/verification/check",
        access: Access::PreVerification,
        endpoint: Endpoint::TwoFaCheckCode,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/auth/2fa/login",
        access: Access::MfaConfiguration,
        endpoint: Endpoint::TwoFaConfiguredLogin,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/2fa/account/config/submit",
        access: Access::Configuring,
        endpoint: Endpoint::TwoFaSubmit,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/user/sendActivationMail",
        access: Access::Authenticated,
        endpoint: Endpoint::SendActivationMail,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/noauth/resetPasswordByEmail",
        access: Access::Public,
        endpoint: Endpoint::RequestPasswordReset,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/api/noauth/resetPassword",
        access: Access::Public,
        endpoint: Endpoint::CheckResetToken,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/noauth/resetPassword",
        access: Access::Public,
        endpoint: Endpoint::ResetPassword,
        effect: Effect::Credential,
    },
    // Single sign-on (`OAuth2Controller` and the platform's OAuth2 login
    // filter): the login page's list reads; the redirect to a provider starts
    // a login and the callback mints a token pair.
    EndpointRoute {
        method: Method::POST,
        pattern: "/api/noauth/oauth2Clients",
        access: Access::Public,
        endpoint: Endpoint::SsoClients,
        effect: Effect::Read,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/oauth2/authorization/{name}",
        access: Access::Public,
        endpoint: Endpoint::SsoAuthorize,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/login/oauth2/code/",
        access: Access::Public,
        endpoint: Endpoint::SsoCallback,
        effect: Effect::Credential,
    },
    EndpointRoute {
        method: Method::GET,
        pattern: "/login/oauth2/code/{name}",
        access: Access::Public,
        endpoint: Endpoint::SsoCallbackNamed,
        effect: Effect::Credential,
    },
];

/// The user-entity endpoints the platform answers while the sync is on
/// (`[platform] database_url`): it owns user records then, and keygate
/// forwards these to its route `[platform] upstream`. The platform's own
/// paths (`UserController`); keygate keeps every credential endpoint.
/// `/api/user/{id}/userCredentialsEnabled` and the activation link change
/// the platform's `user_credentials` row, which the sync carries back (a
/// disable revokes at the next round); an invitation the platform issues
/// works at once ([`crate::import::lookup_token`]).
const PLATFORM_USER_PATHS: &[&str] = &[
    "/api/user",
    "/api/user/{id}",
    "/api/user/{id}/userCredentialsEnabled",
    "/api/user/{id}/activationLink",
    "/api/user/{id}/activationLinkInfo",
    "/api/users",
    "/api/users/info",
    "/api/tenant/{id}/users",
    "/api/customer/{id}/users",
    "/api/customer/{id}/userInfos",
];

/// Prefixes of the platform's user endpoints with paths below them.
const PLATFORM_USER_PREFIXES: &[&str] = &["/api/userInfos/", "/api/user/settings/"];

/// Whether a normalised path is a user-entity endpoint the platform
/// answers while the sync is on ([`PLATFORM_USER_PATHS`]).
pub fn platform_owns(path: &str) -> bool {
    PLATFORM_USER_PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
        || PLATFORM_USER_PATHS
            .iter()
            .any(|pattern| match_pattern(pattern, path).is_some())
}

/// The platform's endpoints that mint, reveal, replace or remove a
/// credential ([`Effect::Credential`]), as its controllers name them
/// (`AuthController`, the login filters, `TwoFactorAuthController`,
/// `TwoFactorAuthConfigController`, `ApiKeyController`, `UserController`,
/// `AdminController`). A forwarded request to one of them is a credential,
/// whatever its method and whatever route carries it: keygate answers most
/// of these itself, but with the sync on the user endpoints go to the
/// platform's route, and any route may reach a platform.
pub const PLATFORM_CREDENTIAL_PATHS: &[&str] = &[
    // Login filters and `AuthController`.
    "/api/auth/login",
    "/api/auth/login/public",
    "/api/auth/token",
    "/api/auth/logout",
    "/api/auth/changePassword",
    "/api/noauth/activate",
    "/api/noauth/resetPasswordByEmail",
    "/api/noauth/resetPassword",
    // `TwoFactorAuthController` (the login's second step).
    "/api/auth/2fa/verification/send",
    "/api/auth/2fa/verification/check",
    "/api/auth/2fa/login",
    // `TwoFactorAuthConfigController`.
    "/api/2fa/account/config/generate",
    "/api/2fa/account/config/submit",
    "/api/2fa/account/config",
    "/api/2fa/settings",
    // `ApiKeyController` (listing, `/api/apiKeys/{userId}`, shows no value).
    "/api/apiKey",
    "/api/apiKey/{id}",
    "/api/apiKey/{id}/enabled/{enabled}",
    // `UserController`: log in as the user, activation links, the
    // account's credentials switched on or off.
    "/api/user/{id}/token",
    "/api/user/{id}/activationLink",
    "/api/user/{id}/activationLinkInfo",
    "/api/user/sendActivationMail",
    "/api/user/{id}/userCredentialsEnabled",
    // `AdminController`: the key every platform token is signed with.
    "/api/admin/jwtSettings",
    // The OAuth2 login filters: a sign-in's start and its callback (asked
    // without its trailing `/`).
    "/oauth2/authorization/{id}",
    "/login/oauth2/code",
    "/login/oauth2/code/{id}",
];

/// What a forwarded request to the normalised `path` does: a credential
/// when the path is one of [`PLATFORM_CREDENTIAL_PATHS`], else what its
/// upstream makes of it. Asked only for a scoped key.
pub fn proxied_effect(path: &str) -> Effect {
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    if PLATFORM_CREDENTIAL_PATHS
        .iter()
        .any(|pattern| matches_pattern(pattern, path))
    {
        Effect::Credential
    } else {
        Effect::Upstream
    }
}

/// A matched owned route and its path parameters.
#[derive(Debug)]
pub struct Matched {
    pub route: &'static EndpointRoute,
    pub params: Vec<String>,
}

/// Finds the owned route for a normalised path. A path that is owned but asked
/// with another method is a 405; a path that is not owned is `Ok(None)`.
pub fn find(method: &Method, path: &str) -> Result<Option<Matched>, ApiError> {
    let mut path_owned = false;
    for route in candidates(path) {
        if let Some(params) = match_pattern(route.pattern, path) {
            if route.method == *method {
                return Ok(Some(Matched { route, params }));
            }
            path_owned = true;
        }
    }
    if path_owned {
        return Err(ApiError::with_message(
            StatusCode::METHOD_NOT_ALLOWED,
            crate::error::code::BAD_REQUEST_PARAMS,
            format!("Request method '{method}' is not supported"),
        ));
    }
    Ok(None)
}

/// The first two segments of a path (`/api/auth` of `/api/auth/login`), or
/// the whole path when it has fewer.
fn stem(path: &str) -> &str {
    let third_slash = path
        .bytes()
        .enumerate()
        .filter(|(_, b)| *b == b'/')
        .nth(2)
        .map(|(at, _)| at);
    match third_slash {
        Some(at) => &path[..at],
        None => path,
    }
}

/// The owned routes a path may match. Every proxied request asks this table
/// first, twice on the lean path: scanning all of [`ROUTES`] for each was
/// the first keygate symbol of the request path's profile (2% of all
/// samples under `benches/run --perf`), so the routes are indexed once by
/// their [`stem`], and a path looks up its own. A pattern with a parameter
/// within its first two segments would be asked for every path.
fn candidates(path: &str) -> impl Iterator<Item = &'static EndpointRoute> {
    use std::collections::HashMap;
    use std::sync::LazyLock;
    struct Index {
        /// Keys are the patterns' stems: a path's stem can only be
        /// looked up ([`crate::fnv`]).
        by_stem: HashMap<&'static str, Vec<&'static EndpointRoute>, crate::fnv::OwnKeys>,
        anywhere: Vec<&'static EndpointRoute>,
    }
    static INDEX: LazyLock<Index> = LazyLock::new(|| {
        let mut index = Index {
            by_stem: HashMap::default(),
            anywhere: Vec::new(),
        };
        for route in ROUTES {
            let stem = stem(route.pattern);
            if stem.contains('{') {
                index.anywhere.push(route);
            } else {
                index.by_stem.entry(stem).or_default().push(route);
            }
        }
        index
    });
    let index = &*INDEX;
    index
        .by_stem
        .get(stem(path))
        .into_iter()
        .flatten()
        .chain(&index.anywhere)
        .copied()
}

/// Does `path` match `pattern` ([`match_pattern`], without keeping the
/// parameters)? Asked for every request of a scoped key.
fn matches_pattern(pattern: &str, path: &str) -> bool {
    let mut pattern_parts = pattern.split('/');
    let mut path_parts = path.split('/');
    loop {
        match (pattern_parts.next(), path_parts.next()) {
            (None, None) => return true,
            (Some(p), Some(s)) if p.starts_with('{') && p.ends_with('}') && !s.is_empty() => {}
            (Some(p), Some(s)) if p == s => {}
            _ => return false,
        }
    }
}

fn match_pattern(pattern: &str, path: &str) -> Option<Vec<String>> {
    let mut params = Vec::new();
    let mut pattern_parts = pattern.split('/');
    let mut path_parts = path.split('/');
    loop {
        match (pattern_parts.next(), path_parts.next()) {
            (None, None) => return Some(params),
            (Some(p), Some(s)) if p.starts_with('{') && p.ends_with('}') && !s.is_empty() => {
                params.push(s.to_string());
            }
            (Some(p), Some(s)) if p == s => {}
            _ => return None,
        }
    }
}

/// What a handler gets: the verified identity (authenticated routes), the path
/// parameters, the query string, the body (bounded) and the real client address.
pub struct EndpointRequest {
    pub identity: Option<Identity>,
    pub params: Vec<String>,
    pub query: Option<String>,
    pub body: Bytes,
    pub client_ip: IpAddr,
    /// What per-address limits count the client by ([`AddressKey::of`]).
    pub client_key: AddressKey,
    /// May the request carry a password or token: it came over HTTPS (here or
    /// at a trusted proxy), from loopback, or plain HTTP credentials are allowed.
    pub may_send_secrets: bool,
    /// `scheme://host` clients use to reach keygate, for links: the configured
    /// public base URL, a trusted proxy's forwarded host, or the listener's
    /// address; never a client's own Host header.
    pub base_url: String,
    /// The bearer token of a [`Access::PreVerification`] or
    /// [`Access::MfaConfiguration`] route, or the MFA configuration token of
    /// an [`Access::Configuring`] route, which its handler verifies; `None`
    /// otherwise.
    pub bearer: Option<crate::auth::credential::Secret>,
    /// The single sign-on cookie ([`crate::sso::flow::COOKIE`]), when the
    /// request carries it once.
    pub sso_cookie: Option<String>,
}

impl EndpointRequest {
    /// A link to `path_and_query` on [`EndpointRequest::base_url`]: every
    /// link keygate writes (a mail's, a redirect's `Location`) is made here.
    pub fn link(&self, path_and_query: &str) -> String {
        debug_assert!(path_and_query.starts_with('/'));
        format!("{}{path_and_query}", self.base_url)
    }

    /// The identity of an authenticated route.
    pub fn identity(&self) -> Result<&Identity, ApiError> {
        self.identity
            .as_ref()
            .ok_or_else(ApiError::authentication_failed)
    }

    /// Parses the JSON body; a bad body is a 400 naming the problem.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            let detail = e.to_string();
            let detail = detail.split(" at line").next().unwrap_or(&detail);
            ApiError::bad_request(format!("Invalid request body: {detail}"))
        })
    }
}

/// Reads a request body up to [`MAX_BODY`] within `limits.body_read_timeout`;
/// larger is a 413, slower a 408 that also closes the connection (a trickled
/// body must not hold a connection and a handler open). What is left of a
/// refused body over HTTP/2 is discarded after the answer
/// ([`crate::body::discard_rest`]), so a client still uploading reads its 413.
pub(crate) async fn read_body<B>(
    req: http::Request<B>,
    limits: &HttpLimits,
) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let version = req.version();
    let mut body = Box::pin(req.into_body());
    let mut collected = Vec::new();
    let too_large = || ApiError::body_too_large();
    if http_body::Body::size_hint(&body)
        .exact()
        .is_some_and(|n| n > MAX_BODY as u64)
    {
        crate::body::discard_rest_if_http2(version, body, 0, limits);
        return Err(too_large());
    }
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|_| ApiError::bad_request("Request body could not be read"))?;
            if let Ok(data) = frame.into_data() {
                if collected.len() + data.len() > MAX_BODY {
                    return Err(too_large());
                }
                collected.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(limits.body_read_timeout, read).await {
        Ok(Ok(())) => Ok(Bytes::from(collected)),
        Ok(Err(error)) if error.status == StatusCode::PAYLOAD_TOO_LARGE => {
            crate::body::discard_rest_if_http2(version, body, MAX_BODY as u64, limits);
            Err(error)
        }
        Ok(Err(error)) => Err(error),
        Err(_) => Err(ApiError::request_timeout()),
    }
}

/// A 200 JSON response. The body goes through a `Value`, whose keys are
/// sorted: the bytes clients have always seen.
pub(crate) fn json_response(value: &impl serde::Serialize) -> Response<Body> {
    let text = serde_json::to_value(value)
        .map(|value| value.to_string())
        .unwrap_or_default();
    let mut response = Response::new(body::full(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A 303 to `link` ([`EndpointRequest::link`]), as the platform answers the
/// links it mails; never cached (it carries a one-time token).
pub(crate) fn see_other(link: &str) -> Result<Response<Body>, ApiError> {
    let location = HeaderValue::from_str(link)
        .map_err(|_| ApiError::bad_request("The token has characters a link cannot carry"))?;
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    response.headers_mut().insert(header::LOCATION, location);
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// A link keygate mails (an invitation, a reset), as its check answers it
/// ([`MailedLink::answer`]).
pub(crate) struct MailedLink {
    /// The page a valid token is sent on to, with the token's parameter:
    /// `/login/createPassword?activateToken=`.
    pub page: &'static str,
    /// The page an expired token is sent to.
    pub expired_page: &'static str,
    /// The 409's message for an unknown or used token.
    pub unknown: &'static str,
    /// The security log line of an unknown token.
    pub logged: &'static str,
}

impl MailedLink {
    /// The answer of the link's check, as the platform's `checkActivateToken`
    /// and `checkResetToken` give it: a valid token is sent on to the page,
    /// an expired one to the expired-link page (303s, on
    /// [`EndpointRequest::link`]); an unknown one is a 409, and keeps the
    /// address's failed attempt. Nothing is used up or replaced.
    pub(crate) async fn answer(
        &self,
        api: &Endpoints,
        req: &EndpointRequest,
        attempt: crate::auth::limiter::Attempt,
        found: crate::store::MailedToken,
        token: &str,
    ) -> Result<Response<Body>, ApiError> {
        use crate::store::MailedToken;
        let page = match found {
            MailedToken::Unknown => {
                tracing::info!(target: "keygate::security", client = %req.client_ip, "{}", self.logged);
                return Err(ApiError::with_message(
                    StatusCode::CONFLICT,
                    crate::error::code::BAD_REQUEST_PARAMS,
                    self.unknown,
                ));
            }
            MailedToken::Expired => self.expired_page.to_owned(),
            MailedToken::Valid(_) => format!("{}{}", self.page, encode_component(token)),
        };
        api.limiter.succeeded(attempt).await;
        see_other(&req.link(&page))
    }
}

/// `text` with every byte but RFC 3986's unreserved ones percent-encoded:
/// a token echoed into a query parameter of a link stays that parameter.
pub(crate) fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A 200 response with an empty body.
pub(crate) fn empty_response() -> Response<Body> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::OK;
    response
}

/// Everything the owned endpoints need.
pub struct Endpoints {
    pub store: Store,
    pub auth: Arc<Authenticator>,
    pub limiter: LoginLimiter,
    pub metrics: Arc<Metrics>,
    pub settings: Arc<Settings>,
    /// Bounds concurrent password hashing, so a login storm leaves cores for proxying.
    pub hashing: Hashing,
    /// Verified against when the user is unknown, so both cost the same.
    pub dummy_hash: String,
    /// Digests typed account names for the security log.
    pub log_digest: crate::telemetry::LogDigest,
    /// Users and API keys each user may still create in this window
    /// (`limits.management_writes_per_user`); `None`: no limit.
    pub writes: Option<Budgets<Uuid>>,
    /// The assertion signing keys, whose public halves the JWKS serves.
    pub key_ring: Arc<crate::identity::assertion::KeyRing>,
    /// Second factors: sealing, generated configs, wrong codes per attempt.
    pub two_factor: two_factor::TwoFactor,
    /// Outgoing mail; `None` when `[mail]` is not configured.
    pub mail: Option<crate::mail::Mailer>,
    /// Password reset requests handled in the background at once
    /// ([`reset::request_by_email`]).
    pub reset_work: Arc<tokio::sync::Semaphore>,
    /// Single sign-on providers (none when `[[oidc]]` is not configured).
    pub sso: Arc<crate::sso::Providers>,
}

impl Endpoints {
    /// Takes one of the caller's management writes (creating a user or an API
    /// key), or answers 429 with `Retry-After` when this window's are spent.
    pub(crate) fn charge_write(&self, identity: &Identity) -> Result<(), ApiError> {
        let Some(writes) = &self.writes else {
            return Ok(());
        };
        let user_id = identity.principal.user_id;
        match writes.take(user_id) {
            Ok(taken) => {
                drop(taken);
                Ok(())
            }
            Err(wait) => {
                self.metrics.rate_limited("management_writes");
                tracing::warn!(target: "keygate::security", %user_id, "management writes rate limited");
                Err(ApiError {
                    message: format!(
                        "Too many users and API keys created: at most {} per user; try again later",
                        writes.rate()
                    )
                    .into(),
                    ..ApiError::too_many_requests(wait.as_secs())
                })
            }
        }
    }
}

/// Password-hashing allowances: logins have their own, and everything else
/// (password changes, activations, re-hashes) another of the same size, so no
/// other endpoint can ever take the hashing capacity logins need; the
/// threads that hash, one per allowed hash, at their lower priority; and how
/// long a request may wait for its turn.
pub struct Hashing {
    pub login: tokio::sync::Semaphore,
    pub other: tokio::sync::Semaphore,
    pub threads: crate::auth::password::HashThreads,
    pub wait: std::time::Duration,
    /// One password check at a time per account, across both allowances.
    pub turns: crate::auth::password::Turns,
    /// `login.max_bcrypt_cost`: a stored bcrypt hash above it is refused
    /// without being run.
    pub max_bcrypt_cost: u32,
}

impl Hashing {
    pub fn new(settings: &crate::config::LoginSettings) -> Hashing {
        let per_purpose = settings.max_concurrent_hashes;
        Hashing {
            login: tokio::sync::Semaphore::new(per_purpose),
            other: tokio::sync::Semaphore::new(per_purpose),
            threads: crate::auth::password::HashThreads::new(2 * per_purpose, settings.hash_nice),
            wait: settings.hash_wait,
            turns: crate::auth::password::Turns::default(),
            max_bcrypt_cost: settings.max_bcrypt_cost,
        }
    }
}

impl Endpoints {
    /// Applies the revocation a store change published to this replica's
    /// caches, as its notification does on the others; returns what the
    /// change did.
    pub(crate) async fn applied<T>(&self, change: Published<T>) -> T {
        self.auth.revoke(change.revocation).await;
        change.outcome
    }

    pub async fn handle(
        &self,
        endpoint: Endpoint,
        req: EndpointRequest,
    ) -> Result<Response<Body>, ApiError> {
        if req
            .identity
            .as_ref()
            .is_some_and(|identity| identity.principal.is_public)
            && !endpoint.opens_to_public()
        {
            return Err(ApiError::permission_denied());
        }
        if endpoint.needs_session()
            && let Some(identity) = req.identity.as_ref().filter(|i| !i.is_session())
        {
            tracing::warn!(
                target: "keygate::security",
                key_id = %identity.credential_id(),
                user_id = %identity.principal.user_id,
                "an API key tried to change a second factor: refused"
            );
            return Err(ApiError::session_required());
        }
        match endpoint {
            Endpoint::Login => session::login(self, req).await,
            Endpoint::PublicLogin => session::public_login(self, req).await,
            Endpoint::Refresh => session::refresh(self, req).await,
            Endpoint::Logout => session::logout(self, req).await,
            Endpoint::CurrentUser => session::current_user(self, req).await,
            Endpoint::ChangePassword => session::change_password(self, req).await,
            Endpoint::CreateApiKey => keys::create(self, req).await,
            Endpoint::ListApiKeys => keys::list(self, req).await,
            Endpoint::DescribeApiKey => keys::describe(self, req).await,
            Endpoint::EnableApiKey => keys::set_enabled(self, req).await,
            Endpoint::DeleteApiKey => keys::delete(self, req).await,
            Endpoint::SaveUser => users::save(self, req).await,
            Endpoint::GetUser => users::get(self, req).await,
            Endpoint::ListUsers => users::list(self, req).await,
            Endpoint::AllUserInfos => users::all_user_infos(self, req).await,
            Endpoint::TenantAdmins => users::tenant_admins(self, req).await,
            Endpoint::CustomerUsers => users::customer_users(self, req).await,
            Endpoint::CustomerUserInfos => users::customer_user_infos(self, req).await,
            Endpoint::DeleteUser => users::delete(self, req).await,
            Endpoint::EnableUser => users::set_enabled(self, req).await,
            Endpoint::ActivationLink => users::activation_link(self, req).await,
            Endpoint::CheckActivateToken => users::check_activate_token(self, req).await,
            Endpoint::Activate => users::activate(self, req).await,
            Endpoint::Jwks => jwks::jwks(self, req).await,
            Endpoint::PasswordPolicy => users::password_policy(self, req).await,
            Endpoint::TwoFaProviders => two_factor::providers(self, req).await,
            Endpoint::TwoFaGenerate => two_factor::generate(self, req).await,
            Endpoint::TwoFaSave => two_factor::save(self, req).await,
            Endpoint::TwoFaAccountSettings => {
                two_factor::account_settings_endpoint(self, req).await
            }
            Endpoint::TwoFaUpdate => two_factor::update(self, req).await,
            Endpoint::TwoFaDelete => two_factor::delete(self, req).await,
            Endpoint::TwoFaPlatformSettings => two_factor::platform_settings(self, req).await,
            Endpoint::TwoFaSavePlatformSettings => {
                two_factor::save_platform_settings(self, req).await
            }
            Endpoint::TwoFaLoginProviders => two_factor::login_providers(self, req).await,
            Endpoint::TwoFaSendCode => two_factor::send_code(self, req).await,
            Endpoint::TwoFaCheckCode => two_factor::check_code(self, req).await,
            Endpoint::TwoFaConfiguredLogin => two_factor::configured_login(self, req).await,
            Endpoint::TwoFaSubmit => two_factor::submit(self, req).await,
            Endpoint::SendActivationMail => users::send_activation_mail(self, req).await,
            Endpoint::RequestPasswordReset => reset::request_by_email(self, req).await,
            Endpoint::CheckResetToken => reset::check_token(self, req).await,
            Endpoint::ResetPassword => reset::reset(self, req).await,
            Endpoint::SsoClients => sso::clients(self, req).await,
            Endpoint::SsoAuthorize => sso::authorize(self, req).await,
            Endpoint::SsoCallback => sso::callback(self, req).await,
            Endpoint::SsoCallbackNamed => sso::callback_named(self, req).await,
        }
    }
}

/// An account operation's failure as the client sees it: bad input is a 400;
/// a store that cannot answer or write (down, disk full) a 503, as every store
/// failure ([`From<StoreError>`](crate::store::StoreError)); anything else a 500.
impl From<AccountError> for ApiError {
    fn from(error: AccountError) -> Self {
        match error {
            AccountError::Invalid(message) => ApiError::bad_request(message),
            AccountError::Exists(email) => ApiError::bad_request(format!(
                "User with email '{email}' already present in database!"
            )),
            AccountError::Store(error) => error.into(),
            // Like any reach into another tenant; which tenant is not said.
            AccountError::ForeignCustomer(_) => ApiError::permission_denied(),
            AccountError::TooManyKeys(cap) => {
                ApiError::bad_request(AccountError::TooManyKeys(cap).to_string())
            }
            other => {
                tracing::error!(error = %other, "account operation failed");
                ApiError::internal()
            }
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_stem_index_finds_what_a_scan_of_every_route_finds() {
        let scan = |method: &Method, path: &str| {
            let mut owned = false;
            for route in ROUTES {
                if match_pattern(route.pattern, path).is_some() {
                    if route.method == *method {
                        return Some(route.pattern);
                    }
                    owned = true;
                }
            }
            owned.then_some("405")
        };
        let mut paths: Vec<String> = ROUTES
            .iter()
            .map(|r| r.pattern.replace("{", "x").replace("}", ""))
            .collect();
        paths.extend(
            [
                "/",
                "",
                "/api",
                "/api/",
                "/api/bench",
                "/api/auth",
                "/api/auth/",
                "/api/user/",
                "/api/tenant/devices",
                "/api/user/a/b/c",
                "/.well-known",
                "/api//auth/login",
            ]
            .map(String::from),
        );
        for path in &paths {
            for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE] {
                let found = match find(&method, path) {
                    Ok(Some(m)) => Some(m.route.pattern),
                    Ok(None) => None,
                    Err(_) => Some("405"),
                };
                assert_eq!(found, scan(&method, path), "{method} {path}");
            }
        }
        assert_eq!(stem("/api/auth/login"), "/api/auth");
        assert_eq!(stem("/api/user"), "/api/user");
        assert_eq!(stem("/.well-known/jwks.json"), "/.well-known/jwks.json");
    }

    use super::*;

    #[test]
    fn with_the_sync_on_user_records_go_to_the_platform_and_credentials_stay() {
        let id = "784f394c-42b6-435a-983c-b7beff2784f9";
        for path in [
            "/api/user".to_owned(),
            format!("/api/user/{id}"),
            format!("/api/user/{id}/userCredentialsEnabled"),
            format!("/api/user/{id}/activationLink"),
            "/api/user/sendActivationMail".to_owned(),
            "/api/user/settings".to_owned(),
            "/api/user/settings/general".to_owned(),
            "/api/users".to_owned(),
            "/api/users/info".to_owned(),
            "/api/userInfos/all".to_owned(),
            format!("/api/tenant/{id}/users"),
            format!("/api/customer/{id}/users"),
            format!("/api/customer/{id}/userInfos"),
        ] {
            assert!(platform_owns(&path), "{path} is the platform's");
        }
        for path in [
            "/api/auth/login".to_owned(),
            "/api/auth/token".to_owned(),
            "/api/auth/logout".to_owned(),
            "/api/auth/user".to_owned(),
            "/api/auth/changePassword".to_owned(),
            "/api/noauth/activate".to_owned(),
            "/api/apiKey".to_owned(),
            format!("/api/apiKeys/{id}"),
            "/api/2fa/account/config".to_owned(),
            format!("/api/user/{id}/token"),
            "/api/userx".to_owned(),
            format!("/api/tenant/{id}/devices"),
        ] {
            assert!(!platform_owns(&path), "{path} is not the platform's");
        }
    }

    #[test]
    fn every_route_has_a_class_and_the_credential_ones_are_exactly_these() {
        use std::collections::BTreeSet;
        let expected: BTreeSet<(&str, &str)> = [
            ("POST", "/api/auth/login"),
            ("POST", "/api/auth/login/public"),
            ("POST", "/api/auth/token"),
            ("POST", "/api/auth/logout"),
            ("POST", "/api/auth/changePassword"),
            ("POST", "/api/apiKey"),
            ("PUT", "/api/apiKey/{id}/enabled/{enabled}"),
            ("DELETE", "/api/apiKey/{id}"),
            ("POST", "/api/user/{id}/userCredentialsEnabled"),
            ("GET", "/api/user/{id}/activationLink"),
            ("POST", "/api/user/sendActivationMail"),
            ("POST", "/api/noauth/activate"),
            ("POST", "/api/2fa/account/config/generate"),
            ("POST", "/api/2fa/account/config"),
            ("PUT", "/api/2fa/account/config"),
            ("DELETE", "/api/2fa/account/config"),
            ("POST", "/api/2fa/account/config/submit"),
            ("POST", "/api/2fa/settings"),
            ("POST", "/api/auth/2fa/verification/send"),
            ("POST", "/api/auth/2fa/verification/check"),
            ("POST", "/api/auth/2fa/login"),
            ("POST", "/api/noauth/resetPasswordByEmail"),
            ("POST", "/api/noauth/resetPassword"),
            ("GET", "/oauth2/authorization/{name}"),
            ("GET", "/login/oauth2/code/"),
            ("GET", "/login/oauth2/code/{name}"),
        ]
        .into();
        let mut credential = BTreeSet::new();
        for route in ROUTES {
            match route.effect {
                Effect::Credential => {
                    credential.insert((route.method.as_str(), route.pattern));
                    // The platform's endpoint of the same path, forwarded,
                    // is a credential too.
                    let path = route.pattern.replace("{", "x").replace("}", "");
                    assert_eq!(proxied_effect(&path), Effect::Credential, "{path}");
                }
                Effect::Read | Effect::Write => {}
                Effect::Upstream => panic!("{} is keygate's own: it has a class", route.pattern),
            }
            // A GET is no proof of a read: the class says what it does.
            if route.method == Method::GET && route.effect != Effect::Read {
                assert!(
                    matches!(
                        route.endpoint,
                        Endpoint::ActivationLink
                            | Endpoint::SsoAuthorize
                            | Endpoint::SsoCallback
                            | Endpoint::SsoCallbackNamed
                    ),
                    "{}",
                    route.pattern
                );
            }
        }
        assert_eq!(credential, expected);
    }

    #[test]
    fn the_platforms_credential_endpoints_are_classed_by_path_whatever_route_carries_them() {
        let id = "784f394c-42b6-435a-983c-b7beff2784f9";
        for path in [
            format!("/api/user/{id}/activationLink"),
            format!("/api/user/{id}/activationLinkInfo"),
            format!("/api/user/{id}/activationLink/"),
            format!("/api/user/{id}/token"),
            format!("/api/user/{id}/userCredentialsEnabled"),
            "/api/user/sendActivationMail".to_owned(),
            "/api/auth/changePassword".to_owned(),
            "/api/noauth/activate".to_owned(),
            "/api/noauth/resetPassword".to_owned(),
            "/api/noauth/resetPasswordByEmail".to_owned(),
            "/api/2fa/account/config".to_owned(),
            "/api/2fa/account/config/generate".to_owned(),
            "/api/auth/2fa/verification/check".to_owned(),
            "/api/apiKey".to_owned(),
            format!("/api/apiKey/{id}"),
            format!("/api/apiKey/{id}/enabled/true"),
            "/api/admin/jwtSettings".to_owned(),
        ] {
            assert_eq!(proxied_effect(&path), Effect::Credential, "{path}");
        }
        for path in [
            format!("/api/user/{id}"),
            format!("/api/apiKeys/{id}"),
            format!("/api/apiKey/{id}/description"),
            format!("/api/user/{id}/tokenx"),
            "/api/user/tokenAccessEnabled".to_owned(),
            "/api/users".to_owned(),
            "/api/device/abc/credentials".to_owned(),
            "/api/2fa/providers".to_owned(),
            "/api/ws".to_owned(),
            "/".to_owned(),
        ] {
            assert_eq!(proxied_effect(&path), Effect::Upstream, "{path}");
        }
    }

    #[test]
    fn owned_routes_match_exactly_and_wrong_methods_are_405() {
        let m = find(&Method::POST, "/api/auth/login").unwrap().unwrap();
        assert_eq!(m.route.endpoint, Endpoint::Login);
        let public = find(&Method::POST, "/api/auth/login/public")
            .unwrap()
            .unwrap();
        assert_eq!(public.route.endpoint, Endpoint::PublicLogin);
        assert!(
            find(&Method::GET, "/api/customer/c1/devices")
                .unwrap()
                .is_none()
        );
        assert!(find(&Method::GET, "/api/tenant/devices").unwrap().is_none());
        let err = find(&Method::GET, "/api/auth/login").unwrap_err();
        assert_eq!(err.status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn every_owned_pattern_is_found_with_its_parameters() {
        for route in ROUTES {
            let path = route
                .pattern
                .split('/')
                .map(|segment| {
                    if segment.starts_with('{') {
                        "p1"
                    } else {
                        segment
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            let found = find(&route.method, &path).unwrap().unwrap();
            assert_eq!(found.route.pattern, route.pattern, "{path}");
            assert!(found.params.iter().all(|p| p == "p1"), "{path}");
            if !route.pattern.ends_with('}') {
                // Not this route; a sibling's pattern may own the longer path
                // (`/api/user/{id}` owns `/api/user/sendActivationMailx`).
                let longer = format!("{path}x");
                let other = find(&route.method, &longer);
                assert!(
                    !matches!(other, Ok(Some(m)) if std::ptr::eq(m.route, route)),
                    "{longer}"
                );
            }
        }
    }

    /// A body that sends one chunk, then nothing.
    struct Stalled(bool);

    impl http_body::Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            if std::mem::replace(&mut self.0, true) {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"{")))))
            }
        }
    }

    fn limits(body_read_timeout: std::time::Duration) -> HttpLimits {
        let settings = crate::config::load(&crate::config::Source {
            file: None,
            env: vec![],
        })
        .unwrap();
        HttpLimits {
            body_read_timeout,
            ..settings.limits
        }
    }

    #[tokio::test]
    async fn stalled_body_is_a_408_after_the_deadline() {
        let limits = limits(std::time::Duration::from_millis(50));
        let err = read_body(http::Request::new(Stalled(false)), &limits)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(err.code, crate::error::code::BAD_REQUEST_PARAMS);
        let full = http_body_util::Full::new(Bytes::from_static(b"{}"));
        let body = read_body(http::Request::new(full), &limits).await;
        assert_eq!(body.unwrap(), Bytes::from_static(b"{}"));
    }

    #[tokio::test]
    async fn bodies_over_the_owned_limit_are_413_declared_or_streamed() {
        let limits = limits(std::time::Duration::from_secs(10));
        let declared = http_body_util::Full::new(Bytes::from(vec![b'x'; MAX_BODY + 1]));
        let err = read_body(http::Request::new(declared), &limits)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        let chunks = (0..3).map(|_| {
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(vec![
                b'x';
                MAX_BODY / 2
            ])))
        });
        let streamed = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let err = read_body(http::Request::new(streamed), &limits)
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        let exact = http_body_util::Full::new(Bytes::from(vec![b'x'; MAX_BODY]));
        let body = read_body(http::Request::new(exact), &limits).await;
        assert_eq!(body.unwrap().len(), MAX_BODY);
    }

    #[test]
    fn other_endpoints_can_never_take_the_hashing_capacity_of_logins() {
        let defaults = crate::config::load(&crate::config::Source {
            file: None,
            env: vec![],
        })
        .unwrap();
        let settings = crate::config::LoginSettings {
            max_concurrent_hashes: 2,
            ..defaults.login
        };
        let hashing = Hashing::new(&settings);
        let _held: Vec<_> = (0..2)
            .map(|_| hashing.other.try_acquire().unwrap())
            .collect();
        assert!(
            hashing.other.try_acquire().is_err(),
            "others are at their cap"
        );
        assert!(hashing.login.try_acquire().is_ok(), "logins still hash");
    }

    #[test]
    fn pattern_parameters_are_captured() {
        assert_eq!(
            match_pattern(
                "/api/apiKey/{id}/enabled/{v}",
                "/api/apiKey/abc/enabled/true"
            ),
            Some(vec!["abc".to_string(), "true".to_string()])
        );
        assert_eq!(match_pattern("/api/apiKey/{id}", "/api/apiKey/"), None);
        assert_eq!(match_pattern("/api/apiKey/{id}", "/api/apiKey/a/b"), None);
        for (pattern, path) in [
            (
                "/api/apiKey/{id}/enabled/{v}",
                "/api/apiKey/abc/enabled/true",
            ),
            ("/api/apiKey/{id}", "/api/apiKey/"),
            ("/api/apiKey/{id}", "/api/apiKey/a/b"),
            ("/api/apiKey", "/api/apiKey"),
            ("/api/apiKey", "/api/apiKeys"),
        ] {
            assert_eq!(
                matches_pattern(pattern, path),
                match_pattern(pattern, path).is_some(),
                "{pattern} {path}"
            );
        }
    }
}
