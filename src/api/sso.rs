//! Single sign-on's endpoints, in the platform's wire format
//! (`OAuth2Controller`, `CustomOAuth2AuthorizationRequestResolver`, its
//! success and failure handlers): the providers the login page lists, the
//! redirect to a provider, and the callback that ends a sign-in.
//!
//! The callback ends the way a password login does: the user found (or
//! created) by [`crate::sso::mapping`], then the same second-factor gate
//! ([`crate::auth::second_factor::Gate`]) and the same `issue_pair`. A user
//! with a second factor due is sent on with the token that waits for it
//! (`?accessToken=<pre-verification or MFA configuration token>`, no
//! refresh token), which the UI takes to its second-factor page. A factor
//! the provider proved counts only with `trust_provider_mfa` and an `amr`
//! that shows one.
//!
//! A sign-in's callback is taken once: its state is recorded as used in the
//! store before the code is exchanged, so a saved cookie replayed with a
//! fresh code for the same state is refused on every replica.
//!
//! Every redirect goes under `server.public_base_url`: nothing a request
//! carries chooses where the browser goes. Each carries `Referrer-Policy:
//! no-referrer` and `Cache-Control: no-store`, and the callback's removes
//! the sign-in's cookie.

use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use super::access::query_pairs;
use super::{EndpointRequest, Endpoints, encode_component, json_response};
use crate::accounts::{AccountError, NewUser};
use crate::auth::second_factor::{Gate, check_provider_factor};
use crate::body::{self, Body};
use crate::error::ApiError;
use crate::sso::flow::{self, Flow, FlowError};
use crate::sso::mapping::{self, Decision};
use crate::sso::{Provider, ProviderError};
use crate::store::UserRecord;

/// `OAuth2ClientLoginInfo`.
#[derive(Debug, Serialize)]
struct ClientLoginInfo<'a> {
    name: &'a str,
    icon: Option<&'a str>,
    url: String,
}

/// `POST /api/noauth/oauth2Clients`: every provider, for the login page.
#[utoipa::path(
    post,
    path = "/api/noauth/oauth2Clients",
    tag = "o-auth-2-controller",
    operation_id = "getOAuth2Clients",
    summary = "The single sign-on providers the login page lists",
    params(("platform" = Option<String>, Query, description = "WEB, ANDROID or IOS; every provider is listed for each")),
    responses(
        (status = 200, description = "`[{\"name\": <button label>, \"icon\": <icon or null>, \"url\": \"/oauth2/authorization/<name>\"}]`")
    )
)]
pub async fn clients(api: &Endpoints, _req: EndpointRequest) -> Result<Response<Body>, ApiError> {
    let listed: Vec<ClientLoginInfo<'_>> = api
        .sso
        .iter()
        .map(|provider| ClientLoginInfo {
            name: &provider.settings.button_label,
            icon: provider.settings.icon.as_deref(),
            url: format!("{}{}", crate::sso::AUTHORIZATION_PATH, provider.name()),
        })
        .collect();
    Ok(json_response(&listed))
}

/// `GET /oauth2/authorization/{name}`: to the provider, with a new sign-in's
/// state in the cookie.
#[utoipa::path(
    get,
    path = "/oauth2/authorization/{name}",
    tag = "o-auth-2-controller",
    operation_id = "oauth2Authorization",
    summary = "Start a single sign-on: 302 to the provider (PKCE S256, state and nonce in a signed cookie)",
    params(("name" = String, Path, description = "The provider's name")),
    responses(
        (status = 302, description = "To the provider's authorization endpoint; or, the provider unreachable, to <base>/login?loginError=..."),
        (status = 404, description = "Unknown provider", body = crate::error::ErrorResponse)
    )
)]
pub async fn authorize(api: &Endpoints, req: EndpointRequest) -> Result<Response<Body>, ApiError> {
    let name = req.params.first().map(String::as_str).unwrap_or_default();
    let Some(provider) = api.sso.by_name(name) else {
        return Err(ApiError::with_message(
            StatusCode::NOT_FOUND,
            crate::error::code::ITEM_NOT_FOUND,
            "Unknown single sign-on provider",
        ));
    };
    let found = match provider.discovery().await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(provider = name, %error, "single sign-on could not start");
            return failure(api, Failure::Unavailable.message(), false);
        }
    };
    let flow = Flow::start(name, crate::clock::now_secs()).map_err(|_| ApiError::internal())?;
    let location = provider.authorization_url(&found, &flow, &api.sso.redirect_uri());
    let mut response = redirect(&location)?;
    set_cookie(
        &mut response,
        &flow::set_cookie(&flow.seal(api.sso.cookie_key())),
    )?;
    api.metrics.login("sso_started");
    Ok(response)
}

