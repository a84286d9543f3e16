//! Second factors end to end: configuring TOTP and backup codes, logging in
//! through a pre-verification token, and the attacks on both. Codes are
//! computed here by an implementation of RFC 6238 of the test's own.

mod common;

use base64::Engine;
use common::{Gateway, PASSWORD, api_key_header, error_body};
use keygate::identity::Authority;
use serde_json::{Value, json};

// --- an independent TOTP ---------------------------------------------------------

fn base32_decode(text: &str) -> Vec<u8> {
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut bits = String::new();
    for c in text.trim_end_matches('=').chars() {
        let value = alphabet.find(c.to_ascii_uppercase()).expect("base32");
        bits.push_str(&format!("{value:05b}"));
    }
    bits.as_bytes()
        .chunks(8)
        .filter(|chunk| chunk.len() == 8)
        .map(|chunk| u8::from_str_radix(std::str::from_utf8(chunk).unwrap(), 2).unwrap())
        .collect()
}

/// The 6-digit code of `step` (RFC 4226 truncation of HMAC-SHA1).
fn totp_at(secret_base32: &str, step: i64) -> String {
    use aws_lc_rs::hmac;
    let key = hmac::Key::new(
        hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        &base32_decode(secret_base32),
    );
    let mac = hmac::sign(&key, &(step as u64).to_be_bytes());
    let mac = mac.as_ref();
    let offset = (mac[19] & 0xf) as usize;
    let binary = ((u32::from(mac[offset]) & 0x7f) << 24)
        | (u32::from(mac[offset + 1]) << 16)
        | (u32::from(mac[offset + 2]) << 8)
        | u32::from(mac[offset + 3]);
    format!("{:06}", binary % 1_000_000)
}

