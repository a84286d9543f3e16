//! Second factors end to end: configuring TOTP and backup codes, logging in
//! through a pre-verification token, and the attacks on both. Codes are
//! computed here by an implementation of RFC 6238 of the test's own. The
//! refusals and the replays run their one body over both wires
//! ([`common::WIRES`]): HTTP/1.1 (the lean path for a proxied route,
//! hyper's for keygate's own endpoints) and HTTP/2.

mod common;

use base64::Engine;
use common::totp::{base32_decode, step_now, totp_at};
use common::{Gateway, PASSWORD, WIRES, Wire, api_key_header, error_body};
use keygate::identity::Authority;
use serde_json::{Value, json};

fn secret_of(auth_url: &str) -> String {
    auth_url
        .split_once("secret=")
        .unwrap()
        .1
        .split('&')
        .next()
        .unwrap()
        .to_string()
}

fn claims(token: &str) -> Value {
    let part = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

// --- helpers ---------------------------------------------------------------------

async fn send(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> reqwest::Response {
    send_with(&gw.client(), gw, method, path, token, body).await
}

/// As [`send`], over `client` (a wire of the test's choice).
async fn send_with(
    client: &reqwest::Client,
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = client
        .request(method, gw.https(path))
        .header("X-Authorization", format!("Bearer {token}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

/// As [`send`], over `wire`.
async fn send_over(
    wire: Wire,
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let response = send_with(&gw.client_over(wire), gw, method, path, token, body).await;
    assert_eq!(response.version(), wire.version(), "{path}");
    response
}

async fn login_json(gw: &Gateway, email: &str) -> Value {
    let response = gw.login(email, PASSWORD).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// A full token for `email` (the user has no second factor yet).
async fn token_of(gw: &Gateway, email: &str) -> String {
    let body = login_json(gw, email).await;
    assert!(body["refreshToken"].is_string(), "{body}");
    body["token"].as_str().unwrap().to_string()
}

/// Configures TOTP for the user of `token`; returns the Base32 secret and
/// the step whose code saved it.
async fn configure_totp(gw: &Gateway, token: &str) -> (String, i64) {
    let response = send(
        gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=TOTP",
        token,
        None,
    )
    .await;
    assert_eq!(response.status(), 200);
    let config: Value = response.json().await.unwrap();
    assert_eq!(config["providerType"], "TOTP");
    assert_eq!(config["useByDefault"], false);
    let url = config["authUrl"].as_str().unwrap();
    assert!(url.starts_with("otpauth://totp/keygate:"), "{url}");
    assert!(url.contains("issuer=keygate"), "{url}");
    let secret = secret_of(url);
    let step = step_now();
    let response = send(
        gw,
        reqwest::Method::POST,
        &format!(
            "/api/2fa/account/config?verificationCode={}",
            totp_at(&secret, step)
        ),
        token,
        Some(config),
    )
    .await;
    assert_eq!(response.status(), 200);
    let settings: Value = response.json().await.unwrap();
    assert_eq!(
        settings["configs"]["TOTP"],
        json!({"providerType": "TOTP", "useByDefault": true})
    );
    (secret, step)
}

async fn configure_backup_codes(gw: &Gateway, token: &str) -> Vec<String> {
    let response = send(
        gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=BACKUP_CODE",
        token,
        None,
    )
    .await;
    assert_eq!(response.status(), 200);
    let config: Value = response.json().await.unwrap();
    let codes: Vec<String> = config["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(codes.len(), 10);
    assert!(codes.iter().all(|c| c.len() == 8));
    let response = send(
        gw,
        reqwest::Method::POST,
        "/api/2fa/account/config",
        token,
        Some(config),
    )
    .await;
    assert_eq!(response.status(), 200);
    codes
}

/// Logs in with the password; the answer must be a pre-verification token.
async fn pre_token(gw: &Gateway, email: &str) -> String {
    let body = login_json(gw, email).await;
    assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
    assert!(body["refreshToken"].is_null(), "{body}");
    body["token"].as_str().unwrap().to_string()
}

async fn check(gw: &Gateway, pre: &str, provider: &str, code: &str) -> reqwest::Response {
    check_over(Wire::Http2, gw, pre, provider, code).await
}

/// [`check`] over `wire`.
async fn check_over(
    wire: Wire,
    gw: &Gateway,
    pre: &str,
    provider: &str,
    code: &str,
) -> reqwest::Response {
    send_over(
        wire,
        gw,
        reqwest::Method::POST,
        &format!(
            "/api/auth/2fa/verification/check?providerType={provider}&verificationCode={code}"
        ),
        pre,
        None,
    )
    .await
}

async fn current_user(gw: &Gateway, token: &str) -> reqwest::Response {
    current_user_over(Wire::Http2, gw, token).await
}

/// [`current_user`] over `wire`.
async fn current_user_over(wire: Wire, gw: &Gateway, token: &str) -> reqwest::Response {
    send_over(
        wire,
        gw,
        reqwest::Method::GET,
        "/api/auth/user",
        token,
        None,
    )
    .await
}

// --- the flow --------------------------------------------------------------------

#[tokio::test]
async fn totp_login_answers_a_pre_verification_token_then_the_pair_for_a_current_code() {
    let (_up, gw) = common::gateway("").await;
    for wire in WIRES {
        let email = format!("totp-{wire:?}@example.com").to_lowercase();
        gw.user(&email, Authority::TenantAdmin).await;
        totp_login_over(wire, &gw, &email).await;
    }
}

/// `email` configures TOTP and logs in with it, every step over `wire`.
async fn totp_login_over(wire: Wire, gw: &Gateway, email: &str) {
    let token = token_of(gw, email).await;
    let providers: Value = send_over(
        wire,
        gw,
        reqwest::Method::GET,
        "/api/2fa/providers",
        &token,
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(providers, json!(["TOTP", "BACKUP_CODE"]));
    let (secret, saved_step) = configure_totp(gw, &token).await;

    // The secret is shown once: the settings say TOTP is there, and no more.
    let settings = send_over(
        wire,
        gw,
        reqwest::Method::GET,
        "/api/2fa/account/settings",
        &token,
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(!settings.contains(&secret), "{settings}");
    assert!(!settings.contains("authUrl"), "{settings}");
    assert!(settings.contains("\"TOTP\""), "{settings}");

    let pre = pre_token(gw, email).await;
    let pre_claims = claims(&pre);
    assert_eq!(pre_claims["scopes"], json!(["PRE_VERIFICATION_TOKEN"]));
    assert_eq!(
        pre_claims["exp"].as_i64().unwrap() - pre_claims["iat"].as_i64().unwrap(),
        300,
        "five minutes by default"
    );
    let infos: Value = send_over(
        wire,
        gw,
        reqwest::Method::GET,
        "/api/auth/2fa/providers",
        &pre,
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(infos[0]["type"], "TOTP");
    assert_eq!(infos[0]["default"], true);
    let sent = send_over(
        wire,
        gw,
        reqwest::Method::POST,
        "/api/auth/2fa/verification/send?providerType=TOTP",
        &pre,
        None,
    )
    .await;
    assert_eq!(sent.status(), 200);

    // The code that saved the secret was used; the next step's is fresh.
    let response = check_over(wire, gw, &pre, "TOTP", &totp_at(&secret, saved_step + 1)).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    let access = pair["token"].as_str().unwrap();
    assert!(pair["refreshToken"].is_string());
    assert_eq!(claims(access)["scopes"], json!(["TENANT_ADMIN"]));
    assert_eq!(current_user_over(wire, gw, access).await.status(), 200);

    // The attempt is over: its token gets nothing more.
    let again = check_over(wire, gw, &pre, "TOTP", &totp_at(&secret, saved_step + 2)).await;
    assert_eq!(again.status(), 401);
}

#[tokio::test]
async fn pre_verification_token_is_refused_by_every_other_endpoint_and_proxied_route() {
    let (upstream, gw) = common::gateway("").await;
    gw.user("scope@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "scope@example.com").await;
    configure_totp(&gw, &token).await;
    let pre = pre_token(&gw, "scope@example.com").await;
    for wire in WIRES {
        refused_everywhere_but_its_own(wire, &gw, &pre, PRE_OPENS).await;
    }
    assert_eq!(upstream.arrived(), 0, "nothing was forwarded");

    // And the second-factor endpoints take nothing but that token.
    let full = token;
    for wire in WIRES {
        let response = check_over(wire, &gw, &full, "TOTP", "000000").await;
        assert_eq!(response.status(), 401, "{wire:?}");
    }
}

/// What a pre-verification token opens: the second step's endpoints.
const PRE_OPENS: &[keygate::api::Access] = &[keygate::api::Access::PreVerification];

/// Over `wire`, `token` (which opens only the endpoints of an access in
/// `opens`) is refused by every other authenticated endpoint, by proxied
/// routes and as a refresh token.
async fn refused_everywhere_but_its_own(
    wire: Wire,
    gw: &Gateway,
    token: &str,
    opens: &[keygate::api::Access],
) {
    let declines = gw.declines().await;
    for route in keygate::api::ROUTES {
        if route.access == keygate::api::Access::Public || opens.contains(&route.access) {
            continue;
        }
        let path = path_of(route.pattern);
        let method = route.method.clone();
        let response = send_over(wire, gw, method, &path, token, Some(json!({}))).await;
        let (status, body) = error_body(response).await;
        assert_eq!(status, 401, "{wire:?} {} {path}: {body}", route.method);
    }
    for path in ["/api/tenant/devices?pageSize=10&page=0", "/api/device/1"] {
        let response = send_over(wire, gw, reqwest::Method::GET, path, token, None).await;
        assert_eq!(response.status(), 401, "{wire:?} {path}");
    }
    let refresh = gw
        .client_over(wire)
        .post(gw.https("/api/auth/token"))
        .json(&json!({ "refreshToken": token }))
        .send()
        .await
        .unwrap();
    assert_eq!(refresh.status(), 401, "{wire:?}");
    // The proxied routes' refusals were the lean path's.
    gw.assert_lean_path_took(&declines, &["not_proxied"], &format!("{wire:?}"))
        .await;
}

#[tokio::test]
async fn replayed_totp_code_is_refused_even_within_the_skew() {
    let (_up, gw) = common::gateway("").await;
    gw.user("replay@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "replay@example.com").await;
    let (secret, saved_step) = configure_totp(&gw, &token).await;
    let code = totp_at(&secret, saved_step + 1);
    // Used over HTTP/1.1, replayed over either wire.
    let first = pre_token(&gw, "replay@example.com").await;
    let used = check_over(Wire::Http1, &gw, &first, "TOTP", &code).await;
    assert_eq!(used.status(), 200);
    let second = pre_token(&gw, "replay@example.com").await;
    for wire in WIRES {
        let replayed = check_over(wire, &gw, &second, "TOTP", &code).await;
        let (status, body) = error_body(replayed).await;
        assert_eq!(status, 400, "{wire:?}");
        assert_eq!(body["message"], "Verification code is incorrect");
        // The code that saved the secret cannot log in either.
        let saved = totp_at(&secret, saved_step);
        let response = check_over(wire, &gw, &second, "TOTP", &saved).await;
        assert_eq!(response.status(), 400, "{wire:?}");
    }
}

#[tokio::test]
async fn totp_secret_chosen_by_the_client_is_never_saved() {
    let (_up, gw) = common::gateway("").await;
    gw.user("chosen@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "chosen@example.com").await;
    let chosen = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP";
    let config = json!({
        "providerType": "TOTP",
        "useByDefault": true,
        "authUrl": format!("otpauth://totp/x:chosen@example.com?issuer=x&secret={chosen}")
    });
    let path = format!(
        "/api/2fa/account/config?verificationCode={}",
        totp_at(chosen, step_now())
    );
    // Nothing generated yet.
    let response = send(
        &gw,
        reqwest::Method::POST,
        &path,
        &token,
        Some(config.clone()),
    )
    .await;
    let (status, body) = error_body(response).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("not generated"),
        "{body}"
    );
    // Generated, but another secret submitted.
    let generated = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=TOTP",
        &token,
        None,
    )
    .await;
    assert_eq!(generated.status(), 200);
    let response = send(&gw, reqwest::Method::POST, &path, &token, Some(config)).await;
    assert_eq!(response.status(), 400);
    let settings: Value = send(
        &gw,
        reqwest::Method::GET,
        "/api/2fa/account/settings",
        &token,
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(settings, json!({"configs": {}}));
    // Backup codes other than those generated are refused too.
    let response = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config",
        &token,
        Some(json!({"providerType": "BACKUP_CODE", "codes": ["00000000"]})),
    )
    .await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn guessing_codes_ends_the_pre_verification_token() {
    let (_up, gw) = common::gateway("[two_factor]\nmax_verification_failures = 3\n").await;
    gw.user("guess@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "guess@example.com").await;
    let (secret, saved_step) = configure_totp(&gw, &token).await;
    let pre = pre_token(&gw, "guess@example.com").await;
    let right = totp_at(&secret, saved_step + 1);
    let wrong = if right == "000000" {
        "111111"
    } else {
        "000000"
    };
    // The wires take turns: one token, one count of guesses.
    for wire in WIRES {
        let (status, _) = error_body(check_over(wire, &gw, &pre, "TOTP", wrong).await).await;
        assert_eq!(status, 400, "{wire:?}");
    }
    let (status, body) = error_body(check_over(Wire::Http1, &gw, &pre, "TOTP", wrong).await).await;
    assert_eq!(status, 401, "{body}");
    for wire in WIRES {
        let (status, _) = error_body(check_over(wire, &gw, &pre, "TOTP", &right).await).await;
        assert_eq!(status, 401, "{wire:?}: the right code comes too late");
    }
    // The owner logs in again and gets in.
    let fresh = pre_token(&gw, "guess@example.com").await;
    let response = check_over(Wire::Http1, &gw, &fresh, "TOTP", &right).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn code_guesses_are_limited_per_account_and_address() {
    let (_up, gw) = common::gateway(
        "[login]\naccount_address_max_failures = 3\n[two_factor]\nmax_verification_failures = 100\n",
    )
    .await;
    gw.user("slots@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "slots@example.com").await;
    let (secret, saved_step) = configure_totp(&gw, &token).await;
    let pre = pre_token(&gw, "slots@example.com").await;
    let right = totp_at(&secret, saved_step + 1);
    let wrong = if right == "000000" {
        "111111"
    } else {
        "000000"
    };
    // The wires take turns: one account and address, one window.
    for n in 0..3 {
        let response = check_over(WIRES[n % 2], &gw, &pre, "TOTP", wrong).await;
        assert_eq!(response.status(), 400, "{:?}", WIRES[n % 2]);
    }
    for wire in WIRES {
        let response = check_over(wire, &gw, &pre, "TOTP", &right).await;
        let (status, _) = error_body(response).await;
        assert_eq!(
            status, 429,
            "{wire:?}: even the right code waits for the window"
        );
    }
}

#[tokio::test]
async fn backup_code_is_single_use_and_reports_codes_left() {
    let (_up, gw) = common::gateway("").await;
    gw.user("backup@example.com", Authority::CustomerUser).await;
    let token = token_of(&gw, "backup@example.com").await;
    // Backup codes alone are no second factor.
    let generated = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=BACKUP_CODE",
        &token,
        None,
    )
    .await
    .json::<Value>()
    .await
    .unwrap();
    let alone = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config",
        &token,
        Some(generated),
    )
    .await;
    assert_eq!(alone.status(), 400);
    configure_totp(&gw, &token).await;
    let codes = configure_backup_codes(&gw, &token).await;

    // Used over HTTP/1.1, gone over either wire.
    let pre = pre_token(&gw, "backup@example.com").await;
    let response = check_over(Wire::Http1, &gw, &pre, "BACKUP_CODE", &codes[3]).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    assert_eq!(pair["codesLeft"], 9);
    assert_eq!(
        current_user(&gw, pair["token"].as_str().unwrap())
            .await
            .status(),
        200
    );
    let pre = pre_token(&gw, "backup@example.com").await;
    for wire in WIRES {
        assert_eq!(
            check_over(wire, &gw, &pre, "BACKUP_CODE", &codes[3])
                .await
                .status(),
            400,
            "{wire:?}: a used code is gone"
        );
    }
    let settings: Value = send(
        &gw,
        reqwest::Method::GET,
        "/api/2fa/account/settings",
        &token,
        None,
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(settings["configs"]["BACKUP_CODE"]["codesLeft"], 9);
    assert!(settings["configs"]["BACKUP_CODE"]["codes"].is_null());
    let audit = gw.running.store.audit_events(50).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert!(actions.contains(&"two_factor.configure"), "{actions:?}");
    assert!(
        actions.contains(&"two_factor.backup_code_used"),
        "{actions:?}"
    );
}

#[tokio::test]
async fn second_factor_secrets_are_not_readable_in_the_store() {
    let (_up, gw) = common::gateway("").await;
    let user = gw.user("stored@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "stored@example.com").await;
    let (secret, _) = configure_totp(&gw, &token).await;
    let codes = configure_backup_codes(&gw, &token).await;
    let url = format!("sqlite://{}/keygate.db", gw.dir.path().display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT provider, secret FROM two_factor WHERE user_id = $1")
            .bind(user.id.to_string())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    let raw = base32_decode(&secret);
    let raw_hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    for (provider, stored) in &rows {
        assert!(
            !stored.to_uppercase().contains(&secret),
            "{provider}: {stored}"
        );
        assert!(!stored.contains(&raw_hex), "{provider}: {stored}");
        for code in &codes {
            assert!(!stored.contains(code.as_str()), "{provider}: {stored}");
        }
    }
    let totp = &rows.iter().find(|(p, _)| p == "TOTP").unwrap().1;
    assert!(totp.starts_with("v1."), "sealed: {totp}");
    pool.close().await;
}

#[tokio::test]
async fn api_keys_are_not_affected_by_a_second_factor() {
    let (upstream, gw) = common::gateway("").await;
    let user = gw.user("keys@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "keys@example.com").await;
    configure_totp(&gw, &token).await;
    let (_, key) = gw.api_key(&user, 0).await;
    for wire in WIRES {
        let declines = gw.declines().await;
        let response = gw
            .client_over(wire)
            .get(gw.https("/api/tenant/devices?pageSize=1&page=0"))
            .header("X-Authorization", api_key_header(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), wire.version());
        assert_eq!(response.status(), 200, "{wire:?}");
        gw.assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
            .await;
    }
    assert_eq!(upstream.arrived(), 2);
}

#[tokio::test]
async fn platform_settings_are_for_the_sys_admin_and_narrow_the_providers() {
    let (_up, gw) = common::gateway("").await;
    gw.user("narrow@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "narrow@example.com").await;
    let (status, _) =
        error_body(send(&gw, reqwest::Method::GET, "/api/2fa/settings", &token, None).await).await;
    assert_eq!(status, 403);
    configure_totp(&gw, &token).await;
    pre_token(&gw, "narrow@example.com").await;

    let admin = token_of(&gw, keygate::accounts::BOOTSTRAP_EMAIL).await;
    let current: Value = send(&gw, reqwest::Method::GET, "/api/2fa/settings", &admin, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(current["providers"][0]["providerType"], "TOTP");
    assert_eq!(current["totalAllowedTimeForVerification"], 300);
    let email =
        json!({"providers": [{"providerType": "EMAIL"}], "totalAllowedTimeForVerification": 300});
    let (status, _) = error_body(
        send(
            &gw,
            reqwest::Method::POST,
            "/api/2fa/settings",
            &admin,
            Some(email),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
    let only_codes = json!({
        "providers": [{"providerType": "BACKUP_CODE", "codesQuantity": 5}],
        "minVerificationCodeSendPeriod": 30,
        "totalAllowedTimeForVerification": 120
    });
    let saved = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/settings",
        &admin,
        Some(only_codes),
    )
    .await;
    assert_eq!(saved.status(), 200);
    // TOTP is no longer offered: the user's TOTP no longer counts.
    let body = login_json(&gw, "narrow@example.com").await;
    assert!(body["refreshToken"].is_string(), "{body}");
}

#[tokio::test]
async fn removing_the_last_provider_removes_backup_codes_and_the_second_step() {
    let (_up, gw) = common::gateway("").await;
    gw.user("remove@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "remove@example.com").await;
    configure_totp(&gw, &token).await;
    configure_backup_codes(&gw, &token).await;
    let response = send(
        &gw,
        reqwest::Method::PUT,
        "/api/2fa/account/config?providerType=BACKUP_CODE",
        &token,
        Some(json!({"useByDefault": true})),
    )
    .await;
    let settings: Value = response.json().await.unwrap();
    assert_eq!(settings["configs"]["BACKUP_CODE"]["useByDefault"], true);
    assert_eq!(settings["configs"]["TOTP"]["useByDefault"], false);
    let response = send(
        &gw,
        reqwest::Method::DELETE,
        "/api/2fa/account/config?providerType=TOTP",
        &token,
        None,
    )
    .await;
    assert_eq!(response.status(), 200);
    let settings: Value = response.json().await.unwrap();
    assert_eq!(settings, json!({"configs": {}}));
    let body = login_json(&gw, "remove@example.com").await;
    assert!(body["refreshToken"].is_string(), "{body}");
    let audit = gw.running.store.audit_events(50).await.unwrap();
    assert!(audit.iter().any(|e| e.action == "two_factor.remove"));
    let (status, _) = error_body(
        send(
            &gw,
            reqwest::Method::DELETE,
            "/api/2fa/account/config?providerType=TOTP",
            &token,
            None,
        )
        .await,
    )
    .await;
    assert_eq!(status, 400);
}

// --- enforcement -------------------------------------------------------------------

const ENFORCED: &str = "[two_factor]\nenforce = true\n";

/// Logs in with the password; the answer must be an MFA configuration token.
async fn mfa_token(gw: &Gateway, email: &str) -> String {
    let body = login_json(gw, email).await;
    assert_eq!(body["scope"], "MFA_CONFIGURATION_TOKEN", "{body}");
    assert!(body["refreshToken"].is_null(), "{body}");
    body["token"].as_str().unwrap().to_string()
}

async fn configured_login(gw: &Gateway, token: &str) -> reqwest::Response {
    send(
        gw,
        reqwest::Method::POST,
        "/api/auth/2fa/login",
        token,
        None,
    )
    .await
}

fn path_of(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|s| {
            if s.starts_with('{') {
                "784f394c-42b6-435a-983c-b7beff2784f9"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn enforced_user_without_a_provider_configures_one_with_the_mfa_token_then_gets_the_pair() {
    let (_up, gw) = common::gateway(ENFORCED).await;
    gw.user("enforced@example.com", Authority::TenantAdmin)
        .await;
    let mfa = mfa_token(&gw, "enforced@example.com").await;
    let mfa_claims = claims(&mfa);
    assert_eq!(mfa_claims["scopes"], json!(["MFA_CONFIGURATION_TOKEN"]));
    assert_eq!(
        mfa_claims["exp"].as_i64().unwrap() - mfa_claims["iat"].as_i64().unwrap(),
        300,
        "lives the verification time"
    );

    // No provider yet: no pair.
    let (status, body) = error_body(configured_login(&gw, &mfa).await).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["message"], "2FA is not configured");

    // The token opens the configuring endpoints.
    let providers: Value = send(&gw, reqwest::Method::GET, "/api/2fa/providers", &mfa, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(providers, json!(["TOTP", "BACKUP_CODE"]));
    let (secret, saved_step) = configure_totp(&gw, &mfa).await;
    let settings = send(
        &gw,
        reqwest::Method::GET,
        "/api/2fa/account/settings",
        &mfa,
        None,
    )
    .await;
    assert_eq!(settings.status(), 200);

    let response = configured_login(&gw, &mfa).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    let access = pair["token"].as_str().unwrap();
    assert!(pair["refreshToken"].is_string(), "{pair}");
    assert_eq!(claims(access)["scopes"], json!(["TENANT_ADMIN"]));
    assert_eq!(current_user(&gw, access).await.status(), 200);

    // That login is over: the token gets nothing more.
    assert_eq!(configured_login(&gw, &mfa).await.status(), 401);
    let generate = send(
        &gw,
        reqwest::Method::POST,
        "/api/2fa/account/config/generate?providerType=BACKUP_CODE",
        &mfa,
        None,
    )
    .await;
    assert_eq!(generate.status(), 401);

    // From now on the password leads to the second factor.
    let pre = pre_token(&gw, "enforced@example.com").await;
    let response = check(&gw, &pre, "TOTP", &totp_at(&secret, saved_step + 1)).await;
    assert_eq!(response.status(), 200);

    // And the enforced factor cannot be removed.
    let (status, body) = error_body(
        send(
            &gw,
            reqwest::Method::DELETE,
            "/api/2fa/account/config?providerType=TOTP",
            access,
            None,
        )
        .await,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["message"], "At least one 2FA provider is required");
}

#[tokio::test]
async fn mfa_configuration_token_is_refused_by_every_other_endpoint_and_proxied_route() {
    let (upstream, gw) = common::gateway(ENFORCED).await;
    gw.user("mfa-scope@example.com", Authority::TenantAdmin)
        .await;
    let mfa = mfa_token(&gw, "mfa-scope@example.com").await;
    let opens = [
        keygate::api::Access::Configuring,
        keygate::api::Access::MfaConfiguration,
    ];
    for wire in WIRES {
        refused_everywhere_but_its_own(wire, &gw, &mfa, &opens).await;
    }
    // Named: a key, a password change, the platform settings, removing a factor.
    let attempts = [
        (
            reqwest::Method::POST,
            "/api/apiKey",
            json!({"description": "mine"}),
        ),
        (
            reqwest::Method::POST,
            "/api/auth/changePassword",
            json!({"currentPassword": PASSWORD, "newPassword": "an0ther-Passw0rd!"}),
        ),
        (reqwest::Method::GET, "/api/2fa/settings", json!({})),
        (
            reqwest::Method::DELETE,
            "/api/2fa/account/config?providerType=TOTP",
            json!({}),
        ),
    ];
    for wire in WIRES {
        for (method, path, body) in attempts.clone() {
            let response = send_over(wire, &gw, method.clone(), path, &mfa, Some(body)).await;
            assert_eq!(response.status(), 401, "{wire:?} {method} {path}");
        }
        let loginx = "/api/auth/2fa/loginx";
        let response = send_over(wire, &gw, reqwest::Method::GET, loginx, &mfa, None).await;
        assert_eq!(response.status(), 401, "{wire:?} {loginx}");
    }
    assert_eq!(upstream.arrived(), 0, "nothing was forwarded");

    // The old password still works: nothing was changed with that token.
    mfa_token(&gw, "mfa-scope@example.com").await;
    // And the configured login takes nothing but that token.
    let user = gw.user("other@example.com", Authority::TenantAdmin).await;
    let (_, access) = gw.access_token(&user).await;
    assert_eq!(configured_login(&gw, &access).await.status(), 401);
}

#[tokio::test]
async fn expired_mfa_configuration_token_opens_nothing() {
    let (_up, gw) = common::gateway(ENFORCED).await;
    let user = gw
        .user("expired-mfa@example.com", Authority::TenantAdmin)
        .await;
    let keys = gw.running.app.authenticator().token_keys();
    let expired = keys
        .sign_second_factor(
            &user,
            "MFA_CONFIGURATION_TOKEN",
            uuid::Uuid::new_v4(),
            keygate::clock::now_secs() - 400,
            std::time::Duration::from_secs(300),
        )
        .unwrap()
        .token;
    for (method, path) in [
        (reqwest::Method::GET, "/api/2fa/providers"),
        (
            reqwest::Method::POST,
            "/api/2fa/account/config/generate?providerType=TOTP",
        ),
        (reqwest::Method::GET, "/api/2fa/account/settings"),
        (reqwest::Method::POST, "/api/auth/2fa/login"),
    ] {
        let (status, body) =
            error_body(send(&gw, method.clone(), path, &expired, None).await).await;
        assert_eq!(status, 401, "{method} {path}: {body}");
    }
    // A token signed with another key is no MFA token either.
    let other = keygate::auth::jwt::TokenKeys::new(
        &[7u8; 64],
        "keygate",
        std::time::Duration::from_secs(900),
        std::time::Duration::from_secs(3600),
    );
    let forged = other
        .sign_second_factor(
            &user,
            "MFA_CONFIGURATION_TOKEN",
            uuid::Uuid::new_v4(),
            keygate::clock::now_secs(),
            std::time::Duration::from_secs(300),
        )
        .unwrap()
        .token;
    assert_eq!(configured_login(&gw, &forged).await.status(), 401);
    assert_eq!(
        send(
            &gw,
            reqwest::Method::GET,
            "/api/2fa/providers",
            &forged,
            None
        )
        .await
        .status(),
        401
    );
}

#[tokio::test]
async fn enforcement_applies_to_the_users_the_platform_settings_name() {
    let (_up, gw) = common::gateway("").await;
    let chosen = gw
        .user("chosen-tenant@example.com", Authority::TenantAdmin)
        .await;
    gw.user("other-tenant@example.com", Authority::TenantAdmin)
        .await;
    gw.user("customer@example.com", Authority::CustomerUser)
        .await;
    let admin = token_of(&gw, keygate::accounts::BOOTSTRAP_EMAIL).await;
    let base = json!({
        "providers": [{"providerType": "TOTP", "issuerName": "keygate"}],
        "minVerificationCodeSendPeriod": 30,
        "totalAllowedTimeForVerification": 300,
        "enforceTwoFa": true
    });
    let save = |body: Value| {
        let gw = &gw;
        let admin = admin.clone();
        async move {
            send(
                gw,
                reqwest::Method::POST,
                "/api/2fa/settings",
                &admin,
                Some(body),
            )
            .await
        }
    };
    // Enforcing needs a filter, and keygate knows no tenant profiles.
    let (status, body) = error_body(save(base.clone()).await).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["message"],
        "Users filter to enforce 2FA for is required"
    );
    let mut profiles = base.clone();
    profiles["enforcedUsersFilter"] = json!({
        "type": "TENANT_ADMINISTRATORS",
        "tenantProfilesIds": [uuid::Uuid::new_v4()]
    });
    assert_eq!(save(profiles).await.status(), 400);
    let mut unknown = base.clone();
    unknown["enforcedUsersFilter"] = json!({"type": "USER_LIST", "usersIds": []});
    assert_eq!(save(unknown).await.status(), 400);

    let mut one_tenant = base.clone();
    one_tenant["enforcedUsersFilter"] = json!({
        "type": "TENANT_ADMINISTRATORS",
        "tenantsIds": [chosen.tenant_id]
    });
    let saved = save(one_tenant).await;
    assert_eq!(saved.status(), 200);
    let current: Value = send(&gw, reqwest::Method::GET, "/api/2fa/settings", &admin, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(current["enforceTwoFa"], true);
    assert_eq!(
        current["enforcedUsersFilter"],
        json!({"type": "TENANT_ADMINISTRATORS", "tenantsIds": [chosen.tenant_id]})
    );
    mfa_token(&gw, "chosen-tenant@example.com").await;
    token_of(&gw, "other-tenant@example.com").await;
    token_of(&gw, "customer@example.com").await;
    token_of(&gw, keygate::accounts::BOOTSTRAP_EMAIL).await;

    // Per authority: every SYS_ADMIN, and nobody else.
    let mut admins = base.clone();
    admins["enforcedUsersFilter"] = json!({"type": "SYSTEM_ADMINISTRATORS"});
    assert_eq!(save(admins).await.status(), 200);
    token_of(&gw, "chosen-tenant@example.com").await;
    mfa_token(&gw, keygate::accounts::BOOTSTRAP_EMAIL).await;
}

#[tokio::test]
async fn activation_of_an_enforced_user_answers_the_mfa_configuration_token_not_the_pair() {
    let config = "[two_factor]\nenforce = true\nenforced_users = \"TENANT_ADMINISTRATORS\"\n";
    let (_up, gw) = common::gateway(config).await;
    let sys = token_of(&gw, keygate::accounts::BOOTSTRAP_EMAIL).await;
    let body = json!({
        "email": "invited@example.com",
        "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": uuid::Uuid::new_v4()}
    });
    let created: Value = send(&gw, reqwest::Method::POST, "/api/user", &sys, Some(body))
        .await
        .json()
        .await
        .unwrap();
    let id = created["id"]["id"].as_str().unwrap();
    let link = send(
        &gw,
        reqwest::Method::GET,
        &format!("/api/user/{id}/activationLink"),
        &sys,
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    let token = link.split("activateToken=").nth(1).unwrap();
    let answer: Value = gw
        .client()
        .post(gw.https("/api/noauth/activate"))
        .json(&json!({"activateToken": token, "password": "activated-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["scope"], "MFA_CONFIGURATION_TOKEN", "{answer}");
    assert!(answer["refreshToken"].is_null(), "{answer}");
    let mfa = answer["token"].as_str().unwrap();
    assert_eq!(current_user(&gw, mfa).await.status(), 401);
    let (status, _) = error_body(configured_login(&gw, mfa).await).await;
    assert_eq!(status, 400);
}

// --- guessing budget across logins ---------------------------------------------------

/// A code that no step near now answers for any of `secrets` (the skew of
/// one step either side, and the steps the test may reach).
fn wrong_code(secrets: &[&str]) -> String {
    let now = step_now();
    let near: Vec<String> = secrets
        .iter()
        .flat_map(|secret| (now - 2..=now + 3).map(|s| totp_at(secret, s)))
        .collect();
    (0..10)
        .map(|d| format!("{d}{d}{d}{d}{d}{d}"))
        .find(|code| !near.contains(code))
        .unwrap()
}

/// Logs in with the password over `client`: a pre-verification token.
async fn pre_token_with(client: &reqwest::Client, gw: &Gateway, email: &str) -> String {
    let response = client
        .post(gw.https("/api/auth/login"))
        .json(&json!({"username": email, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["scope"], "PRE_VERIFICATION_TOKEN", "{body}");
    body["token"].as_str().unwrap().to_string()
}

async fn check_with(
    client: &reqwest::Client,
    gw: &Gateway,
    pre: &str,
    code: &str,
) -> reqwest::Response {
    let path =
        format!("/api/auth/2fa/verification/check?providerType=TOTP&verificationCode={code}");
    send_with(client, gw, reqwest::Method::POST, &path, pre, None).await
}

/// The attack: log in, send four wrong codes (one fewer than end the
/// token), log in again, and so on, at `gateways` in turn. Returns how many
/// wrong codes were checked before the first refusal, which must be a 429
/// of the contract's shape.
async fn wrong_codes_until_refused(
    wire: common::Wire,
    gateways: &[&Gateway],
    email: &str,
    wrong: &str,
) -> usize {
    let mut checked = 0;
    for round in 0..20 {
        let gw = gateways[round % gateways.len()];
        let client = gw.client_over(wire);
        let pre = pre_token_with(&client, gw, email).await;
        for _ in 0..4 {
            let response = check_with(&client, gw, &pre, wrong).await;
            assert_eq!(response.version(), wire.version());
            if response.status() == 429 {
                assert!(response.headers().contains_key("retry-after"));
                let (_, body) = error_body(response).await;
                assert_eq!(body["errorCode"], 33, "{body}");
                return checked;
            }
            let (status, body) = error_body(response).await;
            assert_eq!(status, 400, "{body}");
            checked += 1;
        }
    }
    panic!("{checked} wrong codes checked and never refused");
}

#[tokio::test]
async fn logging_in_again_never_refunds_second_factor_guesses() {
    // The documented budget: `login.account_address_max_failures` (10) wrong
    // codes per account from one address, however often the password is
    // typed right in between.
    let (_up, gw) = common::gateway("").await;
    for wire in common::WIRES {
        let email = format!("refund-{wire:?}@example.com").to_lowercase();
        gw.user(&email, Authority::TenantAdmin).await;
        let token = token_of(&gw, &email).await;
        let (secret, saved_step) = configure_totp(&gw, &token).await;
        let wrong = wrong_code(&[&secret]);
        let checked = wrong_codes_until_refused(wire, &[&gw], &email, &wrong).await;
        assert_eq!(checked, 10, "{wire:?}: the budget, not a window per login");
        // The password still logs in (passwords count apart), but even the
        // right code waits for the window to end.
        let client = gw.client_over(wire);
        let pre = pre_token_with(&client, &gw, &email).await;
        let right = totp_at(&secret, saved_step + 1);
        let (status, _) = error_body(check_with(&client, &gw, &pre, &right).await).await;
        assert_eq!(status, 429, "{wire:?}");
    }
}

/// The config of a replica sharing limits under `prefix`: one signing key,
/// as replicas of one deployment have (it keys the account digests).
fn shared_limits(prefix: &common::shared_redis::Prefix) -> String {
    format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ncommand_timeout = \"200ms\"\n\
         [jwt]\ntoken_signing_key = \"{}\"\n",
        common::shared_redis::redis_url(),
        prefix.0,
        "a".repeat(88)
    )
}

async fn wait_for_redis(gw: &Gateway) {
    common::wait_until(
        "redis is up",
        std::time::Duration::from_secs(10),
        async || {
            gw.metrics()
                .await
                .lines()
                .any(|l| l == "keygate_redis_up 1")
        },
    )
    .await;
}

#[tokio::test]
async fn logging_in_again_never_refunds_second_factor_guesses_across_two_replicas() {
    let prefix = common::shared_redis::Prefix::new();
    let upstream = common::Upstream::start().await;
    let config = shared_limits(&prefix);
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for_redis(&a).await;
    wait_for_redis(&b).await;
    for wire in common::WIRES {
        // Each replica here has a store of its own: the user is in both.
        let email = format!("shared-{wire:?}@example.com").to_lowercase();
        let mut secrets = Vec::new();
        for gw in [&a, &b] {
            gw.user(&email, Authority::TenantAdmin).await;
            let token = token_of(gw, &email).await;
            secrets.push(configure_totp(gw, &token).await.0);
        }
        let wrong = wrong_code(&[&secrets[0], &secrets[1]]);
        let checked = wrong_codes_until_refused(wire, &[&a, &b], &email, &wrong).await;
        // Each replica checked at most six: only the shared count refuses.
        assert_eq!(checked, 10, "{wire:?}");
    }
    let keys = prefix.keys().await;
    assert!(
        keys.iter().any(|k| k.contains(":login:code:pair:")),
        "{keys:?}"
    );
}

// --- a second-factor change ends the other sessions -----------------------------------

async fn refresh_with(client: &reqwest::Client, gw: &Gateway, refresh: &str) -> reqwest::Response {
    client
        .post(gw.https("/api/auth/token"))
        .json(&json!({ "refreshToken": refresh }))
        .send()
        .await
        .unwrap()
}

/// A full login over `client` (the user has no second factor): (access, refresh).
async fn pair_with(client: &reqwest::Client, gw: &Gateway, email: &str) -> (String, String) {
    let response = client
        .post(gw.https("/api/auth/login"))
        .json(&json!({"username": email, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    let refresh = body["refreshToken"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"));
    (body["token"].as_str().unwrap().into(), refresh.into())
}

/// The session of `access` still works: its token and its refresh.
async fn still_works(
    client: &reqwest::Client,
    gw: &Gateway,
    access: &str,
    refresh: &str,
) -> String {
    let me = send_with(
        client,
        gw,
        reqwest::Method::GET,
        "/api/auth/user",
        access,
        None,
    )
    .await;
    assert_eq!(me.status(), 200);
    let response = refresh_with(client, gw, refresh).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["refreshToken"].as_str().unwrap().to_string()
}

/// The session of `access` ended: refresh and access token are refused.
async fn ended(client: &reqwest::Client, gw: &Gateway, access: &str, refresh: &str, what: &str) {
    let (status, body) = error_body(refresh_with(client, gw, refresh).await).await;
    assert_eq!(status, 401, "{what}: {body}");
    let me = send_with(
        client,
        gw,
        reqwest::Method::GET,
        "/api/auth/user",
        access,
        None,
    )
    .await;
    assert_eq!(me.status(), 401, "{what}");
    // A proxied route, whose passport for the session was cached, too.
    let proxied = send_with(
        client,
        gw,
        reqwest::Method::GET,
        "/api/devices",
        access,
        None,
    )
    .await;
    assert_eq!(proxied.status(), 401, "{what}: proxied");
}

#[tokio::test]
async fn a_refresh_token_of_another_session_is_refused_once_a_second_factor_is_saved_or_removed() {
    let (_up, gw) = common::gateway("").await;
    for wire in common::WIRES {
        let client = gw.client_over(wire);
        let email = format!("owner-{wire:?}@example.com").to_lowercase();
        gw.user(&email, Authority::TenantAdmin).await;
        // The owner's session, and another (a thief's copy of an old login).
        let (mine, mine_refresh) = pair_with(&client, &gw, &email).await;
        let (theirs, theirs_refresh) = pair_with(&client, &gw, &email).await;
        for access in [&mine, &theirs] {
            let proxied = send_with(
                &client,
                &gw,
                reqwest::Method::GET,
                "/api/devices",
                access,
                None,
            )
            .await;
            assert_eq!(
                proxied.status(),
                200,
                "both sessions reach the platform first"
            );
        }

        let generated = send_with(
            &client,
            &gw,
            reqwest::Method::POST,
            "/api/2fa/account/config/generate?providerType=TOTP",
            &mine,
            None,
        )
        .await;
        assert_eq!(generated.version(), wire.version());
        let config: Value = generated.json().await.unwrap();
        let secret = secret_of(config["authUrl"].as_str().unwrap());
        let saved_step = step_now();
        let saved = send_with(
            &client,
            &gw,
            reqwest::Method::POST,
            &format!(
                "/api/2fa/account/config?verificationCode={}",
                totp_at(&secret, saved_step)
            ),
            &mine,
            Some(config),
        )
        .await;
        assert_eq!(saved.status(), 200);
        ended(&client, &gw, &theirs, &theirs_refresh, "after save").await;
        let mine_refresh = still_works(&client, &gw, &mine, &mine_refresh).await;

        // Two sessions that passed the second factor; one removes it.
        let pre = pre_token_with(&client, &gw, &email).await;
        let response = check_with(&client, &gw, &pre, &totp_at(&secret, saved_step + 1)).await;
        assert_eq!(response.status(), 200);
        let remover: Value = response.json().await.unwrap();
        let remover = remover["token"].as_str().unwrap();
        let proxied = send_with(
            &client,
            &gw,
            reqwest::Method::GET,
            "/api/devices",
            &mine,
            None,
        )
        .await;
        assert_eq!(proxied.status(), 200);
        let removed = send_with(
            &client,
            &gw,
            reqwest::Method::DELETE,
            "/api/2fa/account/config?providerType=TOTP",
            remover,
            None,
        )
        .await;
        assert_eq!(removed.status(), 200);
        ended(&client, &gw, &mine, &mine_refresh, "after delete").await;
        let me = send_with(
            &client,
            &gw,
            reqwest::Method::GET,
            "/api/auth/user",
            remover,
            None,
        )
        .await;
        assert_eq!(me.status(), 200, "the session that removed it goes on");
        let proxied = send_with(
            &client,
            &gw,
            reqwest::Method::GET,
            "/api/devices",
            remover,
            None,
        )
        .await;
        assert_eq!(proxied.status(), 200);
    }
}