/// `GET /login/oauth2/code/`: the provider's answer.
#[utoipa::path(
    get,
    path = "/login/oauth2/code/",
    tag = "o-auth-2-controller",
    operation_id = "oauth2Callback",
    summary = "End a single sign-on: 302 to the UI with a token pair, or the token that waits for a second factor, or a login error",
    params(
        ("code" = String, Query, description = "The provider's authorization code"),
        ("state" = String, Query, description = "The state the sign-in sent"),
    ),
    responses(
        (status = 302, description = "To <base>/?accessToken=...&refreshToken=..., <base>/?accessToken=<pre-verification token>, or <base>/login?loginError=...")
    )
)]
pub async fn callback(api: &Endpoints, req: EndpointRequest) -> Result<Response<Body>, ApiError> {
    finish(api, req).await
}

/// `GET /login/oauth2/code/{name}`: [`callback`], the provider named too
/// (it must be the sign-in's).
#[utoipa::path(
    get,
    path = "/login/oauth2/code/{name}",
    tag = "o-auth-2-controller",
    operation_id = "oauth2CallbackNamed",
    summary = "End a single sign-on, as /login/oauth2/code/",
    params(
        ("name" = String, Path, description = "The provider's name: the sign-in's"),
        ("code" = String, Query, description = "The provider's authorization code"),
        ("state" = String, Query, description = "The state the sign-in sent"),
    ),
    responses(
        (status = 302, description = "As /login/oauth2/code/")
    )
)]
pub async fn callback_named(
    api: &Endpoints,
    req: EndpointRequest,
) -> Result<Response<Body>, ApiError> {
    finish(api, req).await
}

async fn finish(api: &Endpoints, req: EndpointRequest) -> Result<Response<Body>, ApiError> {
    match sign_in(api, &req).await {
        Ok(SignedIn::Pair { access, refresh }) => {
            api.metrics.login("sso_success");
            let location = api.sso.link(&format!(
                "/?accessToken={}&refreshToken={}",
                encode_component(&access),
                encode_component(&refresh)
            ));
            let mut response = redirect(&location)?;
            set_cookie(&mut response, &flow::clear_cookie())?;
            Ok(response)
        }
        Ok(SignedIn::Pending { token }) => {
            api.metrics.login("sso_second_factor_required");
            let location = api
                .sso
                .link(&format!("/?accessToken={}", encode_component(&token)));
            let mut response = redirect(&location)?;
            set_cookie(&mut response, &flow::clear_cookie())?;
            Ok(response)
        }
        Err(failed) => {
            api.metrics.login("sso_failed");
            tracing::info!(target: "keygate::security", client = %req.client_ip, reason = %failed.message(), "single sign-on failed");
            failure(api, failed.message(), true)
        }
    }
}

/// How a sign-in ended well.
enum SignedIn {
    /// A session's first pair.
    Pair { access: String, refresh: String },
    /// The token that waits for a second factor.
    Pending { token: String },
}

/// Why a sign-in failed; its message goes after `loginError=`.
#[derive(Debug)]
enum Failure {
    Flow(FlowError),
    ProviderAnswered,
    NoCode,
    Unavailable,
    Refused,
    IdToken,
    Mapping(mapping::Refusal),
    Locked,
    Busy,
}

impl Failure {
    fn message(&self) -> String {
        let text = match self {
            Failure::Flow(FlowError::State) => "state does not match",
            Failure::Flow(_) => "the sign-in was not started here or has expired",
            Failure::ProviderAnswered => "the identity provider answered an error",
            Failure::NoCode => "the identity provider sent no code",
            Failure::Unavailable => "the identity provider is unavailable",
            Failure::Refused => "the code exchange was refused",
            Failure::IdToken => "the ID token is not valid",
            Failure::Mapping(refusal) => return refusal.message(),
            Failure::Locked => "user is locked",
            Failure::Busy => "too many sign-ins at once; try again",
        };
        format!("Authentication failed: {text}")
    }
}

impl From<ProviderError> for Failure {
    fn from(error: ProviderError) -> Failure {
        match error {
            ProviderError::Refused(_) => Failure::Refused,
            ProviderError::Discovery(_) | ProviderError::Unavailable(_) => Failure::Unavailable,
        }
    }
}