fn step_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        / 30
}

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
    let mut request = gw
        .client()
        .request(method, gw.https(path))
        .header("X-Authorization", format!("Bearer {token}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
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
    send(
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
    send(gw, reqwest::Method::GET, "/api/auth/user", token, None).await
}

// --- the flow --------------------------------------------------------------------

#[tokio::test]
async fn totp_login_answers_a_pre_verification_token_then_the_pair_for_a_current_code() {
    let (_up, gw) = common::gateway("").await;
    gw.user("totp@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "totp@example.com").await;
    let providers: Value = send(
        &gw,
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
    let (secret, saved_step) = configure_totp(&gw, &token).await;

    // The secret is shown once: the settings say TOTP is there, and no more.
    let settings = send(
        &gw,
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

    let pre = pre_token(&gw, "totp@example.com").await;
    let pre_claims = claims(&pre);
    assert_eq!(pre_claims["scopes"], json!(["PRE_VERIFICATION_TOKEN"]));
    assert_eq!(
        pre_claims["exp"].as_i64().unwrap() - pre_claims["iat"].as_i64().unwrap(),
        300,
        "five minutes by default"
    );
    let infos: Value = send(
        &gw,
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
    let sent = send(
        &gw,
        reqwest::Method::POST,
        "/api/auth/2fa/verification/send?providerType=TOTP",
        &pre,
        None,
    )
    .await;
    assert_eq!(sent.status(), 200);

    // The code that saved the secret was used; the next step's is fresh.
    let response = check(&gw, &pre, "TOTP", &totp_at(&secret, saved_step + 1)).await;
    assert_eq!(response.status(), 200);
    let pair: Value = response.json().await.unwrap();
    let access = pair["token"].as_str().unwrap();
    assert!(pair["refreshToken"].is_string());
    assert_eq!(claims(access)["scopes"], json!(["TENANT_ADMIN"]));
    assert_eq!(current_user(&gw, access).await.status(), 200);

    // The attempt is over: its token gets nothing more.
    let again = check(&gw, &pre, "TOTP", &totp_at(&secret, saved_step + 2)).await;
    assert_eq!(again.status(), 401);
}

#[tokio::test]
async fn pre_verification_token_is_refused_by_every_other_endpoint_and_proxied_route() {
    let (upstream, gw) = common::gateway("").await;
    gw.user("scope@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "scope@example.com").await;
    configure_totp(&gw, &token).await;
    let pre = pre_token(&gw, "scope@example.com").await;

    for route in keygate::api::ROUTES {
        if route.access != keygate::api::Access::Authenticated {
            continue;
        }
        let path = route
            .pattern
            .split('/')
            .map(|s| {
                if s.starts_with('{') {
                    "784f394c-42b6-435a-983c-b7beff2784f9"
                } else {
                    s
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let response = send(&gw, route.method.clone(), &path, &pre, Some(json!({}))).await;
        let (status, body) = error_body(response).await;
        assert_eq!(status, 401, "{} {path}: {body}", route.method);
    }
    for path in ["/api/tenant/devices?pageSize=10&page=0", "/api/device/1"] {
        let response = send(&gw, reqwest::Method::GET, path, &pre, None).await;
        assert_eq!(response.status(), 401, "{path}");
    }
    let refresh = gw
        .client()
        .post(gw.https("/api/auth/token"))
        .json(&json!({ "refreshToken": pre }))
        .send()
        .await
        .unwrap();
    assert_eq!(refresh.status(), 401);
    assert_eq!(upstream.arrived(), 0, "nothing was forwarded");

    // And the second-factor endpoints take nothing but that token.
    let full = token;
    let response = check(&gw, &full, "TOTP", "000000").await;
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn replayed_totp_code_is_refused_even_within_the_skew() {
    let (_up, gw) = common::gateway("").await;
    gw.user("replay@example.com", Authority::TenantAdmin).await;
    let token = token_of(&gw, "replay@example.com").await;
    let (secret, saved_step) = configure_totp(&gw, &token).await;
    let code = totp_at(&secret, saved_step + 1);
    let first = pre_token(&gw, "replay@example.com").await;
    assert_eq!(check(&gw, &first, "TOTP", &code).await.status(), 200);
    let second = pre_token(&gw, "replay@example.com").await;
    let (status, body) = error_body(check(&gw, &second, "TOTP", &code).await).await;
    assert_eq!(status, 400);
    assert_eq!(body["message"], "Verification code is incorrect");
    // The code that saved the secret cannot log in either.
    let saved = totp_at(&secret, saved_step);
    assert_eq!(check(&gw, &second, "TOTP", &saved).await.status(), 400);
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
    for _ in 0..2 {
        let (status, _) = error_body(check(&gw, &pre, "TOTP", wrong).await).await;
        assert_eq!(status, 400);
    }
    let (status, body) = error_body(check(&gw, &pre, "TOTP", wrong).await).await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = error_body(check(&gw, &pre, "TOTP", &right).await).await;
    assert_eq!(status, 401, "the right code comes too late");
    // The owner logs in again and gets in.
    let fresh = pre_token(&gw, "guess@example.com").await;
    assert_eq!(check(&gw, &fresh, "TOTP", &right).await.status(), 200);
}

#[tokio::test]
async fn code_guesses_take_slots_of_the_password_limiter() {
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
    for _ in 0..3 {
        assert_eq!(check(&gw, &pre, "TOTP", wrong).await.status(), 400);
    }
    let response = check(&gw, &pre, "TOTP", &right).await;
    let (status, _) = error_body(response).await;
    assert_eq!(status, 429, "even the right code waits for the window");
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

    let pre = pre_token(&gw, "backup@example.com").await;
    let response = check(&gw, &pre, "BACKUP_CODE", &codes[3]).await;
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
    assert_eq!(
        check(&gw, &pre, "BACKUP_CODE", &codes[3]).await.status(),
        400,
        "a used code is gone"
    );
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
    let response = gw
        .client()
        .get(gw.https("/api/tenant/devices?pageSize=1&page=0"))
        .header("X-Authorization", api_key_header(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.arrived(), 1);
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
