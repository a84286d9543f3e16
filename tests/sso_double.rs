//! Single sign-on end to end against a provider double written here
//! (tests/common/provider.rs): the sign-in's redirects and cookie, the
//! session it opens, its refusals, and a provider's access tokens on the API.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::provider::Provider;
use common::{Gateway, WIRES, Wire};
use keygate::identity::Authority;
use serde_json::{Value, json};

const BASE: &str = "https://keygate.test";

async fn gateway(provider: &Provider, extra: &str) -> (common::Upstream, Gateway) {
    let config = format!(
        "[server]\npublic_base_url = \"{BASE}\"\n{}",
        provider.config("double", extra)
    );
    common::gateway(&config).await
}

/// A client over `wire` that follows no redirect and keeps no cookie.
fn browser(gw: &Gateway, wire: Wire) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10));
    match wire {
        Wire::Http1 => builder.http1_only(),
        Wire::Http2 => builder,
    }
    .build()
    .unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| decode(v))
    })
}

fn decode(text: &str) -> String {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Starts a sign-in: the provider's URL and the cookie to send back.
async fn start(gw: &Gateway, client: &reqwest::Client) -> (String, String) {
    let response = client
        .get(gw.https("/oauth2/authorization/double"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 302);
    assert_eq!(header(&response, "referrer-policy"), "no-referrer");
    let location = header(&response, "location");
    let set_cookie = header(&response, "set-cookie");
    for part in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/login/oauth2/"] {
        assert!(set_cookie.contains(part), "{set_cookie}");
    }
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    (location, cookie)
}

async fn callback(
    gw: &Gateway,
    client: &reqwest::Client,
    query: &str,
    cookie: &str,
) -> reqwest::Response {
    client
        .get(gw.https(&format!("/login/oauth2/code/?{query}")))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
}

fn verified(email: &str) -> Value {
    json!({"email": email, "email_verified": true, "given_name": "Jane"})
}

#[tokio::test]
async fn a_sign_in_through_the_provider_opens_a_session_like_a_password_login() {
    let provider = Provider::start().await;
    let (_up, gw) = gateway(&provider, "").await;
    let user = gw.user("jane@example.com", Authority::TenantAdmin).await;
    for (i, wire) in WIRES.into_iter().enumerate() {
        let client = browser(&gw, wire);
        let listed: Value = client
            .post(gw.https("/api/noauth/oauth2Clients?platform=WEB"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            listed,
            json!([{"name": "double", "icon": null, "url": "/oauth2/authorization/double"}])
        );
        let (location, cookie) = start(&gw, &client).await;
        assert!(location.starts_with(&format!("{}/authorize?", provider.issuer())));
        assert_eq!(
            query_param(&location, "redirect_uri").as_deref(),
            Some("https://keygate.test/login/oauth2/code/")
        );
        let code = format!("code-{i}");
        provider.expect_code(&code, &location, verified("Jane@Example.com"));
        let state = query_param(&location, "state").unwrap();
        let response = callback(&gw, &client, &format!("code={code}&state={state}"), &cookie).await;
        assert_eq!(response.status(), 302);
        assert_eq!(header(&response, "referrer-policy"), "no-referrer");
        assert!(header(&response, "set-cookie").contains("Max-Age=0"));
        let landed = header(&response, "location");
        assert!(
            landed.starts_with("https://keygate.test/?accessToken="),
            "{landed}"
        );
        let access = query_param(&landed, "accessToken").unwrap();
        let refresh = query_param(&landed, "refreshToken").unwrap();
        let me: Value = client
            .get(gw.https("/api/auth/user"))
            .header("x-authorization", format!("Bearer {access}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(me["id"]["id"], user.id.to_string());
        let renewed = client
            .post(gw.https("/api/auth/token"))
            .json(&json!({"refreshToken": refresh}))
            .send()
            .await
            .unwrap();
        assert_eq!(renewed.status(), 200);
    }
}

#[tokio::test]
async fn a_callback_without_its_cookie_state_or_a_verified_address_goes_to_the_login_page() {
    let provider = Provider::start().await;
    let (_up, gw) = gateway(&provider, "").await;
    gw.user("jane@example.com", Authority::TenantAdmin).await;
    let client = browser(&gw, Wire::Http2);
    let login_error = |response: &reqwest::Response| {
        let location = header(response, "location");
        assert!(
            location.starts_with("https://keygate.test/login?loginError="),
            "{location}"
        );
        query_param(&location, "loginError").unwrap()
    };
    let (location, cookie) = start(&gw, &client).await;
    let state = query_param(&location, "state").unwrap();
    provider.expect_code("c1", &location, verified("jane@example.com"));
    let other_state = callback(&gw, &client, "code=c1&state=forged", &cookie).await;
    assert_eq!(
        login_error(&other_state),
        "Authentication failed: state does not match"
    );
    let no_cookie = callback(&gw, &client, &format!("code=c1&state={state}"), "").await;
    assert_eq!(
        login_error(&no_cookie),
        "Authentication failed: the sign-in was not started here or has expired"
    );
    assert_eq!(provider.token_requests(), 0, "no code exchanged for either");

    let (location, cookie) = start(&gw, &client).await;
    let state = query_param(&location, "state").unwrap();
    let unverified = json!({"email": "jane@example.com", "email_verified": false});
    provider.expect_code("c2", &location, unverified);
    let response = callback(&gw, &client, &format!("code=c2&state={state}"), &cookie).await;
    assert_eq!(
        login_error(&response),
        "Authentication failed: e-mail is not verified"
    );

    let (location, cookie) = start(&gw, &client).await;
    let state = query_param(&location, "state").unwrap();
    provider.expect_code("c3", &location, verified("nobody@example.com"));
    let response = callback(&gw, &client, &format!("code=c3&state={state}"), &cookie).await;
    assert_eq!(login_error(&response), "User not found: nobody@example.com");

    let unknown = client
        .get(gw.https("/oauth2/authorization/nope"))
        .send()
        .await
        .unwrap();
    let (status, body) = common::error_body(unknown).await;
    assert_eq!((status, body["errorCode"].as_i64()), (404, Some(32)));
}

#[tokio::test]
async fn a_providers_access_token_authenticates_over_https_only_and_never_as_keygates() {
    let provider = Provider::start().await;
    let extra = "accept_access_tokens = true\naudience = \"https://api.keygate.test\"";
    let (up, gw) = gateway(&provider, extra).await;
    let user = gw.user("jane@example.com", Authority::TenantAdmin).await;
    let token = provider.access_token("https://api.keygate.test", verified("jane@example.com"));
    for wire in WIRES {
        let client = gw.client_over(wire);
        let response = client
            .get(gw.https("/api/tenant/devices"))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{wire:?}");
        let seen = up.last();
        assert_eq!(seen.headers["x-auth-user-id"], user.id.to_string().as_str());
        assert_eq!(seen.headers["x-auth-method"], "jwt");
        // For another audience, or in clear even from loopback: refused.
        let other = provider.access_token("https://elsewhere", verified("jane@example.com"));
        let refused = client
            .get(gw.https("/api/tenant/devices"))
            .header("authorization", format!("Bearer {other}"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401, "{wire:?}");
    }
    let in_clear = common::plain_client_over(Wire::Http1)
        .get(gw.http("/api/tenant/devices"))
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    let (status, body) = common::error_body(in_clear).await;
    assert_eq!((status, body["errorCode"].as_i64()), (403, Some(20)));
    // keygate's own tokens still go to keygate's key.
    let (_, own) = gw.access_token(&user).await;
    let response = gw
        .client()
        .get(gw.https("/api/tenant/devices"))
        .header("authorization", format!("Bearer {own}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        provider.jwks_fetches(),
        1,
        "verified tokens are cached, keys too"
    );
}

/// Configures TOTP for `email` (logged in with its password), as a user does.
async fn configure_totp(gw: &Gateway, email: &str) {
    let client = gw.client();
    let login: Value = gw
        .login(email, common::PASSWORD)
        .await
        .json()
        .await
        .unwrap();
    let token = login["token"].as_str().unwrap();
    let config: Value = client
        .post(gw.https("/api/2fa/account/config/generate?providerType=TOTP"))
        .header("x-authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = config["authUrl"].as_str().unwrap();
    let secret = query_param(url, "secret").unwrap();
    let code = common::totp::totp_at(&secret, common::totp::step_now());
    let saved = client
        .post(gw.https(&format!("/api/2fa/account/config?verificationCode={code}")))
        .header("x-authorization", format!("Bearer {token}"))
        .json(&config)
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), 200);
}

fn scopes_of(token: &str) -> Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice::<Value>(&bytes).unwrap()["scopes"].clone()
}

#[tokio::test]
async fn a_user_with_a_second_factor_signs_in_to_the_token_that_waits_for_it_unless_the_provider_is_trusted()
 {
    let provider = Provider::start().await;
    let (_up, gw) = gateway(&provider, "").await;
    gw.user("jane@example.com", Authority::TenantAdmin).await;
    configure_totp(&gw, "jane@example.com").await;
    let client = browser(&gw, Wire::Http2);
    let (location, cookie) = start(&gw, &client).await;
    let state = query_param(&location, "state").unwrap();
    // The provider says a one-time code was used: not trusted here.
    let claims =
        json!({"email": "jane@example.com", "email_verified": true, "amr": ["pwd", "otp"]});
    provider.expect_code("c1", &location, claims.clone());
    let response = callback(&gw, &client, &format!("code=c1&state={state}"), &cookie).await;
    let landed = header(&response, "location");
    assert!(
        landed.starts_with("https://keygate.test/?accessToken="),
        "{landed}"
    );
    assert_eq!(query_param(&landed, "refreshToken"), None, "{landed}");
    let waiting = query_param(&landed, "accessToken").unwrap();
    assert_eq!(scopes_of(&waiting), json!(["PRE_VERIFICATION_TOKEN"]));
    let refused = client
        .get(gw.https("/api/auth/user"))
        .header("x-authorization", format!("Bearer {waiting}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Trusted, the provider's factor passes the gate: the pair.
    let (_up2, trusting) = gateway(&provider, "trust_provider_mfa = true").await;
    trusting
        .user("jane@example.com", Authority::TenantAdmin)
        .await;
    configure_totp(&trusting, "jane@example.com").await;
    let client = browser(&trusting, Wire::Http2);
    let (location, cookie) = start(&trusting, &client).await;
    let state = query_param(&location, "state").unwrap();
    provider.expect_code("c2", &location, claims);
    let response = callback(
        &trusting,
        &client,
        &format!("code=c2&state={state}"),
        &cookie,
    )
    .await;
    let landed = header(&response, "location");
    assert!(query_param(&landed, "refreshToken").is_some(), "{landed}");
}
