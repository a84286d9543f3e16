//! Single sign-on through a real OpenID provider (the certified
//! `oidc-provider` package, `tests/oidc/provider.mjs`) end to end: the
//! browser flow, the user it lands on, and the attacks on it; and the
//! provider's own access tokens on the API.
//!
//! Every test starts its own provider and keygate (tests/common/oidc.rs);
//! without node or `tests/oidc/node_modules` the tests are skipped
//! (`common::skipped_without`).
mod common;

use std::time::Instant;

use base64::Engine;
use common::oidc::{
    self, API_AUDIENCE, CLIENT_SECRET, Landing, OTHER_AUDIENCE, Sso, query_param, with_param,
};
use common::totp::{step_now, totp_at};
use common::{WIRES, error_body, plain_client_over};
use keygate::identity::Authority;
use serde_json::{Value, json};

const ALICE: &str = "alice@example.com";

/// The settings that let provider access tokens authenticate API calls.
const ACCEPT_ACCESS_TOKENS: &str =
    "accept_access_tokens = true\naudience = \"https://api.keygate.test\"";

/// The claims of a JWT, unverified.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap()
}

/// `GET /api/auth/user` with `token`.
async fn current_user(sso: &Sso, token: &str) -> reqwest::Response {
    sso.gateway
        .client()
        .get(sso.gateway.https("/api/auth/user"))
        .header("X-Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

/// `POST /api/auth/token` with `refresh`.
async fn refresh(sso: &Sso, refresh: &str) -> reqwest::Response {
    sso.gateway
        .client()
        .post(sso.gateway.https("/api/auth/token"))
        .json(&json!({ "refreshToken": refresh }))
        .send()
        .await
        .unwrap()
}

/// A forwarded API call with `Authorization: Bearer <token>` over HTTPS.
async fn api_call(sso: &Sso, wire: common::Wire, token: &str) -> reqwest::Response {
    sso.gateway
        .client_over(wire)
        .get(sso.gateway.https("/api/devices"))
        .header("Authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap()
}

/// Asserts that `token` is refused on the API with the contract's 401 and
/// that nothing reached the upstream.
async fn assert_refused_on_api(sso: &Sso, token: &str, what: &str) {
    let before = sso.upstream.requests().len();
    for wire in WIRES {
        let (status, json) = error_body(api_call(sso, wire, token).await).await;
        assert_eq!(status, 401, "{what} over {wire:?}: {json}");
    }
    assert_eq!(
        sso.upstream.requests().len(),
        before,
        "{what}: nothing was forwarded"
    );
}

/// Asserts that `token` is accepted on the API as alice (the control that
/// makes a refusal of a variant mean something).
async fn assert_accepted_as_alice(sso: &Sso, token: &str, what: &str) {
    let answer = api_call(sso, common::Wire::Http1, token).await;
    let status = answer.status();
    assert_eq!(status, 200, "{what}: {}", answer.text().await.unwrap());
    let seen = sso.upstream.last_to("/api/devices");
    assert_eq!(seen.headers["x-auth-email"], ALICE, "{what}");
}

/// A refusal's message names no secret of the flow.
fn assert_discreet(error: &str, secrets: &[&str]) {
    for secret in [CLIENT_SECRET].iter().chain(secrets) {
        assert!(
            !secret.is_empty() && !error.contains(secret),
            "the login error shows a secret: {error}"
        );
    }
}

/// Verifies `token` with the provider's published key set (ES256, `aud`,
/// `iss`); its claims.
fn verified(token: &str, jwks: &jsonwebtoken::jwk::JwkSet, issuer: &str, aud: &str) -> Value {
    let key = jsonwebtoken::DecodingKey::from_jwk(&jwks.keys[0]).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[aud]);
    validation.set_issuer(&[issuer]);
    jsonwebtoken::decode::<Value>(token, &key, &validation)
        .unwrap_or_else(|e| panic!("{e}: {token}"))
        .claims
}

/// The provider half on its own (no keygate): what every other test here
/// takes for granted about the provider, its users and the forging key.
#[tokio::test]
async fn the_test_provider_issues_what_the_tests_rely_on() {
    let check = "the test OpenID provider";
    if !oidc::provider_available(check) {
        return;
    }
    let base = "https://127.0.0.1:9";
    let redirect_uri = format!("{base}/login/oauth2/code/");
    let provider = oidc::Provider::start(&redirect_uri, "client_secret_basic");
    let get = |path: &str| provider.client().get(provider.url(path)).send();
    let discovery: Value = get("/.well-known/openid-configuration")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(provider.issuer.starts_with("https://localhost:"));
    assert_eq!(discovery["issuer"], provider.issuer.as_str());
    assert_eq!(
        discovery["token_endpoint_auth_methods_supported"],
        json!(["client_secret_basic"])
    );
    assert_eq!(
        discovery["code_challenge_methods_supported"],
        json!(["S256"])
    );

    // The published key set is the test's key, public members only.
    let before = provider.jwks_fetches().await;
    let published: Value = get("/jwks").await.unwrap().json().await.unwrap();
    assert_eq!(
        provider.jwks_fetches().await,
        before + 1,
        "fetches are counted"
    );
    assert_eq!(published, json!({ "keys": [provider.key.public_jwk()] }));
    let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_value(published).unwrap();

    let browser = |_| oidc::Browser::new(&provider, None, base);
    let started = Instant::now();
    let tokens = provider
        .tokens(&browser(()), &redirect_uri, "alice", Some(API_AUDIENCE))
        .await;
    eprintln!(
        "the provider's part of a sign-in (authorize, login, consent, token): {:?}",
        started.elapsed()
    );
    let id = verified(
        tokens["id_token"].as_str().unwrap(),
        &jwks,
        &provider.issuer,
        oidc::CLIENT_ID,
    );
    assert_eq!(id["email"], ALICE);
    assert_eq!(id["email_verified"], true);
    assert_eq!(
        (&id["given_name"], &id["family_name"]),
        (&json!("Alice"), &json!("Liddell"))
    );
    assert_eq!(id["groups"], json!(["iot-admins"]));
    assert_eq!(id["amr"], json!(["pwd"]));
    assert_eq!(id["nonce"], "test-nonce");
    let access = tokens["access_token"].as_str().unwrap();
    let header = jsonwebtoken::decode_header(access).unwrap();
    assert_eq!(header.typ.as_deref(), Some("at+jwt"));
    let claims = verified(access, &jwks, &provider.issuer, API_AUDIENCE);
    assert_eq!(claims["email"], ALICE);
    assert_eq!(claims["email_verified"], true);
    // What the test forges verifies as the provider's own.
    let forged = provider.forge(&provider.access_claims(ALICE));
    assert_eq!(
        verified(&forged, &jwks, &provider.issuer, API_AUDIENCE)["email"],
        ALICE
    );

    let other = provider
        .tokens(&browser(()), &redirect_uri, "alice", Some(OTHER_AUDIENCE))
        .await;
    verified(
        other["access_token"].as_str().unwrap(),
        &jwks,
        &provider.issuer,
        OTHER_AUDIENCE,
    );

    for (user, claim, value) in [
        ("bob", "email_verified", json!(false)),
        ("mallory", "email", json!("AL\u{130}CE@example.com")),
        ("carol", "amr", json!(["pwd", "otp", "mfa"])),
        ("dave", "groups", json!(["visitors"])),
    ] {
        let tokens = provider
            .tokens(&browser(()), &redirect_uri, user, None)
            .await;
        let id = verified(
            tokens["id_token"].as_str().unwrap(),
            &jwks,
            &provider.issuer,
            oidc::CLIENT_ID,
        );
        assert_eq!(id[claim], value, "{user}");
    }

    // PKCE is required: a request without a challenge comes back refused.
    let mut bare = reqwest::Url::parse(&provider.url("/auth")).unwrap();
    bare.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", oidc::CLIENT_ID)
        .append_pair("redirect_uri", &redirect_uri)
        .append_pair("scope", "openid")
        .append_pair("state", "s");
    let back = browser(()).at_provider(bare.as_str(), "alice").await;
    assert_eq!(
        query_param(&back, "error").as_deref(),
        Some("invalid_request"),
        "{back}"
    );
}

#[tokio::test]
async fn signing_in_through_the_provider_gives_a_session_that_refreshes_and_logs_out() {
    let check = "single sign-on through a real provider";
    let Some(sso) = Sso::start(check, "", "").await else {
        return;
    };
    let alice = sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();

    let started = Instant::now();
    let listing = browser.listing().await;
    assert_eq!(
        listing,
        vec![json!({"name": "Corp login", "icon": null, "url": "/oauth2/authorization/corp"})]
    );

    // The authorization redirect: code flow, PKCE S256, state, nonce, and the
    // one redirect URI under the public address.
    let answer = browser.get("/oauth2/authorization/corp").await;
    assert_eq!(answer.status(), 302);
    let cookie = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("keygate_oauth2="))
        .expect("the flow's cookie is set");
    for attribute in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/login/oauth2/"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    let authorization = oidc::location(&answer);
    assert!(
        authorization.starts_with(&sso.provider.issuer),
        "{authorization}"
    );
    let param = |name| query_param(&authorization, name).unwrap_or_default();
    assert_eq!(param("response_type"), "code");
    assert_eq!(param("client_id"), oidc::CLIENT_ID);
    assert_eq!(param("redirect_uri"), sso.url("/login/oauth2/code/"));
    assert!(param("scope").split(' ').any(|s| s == "openid"));
    assert_eq!(param("code_challenge_method"), "S256");
    assert_eq!(param("code_challenge").len(), 43);
    assert!(param("state").len() >= 16 && param("nonce").len() >= 16);

    let callback = browser.at_provider(&authorization, "alice").await;
    let (access, refresh_token) = browser.land(&callback).await.tokens();
    let round_trip = started.elapsed();
    eprintln!("single sign-on round trip (listing to token redirect): {round_trip:?}");
    assert!(
        browser.callback_cookie().is_none(),
        "the flow's cookie is cleared at the end"
    );

    assert_eq!(claims(&access)["sub"], ALICE);
    assert_eq!(claims(&access)["userId"], alice.id.to_string());
    let answer = current_user(&sso, &access).await;
    assert_eq!(answer.status(), 200);
    let record: Value = answer.json().await.unwrap();
    assert_eq!(record["email"], ALICE);
    assert_eq!(record["authority"], "TENANT_ADMIN");

    // The refresh token is keygate's own: it refreshes, then logout ends it.
    let answer = refresh(&sso, &refresh_token).await;
    assert_eq!(answer.status(), 200);
    let pair: Value = answer.json().await.unwrap();
    let access = pair["token"].as_str().unwrap().to_owned();
    assert_eq!(current_user(&sso, &access).await.status(), 200);
    let answer = sso
        .gateway
        .client()
        .post(sso.gateway.https("/api/auth/logout"))
        .header("X-Authorization", format!("Bearer {access}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let (status, _) = error_body(current_user(&sso, &access).await).await;
    assert_eq!(status, 401, "logged out");
    let refreshed = pair["refreshToken"].as_str().unwrap();
    let (status, _) = error_body(refresh(&sso, refreshed).await).await;
    assert_eq!(status, 401, "the session's refresh token ended with it");

    // The same flow over each wire, timed.
    for wire in WIRES {
        let started = Instant::now();
        let (access, _) = sso.browser_over(wire).sign_in("alice").await.tokens();
        eprintln!(
            "single sign-on round trip over {wire:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(current_user(&sso, &access).await.status(), 200, "{wire:?}");
    }
}

#[tokio::test]
async fn the_client_authenticates_at_the_token_endpoint_as_the_discovery_document_allows() {
    let check = "single sign-on with client_secret_post";
    let Some(sso) = Sso::start_authenticating(check, "client_secret_post", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let (access, _) = sso.sign_in("alice").await.tokens();
    assert_eq!(claims(&access)["sub"], ALICE);
}

#[tokio::test]
async fn an_unknown_registration_is_a_404_json_error() {
    let Some(sso) = Sso::start("an unknown registration", "", "").await else {
        return;
    };
    let answer = sso.browser().get("/oauth2/authorization/nobody").await;
    let (status, json) = error_body(answer).await;
    assert_eq!(status, 404);
    assert_eq!(json["errorCode"], 32, "{json}");
}

#[tokio::test]
async fn a_sign_in_cancelled_at_the_provider_lands_on_the_login_error() {
    let Some(sso) = Sso::start("a cancelled sign-in", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();
    let authorization = browser.authorization("/oauth2/authorization/corp").await;
    // The provider's own "Cancel" on its login page.
    let page = browser.client.get(&authorization).send().await.unwrap();
    let interaction = reqwest::Url::parse(&authorization)
        .unwrap()
        .join(&oidc::location(&page))
        .unwrap();
    let abort = format!("{}/abort", interaction.as_str().trim_end_matches('/'));
    let answer = browser.client.get(&abort).send().await.unwrap();
    let callback = browser.at_provider(&oidc::location(&answer), "alice").await;
    assert_eq!(
        query_param(&callback, "error").as_deref(),
        Some("access_denied")
    );
    let error = browser.land(&callback).await.refusal();
    assert_eq!(
        error,
        "Authentication failed: the identity provider answered an error"
    );
}

#[tokio::test]
async fn a_disabled_user_is_refused_at_the_next_single_sign_on_and_loses_sessions() {
    let Some(sso) = Sso::start("a disabled user's single sign-on", "", "").await else {
        return;
    };
    let alice = sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let (access, refresh_token) = sso.sign_in("alice").await.tokens();
    assert_eq!(current_user(&sso, &access).await.status(), 200);
    // Disabled in the store, and applied as the revocation path would.
    let _ = sso
        .gateway
        .running
        .store
        .set_user_enabled(alice.id, false, keygate::clock::now_secs())
        .await
        .unwrap();
    sso.gateway
        .running
        .app
        .authenticator()
        .caches()
        .invalidate_user(alice.id);
    let (status, _) = error_body(current_user(&sso, &access).await).await;
    assert_eq!(status, 401, "the session's access token");
    let (status, _) = error_body(refresh(&sso, &refresh_token).await).await;
    assert_eq!(status, 401, "the session's refresh token");
    let error = sso.sign_in("alice").await.refusal();
    assert_eq!(error, "Authentication failed: user is disabled");
}

/// Settings that create unknown users, their authority from `groups`.
fn creating(tenant: uuid::Uuid, customer: uuid::Uuid) -> String {
    format!(
        "allow_user_creation = true\ntenant_id = \"{tenant}\"\ncustomer_id = \"{customer}\"\n\
         authority_claim = \"groups\"\n\
         authority_map = {{ \"iot-admins\" = \"TENANT_ADMIN\", \"iot-users\" = \"CUSTOMER_USER\" }}"
    )
}

#[tokio::test]
async fn a_user_unknown_to_keygate_is_created_when_allowed() {
    let (tenant, customer) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let settings = creating(tenant, customer);
    let Some(sso) = Sso::start("creating users at sign-on", &settings, "").await else {
        return;
    };
    let (access, _) = sso.sign_in("alice").await.tokens();
    let record: Value = current_user(&sso, &access).await.json().await.unwrap();
    assert_eq!(record["email"], ALICE, "{record}");
    assert_eq!(record["authority"], "TENANT_ADMIN", "mapped from groups");
    assert_eq!(record["firstName"], "Alice");
    assert_eq!(record["lastName"], "Liddell");
    assert_eq!(record["tenantId"]["id"], tenant.to_string());
    // The next sign-on lands on the same user, not a second one.
    let (again, _) = sso.sign_in("alice").await.tokens();
    assert_eq!(claims(&again)["userId"], claims(&access)["userId"]);
    // A user in none of the mapped groups is refused.
    let error = sso.sign_in("dave").await.refusal();
    assert_eq!(
        error,
        "Authentication failed: no longer allowed by the mapping"
    );
}

#[tokio::test]
async fn a_user_unknown_to_keygate_is_refused_when_creation_is_off() {
    let Some(sso) = Sso::start("refusing unknown users", "", "").await else {
        return;
    };
    let error = sso.sign_in("alice").await.refusal();
    assert_eq!(error, format!("User not found: {ALICE}"));
    let (status, _) = error_body(sso.gateway.login(ALICE, common::PASSWORD).await).await;
    assert_eq!(status, 401, "no user was created");
}

#[tokio::test]
async fn an_unverified_email_is_refused() {
    let Some(sso) = Sso::start("an unverified e-mail", "", "").await else {
        return;
    };
    sso.gateway
        .user("bob@example.com", Authority::TenantAdmin)
        .await;
    let error = sso.sign_in("bob").await.refusal();
    assert_eq!(error, "Authentication failed: e-mail is not verified");
}

#[tokio::test]
async fn an_email_with_a_dotted_capital_i_does_not_land_on_alice() {
    // "ALİCE@example.com" (U+0130) must never fold onto alice@example.com:
    // with creation off it is refused; with creation on it is someone else.
    let check = "a dotted capital I in an e-mail";
    let Some(sso) = Sso::start(check, "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    sso.sign_in("mallory").await.refusal();

    let settings = creating(uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let Some(sso) = Sso::start(check, &settings, "").await else {
        return;
    };
    let alice = sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    if let Landing::Tokens { access, .. } = sso.sign_in("mallory").await {
        let record: Value = current_user(&sso, &access).await.json().await.unwrap();
        assert_ne!(record["id"]["id"], alice.id.to_string(), "{record}");
        assert_ne!(record["email"], ALICE, "{record}");
        assert_ne!(claims(&access)["userId"], alice.id.to_string());
    }
}

#[tokio::test]
async fn a_forged_state_is_refused() {
    let Some(sso) = Sso::start("a forged state", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();
    let authorization = browser.authorization("/oauth2/authorization/corp").await;
    let callback = browser.at_provider(&authorization, "alice").await;
    let state = query_param(&callback, "state").unwrap();
    let forged = with_param(&callback, "state", "forged-state-0123456789");
    let error = browser.land(&forged).await.refusal();
    assert_eq!(error, "Authentication failed: state does not match");
    assert_discreet(&error, &[&state]);
}

#[tokio::test]
async fn a_state_cookie_replayed_after_success_is_refused() {
    let Some(sso) = Sso::start("a replayed state", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();
    let authorization = browser.authorization("/oauth2/authorization/corp").await;
    let callback = browser.at_provider(&authorization, "alice").await;
    let saved = browser.callback_cookie().expect("the flow's cookie");
    browser.land(&callback).await.tokens();
    // The same authorization request again (same state, nonce and code
    // challenge): the provider's session answers at once with a fresh code,
    // which would pass PKCE. Only keygate's memory of the used state stops
    // the saved cookie from signing in a second time.
    let again = browser.at_provider(&authorization, "alice").await;
    assert_ne!(query_param(&again, "code"), query_param(&callback, "code"));
    assert_eq!(
        query_param(&again, "state"),
        query_param(&callback, "state")
    );
    // A fresh browser (no cookies of its own, no redirects followed).
    let answer = sso
        .browser()
        .client
        .get(&again)
        .header("cookie", &saved)
        .send()
        .await
        .unwrap();
    let error = landing_of(&sso, answer).refusal();
    assert_discreet(&error, &[]);
}

/// Where keygate's answer to a callback sends the browser.
fn landing_of(sso: &Sso, answer: reqwest::Response) -> Landing {
    assert_eq!(answer.status(), 302);
    Landing::of(&sso.base, &oidc::location(&answer))
}

#[tokio::test]
async fn an_id_token_with_another_nonce_is_refused() {
    let Some(sso) = Sso::start("a mismatched nonce", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();
    let authorization = browser.authorization("/oauth2/authorization/corp").await;
    // The provider signs an ID token with the attacker's nonce; state and
    // PKCE are the browser's own, so only the nonce is wrong.
    let tampered = with_param(&authorization, "nonce", "attacker-nonce-0123456789");
    let callback = browser.at_provider(&tampered, "alice").await;
    let error = browser.land(&callback).await.refusal();
    assert_eq!(error, "Authentication failed: the ID token is not valid");
}

#[tokio::test]
async fn a_replayed_authorization_code_is_refused() {
    let Some(sso) = Sso::start("a replayed code", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let browser = sso.browser();
    let authorization = browser.authorization("/oauth2/authorization/corp").await;
    let callback = browser.at_provider(&authorization, "alice").await;
    let saved = browser.callback_cookie().expect("the flow's cookie");
    browser.land(&callback).await.tokens();
    let code = query_param(&callback, "code").unwrap();
    // The very same callback, cookie and all.
    let answer = sso
        .browser()
        .client
        .get(&callback)
        .header("cookie", &saved)
        .send()
        .await
        .unwrap();
    let error = landing_of(&sso, answer).refusal();
    assert_discreet(&error, &[&code]);
    // The code under a new flow of the same browser.
    let fresh = browser.authorization("/oauth2/authorization/corp").await;
    let state = query_param(&fresh, "state").unwrap();
    let replayed = with_param(&with_param(&callback, "state", &state), "code", &code);
    let error = browser.land(&replayed).await.refusal();
    assert_eq!(
        error,
        "Authentication failed: the code exchange was refused"
    );
}

#[tokio::test]
async fn no_parameter_or_host_redirects_outside_the_public_address() {
    let Some(sso) = Sso::start("open redirects", "", "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let evil = "https://evil.example/steal";
    let browser = sso.browser();
    // Parameters on the button: the provider still gets keygate's own
    // redirect URI, and the end lands under the public address.
    let mut button = "/oauth2/authorization/corp?".to_owned();
    for name in [
        "redirect_uri",
        "redirect",
        "next",
        "state",
        "returnTo",
        "continue",
    ] {
        button.push_str(&format!("{name}={evil}&"));
    }
    let authorization = browser.authorization(&button).await;
    assert_eq!(
        query_param(&authorization, "redirect_uri"),
        Some(sso.url("/login/oauth2/code/"))
    );
    assert_ne!(query_param(&authorization, "state").as_deref(), Some(evil));
    let callback = browser.at_provider(&authorization, "alice").await;
    // Parameters on the callback (Landing::of checks where each lands).
    let mut polluted = callback.clone();
    for name in [
        "redirect_uri",
        "redirect",
        "next",
        "returnTo",
        "continue",
        "error_uri",
    ] {
        polluted = with_param(&polluted, name, evil);
    }
    browser.land(&polluted).await;
    for (name, value) in [
        ("state", evil),
        ("state", "//evil.example/"),
        ("error", "access_denied"),
        ("error_description", evil),
    ] {
        browser.land(&with_param(&callback, name, value)).await;
    }
    // A crafted Host (and forwarding headers) on the button and the callback.
    for path in [
        "/oauth2/authorization/corp".to_owned(),
        "/login/oauth2/code/?code=x&state=y".to_owned(),
    ] {
        let raw = common::raw_https(
            &sso.gateway,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: evil.example\r\nX-Forwarded-Host: evil.example\r\n\
                 X-Forwarded-Proto: http\r\nForwarded: host=evil.example\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        let Some(location) = raw.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("location")
                .then(|| value.trim().to_owned())
        }) else {
            // Refusing the request outright sends the browser nowhere.
            let status = raw.split(' ').nth(1).unwrap_or_default();
            assert!(!status.starts_with('3'), "{path}:\n{raw}");
            continue;
        };
        match location.starts_with(&sso.provider.issuer) {
            true => assert_eq!(
                query_param(&location, "redirect_uri"),
                Some(sso.url("/login/oauth2/code/")),
                "{location}"
            ),
            false => oidc::assert_under(&sso.base, &location),
        }
    }
}

#[tokio::test]
async fn a_provider_access_token_reaches_the_upstream_as_its_user_over_both_wires() {
    let check = "provider access tokens on the API";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    let alice = sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let tokens = sso.provider_tokens("alice", Some(API_AUDIENCE)).await;
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["aud"], API_AUDIENCE);
    for wire in WIRES {
        for header in ["Authorization", "X-Authorization"] {
            let answer = sso
                .gateway
                .client_over(wire)
                .get(sso.gateway.https("/api/devices"))
                .header(header, format!("Bearer {access}"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.version(), wire.version());
            let status = answer.status();
            let body = answer.text().await.unwrap();
            assert_eq!(status, 200, "{wire:?} {header}: {body}");
            let seen = sso.upstream.last_to("/api/devices");
            assert_eq!(seen.headers["x-auth-email"], ALICE, "{wire:?}");
            assert_eq!(seen.headers["x-auth-user-id"], alice.id.to_string());
            assert!(
                !seen.headers.contains_key("authorization")
                    && !seen.headers.contains_key("x-authorization"),
                "the provider's token is not forwarded"
            );
        }
    }
}

#[tokio::test]
async fn a_provider_access_token_is_refused_over_plain_http() {
    let check = "provider access tokens over plain HTTP";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let tokens = sso.provider_tokens("alice", Some(API_AUDIENCE)).await;
    let access = tokens["access_token"].as_str().unwrap();
    for wire in WIRES {
        let answer = plain_client_over(wire)
            .get(sso.gateway.http("/api/devices"))
            .header("Authorization", format!("Bearer {access}"))
            .send()
            .await
            .unwrap();
        let (status, json) = error_body(answer).await;
        assert!(matches!(status, 401 | 403), "{wire:?}: {json}");
    }
    assert!(sso.upstream.requests().is_empty(), "nothing was forwarded");
}

#[tokio::test]
async fn an_unverified_email_in_a_provider_access_token_is_refused() {
    let check = "provider access tokens with an unverified e-mail";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway
        .user("bob@example.com", Authority::TenantAdmin)
        .await;
    let tokens = sso.provider_tokens("bob", Some(API_AUDIENCE)).await;
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["email_verified"], false);
    assert_refused_on_api(&sso, access, "bob's unverified e-mail").await;
    // Forged for alice without the verification claim.
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let mut unverified = sso.provider.access_claims(ALICE);
    unverified.as_object_mut().unwrap().remove("email_verified");
    assert_refused_on_api(&sso, &sso.provider.forge(&unverified), "no email_verified").await;
}

#[tokio::test]
async fn a_provider_access_token_for_another_audience_is_refused() {
    let check = "provider access tokens for another audience";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let tokens = sso.provider_tokens("alice", Some(OTHER_AUDIENCE)).await;
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["aud"], OTHER_AUDIENCE);
    assert_refused_on_api(&sso, access, "a token for another resource").await;
}

#[tokio::test]
async fn an_id_token_is_not_an_access_token() {
    let check = "an ID token used as an access token";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let tokens = sso.provider_tokens("alice", None).await;
    let id_token = tokens["id_token"].as_str().unwrap();
    assert_eq!(claims(id_token)["aud"], oidc::CLIENT_ID);
    assert_eq!(claims(id_token)["email"], ALICE);
    assert_refused_on_api(&sso, id_token, "an ID token").await;
}

#[tokio::test]
async fn a_token_from_another_issuer_is_refused() {
    let check = "a token from another issuer";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let mut claims = sso.provider.access_claims(ALICE);
    assert_accepted_as_alice(&sso, &sso.provider.forge(&claims), "the control").await;
    for issuer in [
        "https://evil.example",
        &format!("{}/", sso.provider.issuer),
        "thingsboard.io",
    ] {
        claims["iss"] = json!(issuer);
        assert_refused_on_api(&sso, &sso.provider.forge(&claims), issuer).await;
    }
    claims.as_object_mut().unwrap().remove("iss");
    assert_refused_on_api(&sso, &sso.provider.forge(&claims), "no issuer").await;
}

#[tokio::test]
async fn an_expired_or_not_yet_valid_provider_token_is_refused() {
    let check = "provider token lifetimes";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let now = keygate::clock::now_secs() as i64;
    let mut claims = sso.provider.access_claims(ALICE);
    claims["exp"] = json!(now - 3600);
    claims["iat"] = json!(now - 7200);
    assert_refused_on_api(&sso, &sso.provider.forge(&claims), "expired").await;
    let mut claims = sso.provider.access_claims(ALICE);
    claims["nbf"] = json!(now + 3600);
    assert_refused_on_api(&sso, &sso.provider.forge(&claims), "not yet valid").await;
}

#[tokio::test]
async fn an_unsigned_token_is_refused() {
    let Some(sso) = Sso::start("alg none", ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let claims = sso.provider.access_claims(ALICE);
    assert_accepted_as_alice(&sso, &sso.provider.forge(&claims), "the control").await;
    let kid = &sso.provider.key.kid;
    for alg in ["none", "None", "NONE"] {
        let header = json!({ "alg": alg, "typ": "at+jwt", "kid": kid });
        let token = oidc::unsigned_token(&header, &claims, b"");
        assert_refused_on_api(&sso, &token, alg).await;
        // The real signature, re-labelled as none.
        let signed = sso.provider.forge(&claims);
        let signature = signed.rsplit('.').next().unwrap();
        let relabelled = format!(
            "{}.{signature}",
            oidc::unsigned_token(&header, &claims, b"").trim_end_matches('.')
        );
        assert_refused_on_api(&sso, &relabelled, alg).await;
    }
}

#[tokio::test]
async fn an_hs256_token_keyed_with_the_provider_public_key_is_refused() {
    let check = "HS256 with the public key";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let claims = sso.provider.access_claims(ALICE);
    assert_accepted_as_alice(&sso, &sso.provider.forge(&claims), "the control").await;
    let key = &sso.provider.key;
    let jwk = key.public_jwk().to_string();
    let published: Value = sso
        .provider
        .client()
        .get(sso.provider.url("/jwks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let published = published["keys"][0].to_string();
    for secret in [key.public_pem(), jwk, published] {
        for alg in ["HS256", "HS384", "HS512"] {
            let header = json!({ "alg": alg, "typ": "at+jwt", "kid": key.kid });
            let token = oidc::hmac_token(&header, &claims, secret.as_bytes());
            assert_refused_on_api(&sso, &token, alg).await;
        }
    }
}

#[tokio::test]
async fn a_flood_of_unknown_key_ids_costs_at_most_one_key_set_fetch() {
    let check = "unknown key ids";
    let Some(sso) = Sso::start(check, ACCEPT_ACCESS_TOKENS, "").await else {
        return;
    };
    sso.gateway.user(ALICE, Authority::TenantAdmin).await;
    let claims = sso.provider.access_claims(ALICE);
    assert_accepted_as_alice(&sso, &sso.provider.forge(&claims), "the control").await;
    let before = sso.provider.jwks_fetches().await;
    let flood: Vec<String> = (0..64)
        .map(|i| {
            let kid = format!("unknown-{i}-{}", uuid::Uuid::new_v4().simple());
            sso.provider.key.sign(&kid, &claims)
        })
        .collect();
    let started = Instant::now();
    let answers = futures_util::future::join_all(
        flood
            .iter()
            .map(|token| async { api_call(&sso, common::Wire::Http2, token).await.status() }),
    )
    .await;
    eprintln!(
        "{} requests with unknown key ids answered in {:?}",
        flood.len(),
        started.elapsed()
    );
    assert!(answers.iter().all(|s| *s == 401), "{answers:?}");
    let fetched = sso.provider.jwks_fetches().await - before;
    assert!(
        fetched <= 1,
        "the flood cost {fetched} key set fetches at the provider"
    );
    // The known key still works after the flood.
    assert_accepted_as_alice(&sso, &sso.provider.forge(&claims), "after the flood").await;
}

/// Configures TOTP for the user of `token` (as the account page does);
/// returns the secret and the step whose code saved it.
async fn configure_totp(sso: &Sso, token: &str) -> (String, i64) {
    let client = sso.gateway.client();
    let post = |path: &str| {
        client
            .post(sso.gateway.https(path))
            .header("X-Authorization", format!("Bearer {token}"))
    };
    let config: Value = post("/api/2fa/account/config/generate?providerType=TOTP")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = config["authUrl"].as_str().expect("a TOTP config");
    let secret = url
        .split_once("secret=")
        .unwrap()
        .1
        .split('&')
        .next()
        .unwrap();
    let step = step_now();
    let path = format!(
        "/api/2fa/account/config?verificationCode={}",
        totp_at(secret, step)
    );
    let answer = post(&path).json(&config).send().await.unwrap();
    assert_eq!(answer.status(), 200, "TOTP saved");
    (secret.to_owned(), step)
}

/// A user with a second factor is stopped at it after single sign-on, as
/// after a password, unless `trust_provider_mfa` is on and the provider's
/// ID token shows one (`amr`).
#[tokio::test]
async fn a_second_factor_is_asked_after_sign_on_unless_the_provider_proved_one() {
    let check = "the second factor after single sign-on";
    for trust in [false, true] {
        let settings = format!("trust_provider_mfa = {trust}");
        let Some(sso) = Sso::start(check, &settings, "").await else {
            return;
        };
        for (user, email) in [("carol", "carol@example.com"), ("alice", ALICE)] {
            sso.gateway.user(email, Authority::TenantAdmin).await;
            let (password_token, _) = sso.sign_in(user).await.tokens();
            let (secret, step) = configure_totp(&sso, &password_token).await;
            let landing = sso.sign_in(user).await;
            // carol's amr shows a second factor at the provider; alice's not.
            if trust && user == "carol" {
                landing.tokens();
                continue;
            }
            let pre = landing.second_factor();
            assert_eq!(claims(&pre)["scopes"], json!(["PRE_VERIFICATION_TOKEN"]));
            let (status, _) = error_body(current_user(&sso, &pre).await).await;
            assert_eq!(status, 401, "the pre-verification token opens nothing else");
            let answer = sso
                .gateway
                .client()
                .post(sso.gateway.https(&format!(
                    "/api/auth/2fa/verification/check?providerType=TOTP&verificationCode={}",
                    totp_at(&secret, step + 1)
                )))
                .header("X-Authorization", format!("Bearer {pre}"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200, "{user}, trust {trust}");
            let pair: Value = answer.json().await.unwrap();
            let access = pair["token"].as_str().unwrap();
            assert_eq!(current_user(&sso, access).await.status(), 200);
        }
    }
}