async fn sign_in(api: &Endpoints, req: &EndpointRequest) -> Result<SignedIn, Failure> {
    let query = query_pairs(req.query.as_deref());
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let now = crate::clock::now_secs();
    let flow = Flow::open(
        req.sso_cookie.as_deref(),
        api.sso.cookie_key(),
        param("state").unwrap_or_default(),
        now,
    )
    .map_err(Failure::Flow)?;
    let provider = api
        .sso
        .by_name(&flow.provider)
        .filter(|p| req.params.first().is_none_or(|name| *name == p.name()))
        .ok_or(Failure::Flow(FlowError::Forged))?;
    take_once(api, &flow, req).await?;
    if param("error").is_some() {
        return Err(Failure::ProviderAnswered);
    }
    let code = param("code")
        .filter(|c| !c.is_empty())
        .ok_or(Failure::NoCode)?;
    let claims = {
        let _turn = api.sso.exchange_turn().ok_or(Failure::Busy)?;
        let id_token = provider
            .exchange(code, &flow.verifier, &api.sso.redirect_uri())
            .await
            .inspect_err(|error| tracing::warn!(provider = provider.name(), %error, "single sign-on code exchange failed"))?;
        provider
            .verify_id_token(&id_token, &flow.nonce, now)
            .await
            .map_err(|refusal| {
                tracing::warn!(target: "keygate::security", provider = provider.name(), %refusal, "a provider's ID token was refused");
                Failure::IdToken
            })?
    };
    let user = account(api, provider, &claims).await?;
    if api
        .store
        .is_locked(user.id)
        .await
        .map_err(|_| Failure::Unavailable)?
    {
        return Err(Failure::Locked);
    }
    let proved = check_provider_factor(
        &user,
        provider.settings.trust_provider_mfa && mapping::shows_second_factor(&claims),
    );
    let cleared = match proved {
        Some(verified) => Gate::passed(verified),
        None => match api.gate(&user).await.map_err(|_| Failure::Unavailable)? {
            Ok(cleared) => cleared,
            Err(pending) => {
                return Ok(SignedIn::Pending {
                    token: pending.token,
                });
            }
        },
    };
    let pair = api
        .issue_pair(cleared)
        .await
        .map_err(|_| Failure::Unavailable)?;
    tracing::info!(target: "keygate::security", provider = provider.name(), user_id = %user.id, client = %req.client_ip, "single sign-on succeeded");
    Ok(SignedIn::Pair {
        access: pair.token,
        refresh: pair.refresh_token,
    })
}

/// Ends the sign-in `flow` for good, before any code is exchanged: the
/// first callback with its cookie takes it, on any replica (the store
/// decides, atomically); a saved cookie presented again, even with a fresh
/// code the provider issued for the same state, is refused as a sign-in
/// that was not started here.
async fn take_once(api: &Endpoints, flow: &Flow, req: &EndpointRequest) -> Result<(), Failure> {
    let first = api
        .store
        .take_sso_state(&flow.state_digest(), flow.expires_ms())
        .await
        .map_err(|error| {
            tracing::error!(%error, "single sign-on could not record its state as used");
            Failure::Unavailable
        })?;
    if !first {
        tracing::warn!(target: "keygate::security", provider = %flow.provider, client = %req.client_ip, "a used single sign-on state was presented again");
        return Err(Failure::Flow(FlowError::Used));
    }
    Ok(())
}

/// The user `claims` name: found, or created where the provider allows it.
async fn account(
    api: &Endpoints,
    provider: &Provider,
    claims: &crate::sso::token::Claims,
) -> Result<UserRecord, Failure> {
    let settings = &provider.settings;
    let person = mapping::person(claims, settings).map_err(Failure::Mapping)?;
    let found = api
        .store
        .user_by_email(&person.email)
        .await
        .map_err(|_| Failure::Unavailable)?;
    let new = match mapping::decide(person, found, settings).map_err(Failure::Mapping)? {
        Decision::Existing(user) => return Ok(*user),
        Decision::Create(new) => new,
    };
    let email = new.email.clone();
    let created = crate::accounts::create_pending_user(
        &api.store,
        NewUser {
            email: new.email,
            authority: new.authority,
            tenant_id: Some(new.tenant_id),
            customer_id: new.customer_id,
            first_name: new.first_name,
            last_name: new.last_name,
        },
        Default::default(),
    )
    .await;
    match created {
        Ok(user) => {
            tracing::info!(target: "keygate::security", provider = provider.name(), user_id = %user.id, authority = %user.authority, "single sign-on created a user");
            Ok(user)
        }
        // Another sign-in of the same address created it meanwhile.
        Err(AccountError::Exists(_)) => match api.store.user_by_email(&email).await {
            Ok(Some(user)) if user.enabled => Ok(user),
            Ok(Some(_)) => Err(Failure::Mapping(mapping::Refusal::Disabled)),
            _ => Err(Failure::Unavailable),
        },
        Err(error) => {
            tracing::error!(provider = provider.name(), %error, "single sign-on could not create a user");
            Err(Failure::Unavailable)
        }
    }
}

/// A 302 to `location`, not cached, sending no referrer on.
fn redirect(location: &str) -> Result<Response<Body>, ApiError> {
    let location = HeaderValue::from_str(location).map_err(|_| ApiError::internal())?;
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::FOUND;
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Ok(response)
}

fn set_cookie(response: &mut Response<Body>, value: &str) -> Result<(), ApiError> {
    let value = HeaderValue::from_str(value).map_err(|_| ApiError::internal())?;
    response.headers_mut().append(header::SET_COOKIE, value);
    Ok(())
}

/// The failure redirect: `{public_base_url}/login?loginError=<message>`,
/// removing the sign-in's cookie when `clear`.
fn failure(api: &Endpoints, message: String, clear: bool) -> Result<Response<Body>, ApiError> {
    let location = api
        .sso
        .link(&format!("/login?loginError={}", encode_component(&message)));
    let mut response = redirect(&location)?;
    if clear {
        set_cookie(&mut response, &flow::clear_cookie())?;
    }
    Ok(response)
}
